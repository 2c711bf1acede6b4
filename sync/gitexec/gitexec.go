// Package gitexec runs the git CLI for the sync packages with bounded output and a quiet environment.
package gitexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/openclaw/cloudworkers/internal/capbuf"
)

// maxStderr bounds the stderr kept for an error message.
const maxStderr = 4 << 10

// Env is the environment of every git command: the caller's, without prompts, pagers or
// translations, so that output can be parsed and nothing waits for a terminal.
func Env() []string {
	return append(os.Environ(),
		"GIT_TERMINAL_PROMPT=0",
		"GIT_PAGER=cat",
		"LC_ALL=C",
		"GIT_OPTIONAL_LOCKS=0",
	)
}

// Error is a git command that exited non-zero.
type Error struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *Error) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.Args, " "), e.Err, msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Run runs git with args in dir and returns its stdout.
func Run(ctx context.Context, dir string, args ...string) ([]byte, error) {
	return RunInput(ctx, dir, nil, args...)
}

// RunInput is Run with stdin.
func RunInput(ctx context.Context, dir string, stdin []byte, args ...string) ([]byte, error) {
	return RunEnv(ctx, dir, nil, stdin, args...)
}

// RunEnv is RunInput with extra environment variables (KEY=value) after Env(), such as
// GIT_INDEX_FILE for a temporary index.
func RunEnv(ctx context.Context, dir string, env []string, stdin []byte, args ...string) ([]byte, error) {
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	err := run(ctx, dir, env, in, &out, args)
	return out.Bytes(), err
}

// Stream runs git with args in dir reading stdin (none when nil) and writing its stdout to
// stdout, for output too large to hold in memory, such as a pack.
func Stream(ctx context.Context, dir string, stdin io.Reader, stdout io.Writer, args ...string) error {
	return run(ctx, dir, nil, stdin, stdout, args)
}

// SafeConfig is set on every git command the gateway runs: a directory that only looks like a git
// directory (HEAD, config, objects/ and refs/ among the files a box sent back) is never taken for
// a repository, whatever its config says, and no repository's configuration starts an fsmonitor
// program.
var SafeConfig = []string{"-c", "safe.bareRepository=explicit", "-c", "core.fsmonitor=false"}

func run(ctx context.Context, dir string, env []string, stdin io.Reader, stdout io.Writer, args []string) error {
	cmd := exec.CommandContext(ctx, "git", append(slices.Clone(SafeConfig), args...)...)
	cmd.Dir = dir
	cmd.Env = append(Env(), env...)
	cmd.Stdin = stdin
	errb := capbuf.New(maxStderr)
	cmd.Stdout = stdout
	cmd.Stderr = errb
	if err := cmd.Run(); err != nil {
		return &Error{Args: args, Stderr: errb.String(), Err: err}
	}
	return nil
}

// SplitZ returns the records of a git command's -z output (NUL-terminated), leaving out empty ones.
func SplitZ(out []byte) []string {
	var ps []string
	for _, p := range bytes.Split(out, []byte{0}) {
		if len(p) > 0 {
			ps = append(ps, string(p))
		}
	}
	return ps
}

// Line runs git and returns its stdout with surrounding space trimmed.
func Line(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := Run(ctx, dir, args...)
	return strings.TrimSpace(string(out)), err
}

// untrustedConfig is what every command of an Untrusted runner overrides: no hook (core.hooksPath
// names no directory), no fsmonitor, no LFS filter, no transport (a lazy fetch, a submodule),
// no automatic gc or maintenance, no submodule recursion, and the checkout-time refusal of paths
// that some file system would read as .git.
var untrustedConfig = []string{
	"core.hooksPath=/dev/null",
	"core.fsmonitor=false",
	"core.protectNTFS=true",
	"core.protectHFS=true",
	"protocol.allow=never",
	"submodule.recurse=false",
	"gc.auto=0",
	"maintenance.auto=false",
}

// untrustedEnv keeps git-lfs from transferring anything should it run at all, and git from
// fetching what a partial clone lacks.
var untrustedEnv = []string{
	"GIT_LFS_SKIP_SMUDGE=1",
	"GIT_NO_LAZY_FETCH=1",
	"GIT_ALLOW_PROTOCOL=none",
	"GIT_PROTOCOL_FROM_USER=0",
}

// Untrusted runs git on objects and files that a worker made (a bundle's commits, a checkpoint of
// what came back, a worktree those were checked out into) so that nothing they hold runs a
// program or sends a request: filter drivers (the LFS one, and every filter.<name> the
// configuration defines, which a .gitattributes may name), hooks, fsmonitor and transports are off
// (untrustedConfig, untrustedEnv), whatever .gitattributes, .lfsconfig or .gitmodules say.
type Untrusted struct {
	dir  string
	args []string // "-c", "key=value", … before every command
}

// ConfigError refuses to run git in a worktree whose own files are part of its configuration.
type ConfigError struct {
	Dir, File string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("git configuration of %s reads %s, a file inside that worktree: a worker's file would be configuration", e.Dir, e.File)
}

// NewUntrusted reads the effective configuration of dir once, for the filter drivers to turn off,
// and refuses (*ConfigError) a configuration file inside dir's worktree outside its git
// directory (an include.path or includeIf pointing at a tracked file), which files a worker
// wrote could replace.
func NewUntrusted(ctx context.Context, dir string) (*Untrusted, error) {
	u := &Untrusted{dir: dir}
	for _, kv := range untrustedConfig {
		u.args = append(u.args, "-c", kv)
	}
	drivers := map[string]bool{"lfs": true}
	out, err := Run(ctx, dir, "config", "-z", "--show-origin", "--list")
	if err != nil {
		return nil, fmt.Errorf("read git configuration: %w", err)
	}
	top, gitDirs, err := worktreeDirs(ctx, dir)
	if err != nil {
		return nil, err
	}
	// A worker's file as configuration: read already (its origin), or named by an include that
	// does not exist yet (the worker's commit would add it).
	refuse := func(f string) error {
		if top != "" && inside(top, f) && !insideAny(gitDirs, f) {
			return &ConfigError{Dir: top, File: f}
		}
		return nil
	}
	// "<origin> NUL <key> LF <value> NUL", the origin "file:<path>" (relative to dir) for a file.
	fields := bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0})
	for i := 0; i+1 < len(fields); i += 2 {
		origin := string(fields[i])
		key, value, _ := strings.Cut(string(fields[i+1]), "\n")
		file, isFile := strings.CutPrefix(origin, "file:")
		if isFile && !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		if isFile {
			if err := refuse(file); err != nil {
				return nil, err
			}
		}
		if includePath(key) && value != "" && !strings.HasPrefix(value, "~") {
			inc := value
			if !filepath.IsAbs(inc) && isFile {
				inc = filepath.Join(filepath.Dir(file), inc)
			}
			if filepath.IsAbs(inc) {
				if err := refuse(inc); err != nil {
					return nil, err
				}
			}
		}
		name, ok := filterDriver(key)
		if !ok {
			continue
		}
		if strings.ContainsAny(name, "=\n") {
			return nil, fmt.Errorf("git configuration %s: a filter driver name with %q cannot be turned off", key, "=")
		}
		drivers[name] = true
	}
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		u.args = append(u.args,
			"-c", "filter."+n+".process=", "-c", "filter."+n+".smudge=",
			"-c", "filter."+n+".clean=", "-c", "filter."+n+".required=false")
	}
	return u, nil
}

// filterDriver is the driver's name of a filter.<name>.<key> configuration key.
func filterDriver(key string) (string, bool) {
	const prefix = "filter."
	if len(key) <= len(prefix) || !strings.EqualFold(key[:len(prefix)], prefix) {
		return "", false
	}
	// The subsection keeps its case (only the section and the key are folded).
	rest := key[len(prefix):]
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// includePath reports whether key is include.path or includeIf.<condition>.path.
func includePath(key string) bool {
	k := strings.ToLower(key)
	return k == "include.path" || strings.HasPrefix(k, "includeif.") && strings.HasSuffix(k, ".path")
}

// worktreeDirs is dir's worktree top level ("" in a bare repository) and its git directories
// (its own and the common one), all with symlinks resolved.
func worktreeDirs(ctx context.Context, dir string) (string, []string, error) {
	out, err := Run(ctx, dir, "rev-parse", "--path-format=absolute", "--is-bare-repository", "--git-dir", "--git-common-dir")
	if err != nil {
		return "", nil, err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		return "", nil, fmt.Errorf("git rev-parse in %s: unexpected output %q", dir, out)
	}
	gitDirs := []string{realPath(lines[1]), realPath(lines[2])}
	if lines[0] == "true" {
		return "", gitDirs, nil
	}
	top, err := Line(ctx, dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return "", nil, err
	}
	return realPath(top), gitDirs, nil
}

func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

func inside(dir, p string) bool {
	rel, err := filepath.Rel(dir, realPath(p))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func insideAny(dirs []string, p string) bool {
	for _, d := range dirs {
		if inside(d, p) {
			return true
		}
	}
	return false
}

// Dir is where the runner's commands run.
func (u *Untrusted) Dir() string { return u.dir }

// Run is the package's Run with the runner's overrides.
func (u *Untrusted) Run(ctx context.Context, args ...string) ([]byte, error) {
	return u.RunEnv(ctx, nil, nil, args...)
}

// RunEnv is the package's RunEnv with the runner's overrides.
func (u *Untrusted) RunEnv(ctx context.Context, env []string, stdin []byte, args ...string) ([]byte, error) {
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	err := u.run(ctx, env, in, &out, args)
	return out.Bytes(), err
}

// Line is the package's Line with the runner's overrides.
func (u *Untrusted) Line(ctx context.Context, args ...string) (string, error) {
	out, err := u.Run(ctx, args...)
	return strings.TrimSpace(string(out)), err
}

// Stream is the package's Stream with the runner's overrides.
func (u *Untrusted) Stream(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) error {
	return u.run(ctx, nil, stdin, stdout, args)
}

func (u *Untrusted) run(ctx context.Context, env []string, stdin io.Reader, stdout io.Writer, args []string) error {
	full := append(append([]string{}, u.args...), args...)
	err := run(ctx, u.dir, append(append([]string{}, untrustedEnv...), env...), stdin, stdout, full)
	var ge *Error
	if errors.As(err, &ge) {
		ge.Args = args // the overrides would crowd the message out
	}
	return err
}
