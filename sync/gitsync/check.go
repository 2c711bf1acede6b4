package gitsync

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// TreeError refuses a worker commit for one path of its tree; nothing was changed.
type TreeError struct {
	Commit, Path, Reason string
}

func (e *TreeError) Error() string {
	return fmt.Sprintf("worker commit %s: %q: %s; nothing was changed", short(e.Commit), e.Path, e.Reason)
}

// maxLinkTarget bounds a symlink's target (Linux's PATH_MAX, with its NUL).
const maxLinkTarget = 4095

// CheckCommits checks the tree of every commit reachable from tip and not from have, each entry
// that differs from its first parent's (an entry equal to it was checked there, or is in have's
// history, which the anchor holds already): a valid path (manifest.ValidPath) without a component
// that git or a file system reads as .git (DotGit); a symlink's target relative, inside the
// repository from the link's directory (manifest.SymlinkInside) and not into .git; no symlinked
// .gitmodules; and a .gitmodules whose submodule URLs are all ones have's .gitmodules already
// lists (submodules are filled from the user's checkouts, never fetched: a new URL is nothing
// the gateway can give, and a place a later `git submodule update` would fetch from). The
// first refusal is a *TreeError naming the commit and the path. g runs in the repository.
func CheckCommits(ctx context.Context, g *gitexec.Untrusted, have, tip string) error {
	revs, err := workerCommits(ctx, g, have, tip)
	if err != nil || revs.Len() == 0 {
		return err
	}
	haveURLs, err := submoduleURLs(ctx, g, have+":.gitmodules")
	if err != nil {
		return fmt.Errorf("submodules of %s: %w", short(have), err)
	}
	allowed := map[string]bool{}
	for _, u := range haveURLs {
		allowed[u] = true
	}
	haveLinks, err := gitlinkPaths(ctx, g, have)
	if err != nil {
		return err
	}
	links := map[string][]linkAt{} // symlink blob → where it is
	var modules []linkAt           // .gitmodules blobs
	var newLinks []linkAt          // gitlinks at paths that are no submodule of have
	err = diffCommits(ctx, g, revs, func(commit, mode, blob, status, path string) error {
		if status == "D" {
			return nil
		}
		refuse := func(reason string, args ...any) error {
			return &TreeError{Commit: commit, Path: path, Reason: fmt.Sprintf(reason, args...)}
		}
		if err := manifest.ValidPath(path); err != nil {
			var pe *manifest.PathError
			if errors.As(err, &pe) {
				return refuse("%s", pe.Reason)
			}
			return refuse("%v", err)
		}
		for _, c := range strings.Split(path, "/") {
			if DotGit(c) {
				return refuse("path component %q is read as .git", c)
			}
		}
		switch mode {
		case "100644", "100755", "100664":
		case "160000":
			if !haveLinks[path] {
				newLinks = append(newLinks, linkAt{commit, path})
			}
		case "120000":
			links[blob] = append(links[blob], linkAt{commit, path})
		default:
			return refuse("mode %s not allowed", mode)
		}
		if isDotGitmodules(path) {
			if mode == "120000" {
				return refuse(".gitmodules is a symlink")
			}
			if path == ".gitmodules" {
				modules = append(modules, linkAt{commit, blob})
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := checkLinks(ctx, g, links); err != nil {
		return err
	}
	for _, m := range modules {
		urls, err := submoduleURLs(ctx, g, m.path)
		if err != nil {
			return &TreeError{Commit: m.commit, Path: ".gitmodules", Reason: fmt.Sprintf("cannot be read: %v", err)}
		}
		for _, name := range slices.Sorted(maps.Keys(urls)) {
			if url := urls[name]; !allowed[url] || strings.HasPrefix(url, "-") {
				return &TreeError{Commit: m.commit, Path: ".gitmodules", Reason: fmt.Sprintf(
					"submodule %q has URL %q, not one of the repository's own submodules (the gateway fills submodules from the user's checkouts only)", name, url)}
			}
		}
	}
	// The gateway fills a submodule from the user's checkout at its path: a worker's gitlink at a
	// new path would have it copy whatever repository the user keeps there into the anchor, and
	// from it to the box.
	if len(newLinks) > 0 {
		l := newLinks[0]
		return &TreeError{Commit: l.commit, Path: l.path, Reason: "a submodule the workspace does not have (the gateway fills submodules from the user's checkouts only)"}
	}
	return nil
}

// gitlinkPaths returns the paths of commit's submodules (its gitlinks).
func gitlinkPaths(ctx context.Context, g *gitexec.Untrusted, commit string) (map[string]bool, error) {
	out, err := g.Run(ctx, "ls-tree", "-r", "-z", "--full-tree", commit)
	if err != nil {
		return nil, fmt.Errorf("list the submodules of %s: %w", short(commit), err)
	}
	paths := map[string]bool{}
	for _, rec := range bytes.Split(out, []byte{0}) {
		if meta, p, ok := bytes.Cut(rec, []byte{'\t'}); ok && bytes.HasPrefix(meta, []byte("160000 ")) {
			paths[string(p)] = true
		}
	}
	return paths, nil
}

type linkAt struct{ commit, path string }

// workerCommits is the diff-tree --stdin input for the commits reachable from tip and not from
// have: "<commit> <first parent>" lines (a root commit alone).
func workerCommits(ctx context.Context, g *gitexec.Untrusted, have, tip string) (*bytes.Buffer, error) {
	revs, err := g.Run(ctx, "rev-list", "--parents", tip, "--not", have)
	if err != nil {
		return nil, fmt.Errorf("list the worker's commits: %w", err)
	}
	var in bytes.Buffer
	for _, line := range strings.Split(strings.TrimSpace(string(revs)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			in.WriteString(strings.Join(f[:min(len(f), 2)], " ") + "\n")
		}
	}
	return &in, nil
}

// diffCommits streams each entry that the commits of revs (workerCommits) change against their
// first parent (the empty tree for a root commit) to each.
func diffCommits(ctx context.Context, g *gitexec.Untrusted, revs *bytes.Buffer, each func(commit, mode, blob, status, path string) error) error {
	return streamGit(ctx, g, revs, func(r io.Reader) error { return scanDiff(r, each) }, "list the worker's changes",
		"diff-tree", "--stdin", "-r", "-z", "--root", "--no-renames")
}

// streamGit runs git args through g with stdin and hands its output to read as it comes. When read
// stops early (an error, or all it wanted), the rest of the output goes to a closed pipe, so git
// stops. read's error comes first; git's own is wrapped in what.
func streamGit(ctx context.Context, g *gitexec.Untrusted, stdin io.Reader, read func(io.Reader) error, what string, args ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := g.Stream(ctx, stdin, pw, args...)
		pw.CloseWithError(err)
		done <- err
	}()
	err := read(pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		cancel()
	}
	if gerr := <-done; err == nil && gerr != nil {
		err = fmt.Errorf("%s: %w", what, gerr)
	}
	return err
}

// scanDiff reads `diff-tree --stdin -r -z` output: a commit id, then its ":<mode> <mode> <blob>
// <blob> <status>" NUL <path> NUL records.
func scanDiff(r io.Reader, each func(commit, mode, blob, status, path string) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	field := func() (string, error) {
		b, err := br.ReadSlice(0)
		if errors.Is(err, bufio.ErrBufferFull) {
			return "", errors.New("diff-tree output: a field over 64 KiB")
		}
		if err != nil {
			return "", err
		}
		return string(b[:len(b)-1]), nil
	}
	var commit string
	for {
		f, err := field()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		meta, ok := strings.CutPrefix(f, ":")
		if !ok {
			commit = f
			continue
		}
		m := strings.Fields(meta)
		if len(m) != 5 {
			return fmt.Errorf("diff-tree output: unexpected record %q", f)
		}
		path, err := field()
		if err != nil {
			return fmt.Errorf("diff-tree output: %w", err)
		}
		if err := each(commit, m[1], m[3], m[4][:1], path); err != nil {
			return err
		}
	}
}

// checkLinks reads each symlink blob, streamed from one `cat-file --batch` (a target longer
// than a path stops it: nothing larger is read), and checks its target wherever it is.
func checkLinks(ctx context.Context, g *gitexec.Untrusted, links map[string][]linkAt) error {
	return catBatch(ctx, g, slices.Sorted(maps.Keys(links)), "symlinks", func(b, typ string, size int64, r io.Reader) error {
		target := ""
		if typ == "blob" && size > 0 && size <= maxLinkTarget {
			buf, err := io.ReadAll(r)
			if err != nil {
				return fmt.Errorf("cat-file --batch: %w", err)
			}
			target = string(buf)
		}
		for _, at := range links[b] {
			if target == "" {
				return &TreeError{Commit: at.commit, Path: at.path, Reason: "symlink target is not a blob of at most 4095 bytes"}
			}
			if !manifest.SymlinkInside(at.path, target) {
				return &TreeError{Commit: at.commit, Path: at.path, Reason: fmt.Sprintf("symlink to %q leaves the repository", target)}
			}
			for _, c := range strings.Split(target, "/") {
				if DotGit(c) {
					return &TreeError{Commit: at.commit, Path: at.path, Reason: fmt.Sprintf("symlink to %q points into .git", target)}
				}
			}
		}
		return nil
	})
}

// submoduleURLs reads submodule.<name>.url from a .gitmodules blob (rev:path, or an object id),
// without includes; none when rev has no .gitmodules.
func submoduleURLs(ctx context.Context, g *gitexec.Untrusted, blob string) (map[string]string, error) {
	urls := map[string]string{}
	if _, err := g.Run(ctx, "cat-file", "-e", blob); err != nil {
		if strings.Contains(blob, ":") {
			return urls, nil // no .gitmodules there
		}
		return nil, err
	}
	out, err := g.Run(ctx, "config", "--blob", blob, "--no-includes", "-z", "--get-regexp", `^submodule\..*\.url$`)
	var ge *gitexec.Error
	if errors.As(err, &ge) && strings.TrimSpace(ge.Stderr) == "" {
		return urls, nil // exit 1: no such key
	}
	if err != nil {
		return nil, err
	}
	for _, rec := range bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0}) {
		key, val, _ := bytes.Cut(rec, []byte{'\n'})
		name := strings.TrimSuffix(strings.TrimPrefix(string(key), "submodule."), ".url")
		urls[name] = string(val)
	}
	return urls, nil
}

// hfsIgnored are the code points HFS+ drops when it compares names (git's is_hfs_dotgit).
var hfsIgnored = strings.NewReplacer(
	"\u200c", "", "\u200d", "", "\u200e", "", "\u200f", "",
	"\u202a", "", "\u202b", "", "\u202c", "", "\u202d", "", "\u202e", "",
	"\u206a", "", "\u206b", "", "\u206c", "", "\u206d", "", "\u206e", "", "\u206f", "",
	"\ufeff", "")

// dotName is c as the file systems git protects would compare it: HFS+ ignorable code points
// dropped, an NTFS stream suffix (":…") and trailing dots and spaces cut, letter case folded.
func dotName(c string) string {
	c = hfsIgnored.Replace(c)
	if i := strings.IndexByte(c, ':'); i >= 0 {
		c = c[:i]
	}
	return strings.ToLower(strings.TrimRight(c, ". "))
}

// DotGit reports whether a path component is read as .git by git or by some file system: any
// letter case, trailing dots or spaces and alternate data streams (NTFS), its 8.3 short name
// git~1, HFS+ ignorable code points.
func DotGit(c string) bool {
	n := dotName(c)
	return n == ".git" || n == "git~1"
}

// isDotGitmodules reports whether a path's last component is read as .gitmodules.
func isDotGitmodules(path string) bool {
	n := dotName(path[strings.LastIndexByte(path, '/')+1:])
	return n == ".gitmodules" || strings.HasPrefix(n, "gitmod~")
}
