package gitsync

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/secretscan"
)

// MessagePath names a commit's message (its whole object: headers and message) in secret scan
// findings: "commit <id> message".
func MessagePath(commit string) string { return "commit " + short(commit) + " message" }

// ScanCommits scans what the commits reachable from tip and not from have bring: every commit
// object (its message), and every file and symlink blob a commit adds or changes against its
// first parent, at each path it is found — so that a secret added in one commit and removed in
// the next is found too, as it would be pushed. It returns the hits sc does not allow. The
// objects are streamed from one `cat-file --batch`; nothing is held whole in memory.
func ScanCommits(ctx context.Context, g *gitexec.Untrusted, have, tip string, sc *secretscan.Scanner) ([]secretscan.Finding, error) {
	revs, err := workerCommits(ctx, g, have, tip)
	if err != nil || revs.Len() == 0 {
		return nil, err
	}
	var commits []string
	for _, line := range strings.Split(strings.TrimSpace(revs.String()), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			commits = append(commits, f[0])
		}
	}
	paths := map[string][]string{} // blob → its paths
	seen := map[[2]string]bool{}   // (blob, path) already listed
	err = diffCommits(ctx, g, revs, func(commit, mode, blob, status, path string) error {
		if status == "D" {
			return nil
		}
		switch mode {
		case "100644", "100755", "100664", "120000":
			if k := [2]string{blob, path}; !seen[k] {
				seen[k] = true
				paths[blob] = append(paths[blob], path)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	blobs := make([]string, 0, len(paths))
	for b := range paths {
		blobs = append(blobs, b)
	}
	sort.Strings(blobs)
	where := map[string][]string{}
	for _, c := range commits {
		where[c] = []string{MessagePath(c)}
	}
	for _, b := range blobs {
		where[b] = paths[b]
	}
	var found []secretscan.Finding
	err = catBatch(ctx, g, append(commits, blobs...), "objects", func(id, typ string, size int64, r io.Reader) error {
		if typ == "missing" {
			return fmt.Errorf("cat-file: %s is missing", id)
		}
		if len(found) >= secretscan.MaxFindings {
			return nil // full: the rest is drained unread
		}
		hits, err := sc.ScanShared(where[id], r)
		found, _ = secretscan.Add(found, hits...)
		return err
	})
	return found, err
}

// catBatch streams the objects ids (what they are, for errors) from one `git cat-file --batch`
// to each, in order, with each object's type and size and a reader of its content (each may
// read it to its end or leave it: the rest is drained); an object the repository lacks comes
// as type "missing", size -1 and no content. Nothing is held whole in memory.
func catBatch(ctx context.Context, g *gitexec.Untrusted, ids []string, what string, each func(id, typ string, size int64, r io.Reader) error) error {
	if len(ids) == 0 {
		return nil
	}
	var in bytes.Buffer
	for _, id := range ids {
		in.WriteString(id + "\n")
	}
	return streamGit(ctx, g, &in, func(r io.Reader) error {
		br := bufio.NewReaderSize(r, 64<<10)
		for _, id := range ids {
			head, err := br.ReadString('\n')
			if err != nil {
				return fmt.Errorf("cat-file: %w", err)
			}
			f := strings.Fields(head)
			if len(f) == 2 && f[0] == id && f[1] == "missing" {
				if err := each(id, "missing", -1, strings.NewReader("")); err != nil {
					return err
				}
				continue
			}
			if len(f) != 3 || f[0] != id {
				return fmt.Errorf("cat-file: unexpected header %q for %s", strings.TrimSpace(head), id)
			}
			size, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil || size < 0 {
				return fmt.Errorf("cat-file: bad size in %q", strings.TrimSpace(head))
			}
			body := io.LimitReader(br, size)
			if err := each(id, f[1], size, body); err != nil {
				return err
			}
			if _, err := io.Copy(io.Discard, body); err != nil {
				return err
			}
			if b, err := br.ReadByte(); err != nil || b != '\n' {
				return errors.New("cat-file: object not followed by a newline")
			}
		}
		return nil
	}, "read the worker's "+what, "cat-file", "--batch")
}

// CommittedSums maps each regular file that the commits have..tip change (added or modified
// between the two trees) to the SHA256 (hex) of its content at tip: content ScanCommits reads, so
// that a scan of the worker's files can leave out the files that hold exactly it.
func CommittedSums(ctx context.Context, g *gitexec.Untrusted, have, tip string) (map[string]string, error) {
	out, err := g.Run(ctx, "diff-tree", "-r", "-z", "--no-renames", have, tip)
	if err != nil {
		return nil, fmt.Errorf("list the worker's changes: %w", err)
	}
	paths := map[string][]string{} // blob → its paths
	err = scanDiff(bytes.NewReader(out), func(_, mode, blob, status, path string) error {
		if status != "D" && (mode == "100644" || mode == "100755" || mode == "100664") {
			paths[blob] = append(paths[blob], path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sums := map[string]string{}
	err = catBatch(ctx, g, slices.Sorted(maps.Keys(paths)), "files", func(id, typ string, _ int64, r io.Reader) error {
		if typ != "blob" {
			return fmt.Errorf("cat-file: %s is %s, not a blob", id, typ)
		}
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			return err
		}
		for _, p := range paths[id] {
			sums[p] = hex.EncodeToString(h.Sum(nil))
		}
		return nil
	})
	return sums, err
}
