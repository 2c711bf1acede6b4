package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// newUnpackCmd is `openclaw worker unpack --dir D`: apply a tar+zstd sync archive from stdin.
func newUnpackCmd() *cobra.Command {
	var dir, socket string
	var parts int
	cmd := &cobra.Command{
		Use:     "unpack --dir DIR",
		Example: `  openclaw worker unpack --dir ~/.openclaw-worker/work/ses_123 < stream`,
		Short:   "Apply a workspace sync archive from stdin (run by the gateway on a box)",
		Long: `Reads one tar+zstd sync archive on stdin and applies it below DIR. Every file is staged in a
temporary directory inside DIR (next to it when DIR does not exist yet) and checked against the
plan at the head of the archive (paths, types, sizes, content: each file's sha256, or in a
streamed archive the XXH64 recorded with it in the sums at the end) before anything in DIR
changes; then deletions are made and files renamed into place.

With --parts N the sync arrives in N archives over as many channels: stdin carries one, and
'openclaw worker feed --socket S' commands bring the others through the unix socket S (created in
a new 0700 directory, removed at the end). All parts are checked before anything is committed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is required")
			}
			if parts > 1 && socket == "" {
				return fmt.Errorf("--parts needs --socket")
			}
			st, err := stream.BoxUnpackParts(cmd.Context(), cmd.InOrStdin(), dir, parts, socket)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "unpacked %d files (%d bytes), %d dirs, %d symlinks, %d deletions\n",
				st.Files, st.Bytes, st.Dirs, st.Symlinks, st.Deleted)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to apply the archive to")
	cmd.Flags().IntVar(&parts, "parts", 1, "number of archives (channels) the sync arrives in")
	cmd.Flags().StringVar(&socket, "socket", "", "unix socket the other parts' feed commands connect to (with --parts)")
	return cmd
}

// newFeedCmd is `openclaw worker feed --socket S`: one part of a sync for an `unpack --parts`.
func newFeedCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:     "feed --socket S",
		Example: `  openclaw worker feed --socket /run/openclaw/feed.sock < stream`,
		Short:   "Pass one part of a sync archive from stdin to an 'unpack --parts' (run by the gateway on a box)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				return fmt.Errorf("--socket is required")
			}
			stdin, ok := cmd.InOrStdin().(*os.File)
			if !ok {
				return fmt.Errorf("feed: stdin must be a file or pipe (it is handed over to the unpack)")
			}
			return stream.BoxFeed(cmd.Context(), stdin, socket)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "unix socket of the unpack command")
	return cmd
}

// newPackCmd is `openclaw worker pack --dir D`: write the archive of the plan read on stdin.
func newPackCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:     "pack --dir DIR",
		Example: `  openclaw worker pack --dir ~/.openclaw-worker/work/ses_123 > stream`,
		Short:   "Write a sync archive of the files a plan on stdin asks for (run by the gateway on a box)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is required")
			}
			_, err := stream.BoxPack(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), dir)
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory the plan's paths are relative to")
	return cmd
}

// newManifestCmd is `openclaw worker manifest [--git] DIR`: print DIR's manifest as JSON.
func newManifestCmd() *cobra.Command {
	var git bool
	var exclude, include []string
	var cacheFile, rulePrefix string
	cmd := &cobra.Command{
		Use:     "manifest [--git] DIR",
		Example: `  openclaw worker manifest --git ~/src/app`,
		Short:   "Print the sync manifest of DIR as JSON (run by the gateway on a box)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := manifest.Options{Mode: manifest.ModePlain, Exclude: exclude, Include: include, RulePrefix: rulePrefix}
			if git {
				opts.Mode = manifest.ModeGit
			}
			if cacheFile != "" {
				opts.Cache = manifest.LoadCache(cacheFile)
			}
			if err := stream.BoxManifest(cmd.Context(), cmd.OutOrStdout(), args[0], opts); err != nil {
				return err
			}
			if opts.Cache != nil {
				return opts.Cache.Save(cacheFile)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&git, "git", false, "list tracked and eligible untracked files (git mode)")
	cmd.Flags().StringArrayVar(&exclude, "exclude", nil, "gitignore-style pattern to leave out (repeatable)")
	cmd.Flags().StringArrayVar(&include, "include", nil, "gitignore-style pattern to keep even if excluded (repeatable)")
	cmd.Flags().StringVar(&cacheFile, "cache", "", "hash cache file, so unchanged files are not re-hashed")
	cmd.Flags().StringVar(&rulePrefix, "rule-prefix", "", "where DIR sits in the tree the --exclude/--include rules were written for")
	return cmd
}
