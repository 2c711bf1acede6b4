// Package tools implements the agent's tools (read, write, edit, apply_patch, exec, process, grep,
// find, ls) with the upstream names and parameter shapes, confined to a session workspace.
package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/protocol"
)

// Tool is one tool offered to the model.
type Tool interface {
	Name() string
	// Schema is the name, description and JSON-Schema parameters shown to the model.
	Schema() protocol.Tool
	// Run executes one call. The error is only for internal failures; a failure the model
	// caused (bad path, no match, non-zero exit) is a Result with IsError set.
	Run(ctx context.Context, args json.RawMessage) (Result, error)
}

// Result is what a tool call returns to the model.
type Result struct {
	Content []protocol.Content
	// Details is structured data for UIs and logs (exit codes, counts); not shown to the model.
	Details json.RawMessage
	IsError bool
}

// Text concatenates the text blocks of the result.
func (r Result) Text() string {
	var b strings.Builder
	for _, c := range r.Content {
		if c.Type == protocol.ContentText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// ErrOutsideWorkspace is returned (wrapped in a PathError) for a path that escapes the workspace.
var ErrOutsideWorkspace = errors.New("path is outside the workspace")

// PathError names a path argument that could not be used.
type PathError struct {
	Path string
	Err  error
}

func (e *PathError) Error() string { return fmt.Sprintf("%s: %v", e.Path, e.Err) }

// Unwrap returns the cause.
func (e *PathError) Unwrap() error { return e.Err }

// Config configures a Set.
type Config struct {
	// Workspace is the absolute root every path argument resolves against.
	Workspace string
	// Extra are more tools offered after the built-in ones (for example gateway-resident tools
	// such as web_search); a name clash with a built-in tool is ignored.
	Extra []Tool
	// MaxOutputBytes bounds the text of one result. Default 50 KiB.
	MaxOutputBytes int
	// MaxLines bounds the lines of one read result. Default 2000.
	MaxLines int
	// Env is the base environment of exec; nil inherits the current process's environment.
	Env []string
	// Shell runs exec commands as Shell -c COMMAND. Default /bin/sh.
	Shell string
	// DefaultTimeout kills a foreground exec that has no timeout argument. Default 30 minutes.
	DefaultTimeout time.Duration
	// DefaultYield moves a foreground exec still running after it to the background, as if
	// yieldMs had been given. Default 10s; negative waits for the command to finish.
	DefaultYield time.Duration
	// MaxProcesses bounds the processes tracked for the process tool. Default 64.
	MaxProcesses int
	// ProcessOutputBytes is the output retained per process (a ring buffer). Default 1 MiB,
	// never less than MaxOutputBytes.
	ProcessOutputBytes int
	// Owner names who runs the set across restarts (OwnerOf: a worker's state dir, a gateway's
	// data dir): the set's scope starts with it, so StopLeftovers(Owner) in a later process of the
	// same owner stops what a set of one that died left running. "" gives no such name.
	Owner string
}

// OwnerOf is the Owner of the sets of a process that keeps its state in dir.
func OwnerOf(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	sum := sha256.Sum256([]byte("openclaw tool owner\x00" + dir))
	return hex.EncodeToString(sum[:8])
}

func (c *Config) setDefaults() {
	if c.Workspace != "" && !filepath.IsAbs(c.Workspace) {
		if abs, err := filepath.Abs(c.Workspace); err == nil {
			c.Workspace = abs
		}
	}
	if c.Workspace != "" {
		c.Workspace = filepath.Clean(c.Workspace)
	}
	if c.MaxOutputBytes <= 0 {
		c.MaxOutputBytes = 50 << 10
	}
	if c.MaxLines <= 0 {
		c.MaxLines = 2000
	}
	if c.Shell == "" {
		c.Shell = "/bin/sh"
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = 30 * time.Minute
	}
	if c.DefaultYield == 0 {
		c.DefaultYield = 10 * time.Second
	}
	if c.MaxProcesses <= 0 {
		c.MaxProcesses = 64
	}
	if c.ProcessOutputBytes <= 0 {
		c.ProcessOutputBytes = 1 << 20
	}
	if c.ProcessOutputBytes < c.MaxOutputBytes {
		c.ProcessOutputBytes = c.MaxOutputBytes
	}
}

// Validate reports a missing or unusable workspace.
func (c Config) Validate() error {
	if c.Workspace == "" {
		return errors.New("tools config: workspace is required")
	}
	if !filepath.IsAbs(c.Workspace) {
		return fmt.Errorf("tools config: workspace %q is not absolute", c.Workspace)
	}
	fi, err := os.Stat(c.Workspace)
	if err != nil {
		return fmt.Errorf("tools config: workspace: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("tools config: workspace %q is not a directory", c.Workspace)
	}
	return nil
}

// Set is the tools of one session workspace. It owns the background processes started by exec;
// Close kills them.
type Set struct {
	cfg      Config
	realRoot string // Workspace with symlinks resolved
	tools    []Tool
	byName   map[string]Tool
	procs    *registry
}

// NewSet returns the tools for cfg.Workspace. Call cfg.Validate first to catch a bad workspace;
// otherwise every file tool reports it as an error result.
func NewSet(cfg Config) *Set {
	cfg.setDefaults()
	s := &Set{cfg: cfg, realRoot: cfg.Workspace, byName: map[string]Tool{}}
	if r, err := filepath.EvalSymlinks(cfg.Workspace); err == nil {
		s.realRoot = r
	}
	s.procs = newRegistry(&s.cfg)
	s.tools = []Tool{
		&readTool{s}, &writeTool{s}, &editTool{s}, &patchTool{s},
		&execTool{s}, &processTool{s}, &grepTool{s}, &findTool{s}, &lsTool{s},
	}
	for _, t := range s.tools {
		s.byName[t.Name()] = t
	}
	for _, t := range cfg.Extra {
		if _, clash := s.byName[t.Name()]; !clash {
			s.tools = append(s.tools, t)
			s.byName[t.Name()] = t
		}
	}
	return s
}

// Config returns the configuration with defaults applied.
func (s *Set) Config() Config { return s.cfg }

// Tools returns the tools in a stable order.
func (s *Set) Tools() []Tool { return append([]Tool(nil), s.tools...) }

// Schemas returns the schema of every tool, for the model context.
func (s *Set) Schemas() []protocol.Tool {
	out := make([]protocol.Tool, 0, len(s.tools))
	for _, t := range s.tools {
		out = append(out, t.Schema())
	}
	return out
}

// Run runs the named tool. It never panics and never returns an error: an unknown tool,
// malformed arguments, an internal failure or a panic become an IsError result naming the problem.
func (s *Set) Run(ctx context.Context, name string, args json.RawMessage) (res Result) {
	t, ok := s.byName[name]
	if !ok {
		names := make([]string, 0, len(s.tools))
		for _, t := range s.tools {
			names = append(names, t.Name())
		}
		return errorf("unknown tool %q; available tools: %s", name, strings.Join(names, ", "))
	}
	args = normalizeArgs(args)
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return errorf("invalid arguments for tool %s: expected a JSON object: %s", name, jsonErr(err, args))
	}
	defer func() {
		if r := recover(); r != nil {
			res = errorf("tool %s: internal error: %v", name, r)
		}
	}()
	res, err := t.Run(ctx, args)
	if err != nil {
		return errorf("tool %s: %v", name, err)
	}
	return res
}

// Close kills the background processes and waits for them to be reaped, or for ctx.
func (s *Set) Close(ctx context.Context) error { return s.procs.close(ctx) }

// Stop closes the set (see Close) and says what it stopped: every process its commands started
// that was still running, the detached ones (setsid, double forks) included. A second call
// returns what the first stopped.
func (s *Set) Stop(ctx context.Context) (Stopped, error) {
	err := s.procs.close(ctx)
	s.procs.mu.Lock()
	defer s.procs.mu.Unlock()
	return s.procs.stopped, err
}

func jsonErr(err error, args []byte) string {
	if err != nil {
		return err.Error()
	}
	return "got " + string(truncateBytes(args, 80))
}

func normalizeArgs(args json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(args)
	if len(t) == 0 || string(t) == "null" {
		return json.RawMessage("{}")
	}
	return t
}

// decodeArgs decodes a JSON object of arguments into v; unknown fields are ignored.
func decodeArgs(args json.RawMessage, v any) error {
	args = normalizeArgs(args)
	if len(args) == 0 || args[0] != '{' {
		return errors.New("expected a JSON object")
	}
	if err := json.Unmarshal(args, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return err
	}
	return nil
}

func invalidArgs(tool string, err error) Result {
	return errorf("invalid arguments for tool %s: %v", tool, err)
}

// optInt is an optional integer that also accepts a numeric string, as models sometimes send.
type optInt struct {
	Set bool
	V   int
}

func (o *optInt) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		return nil
	}
	s = strings.Trim(s, `"`)
	if s == "" {
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != float64(int64(f)) {
		return fmt.Errorf("expected an integer, got %s", b)
	}
	o.Set, o.V = true, int(f)
	return nil
}

func (o optInt) or(def int) int {
	if o.Set {
		return o.V
	}
	return def
}

// optBool is an optional boolean that also accepts "true" and "false" strings.
type optBool bool

func (o *optBool) UnmarshalJSON(b []byte) error {
	switch strings.Trim(strings.TrimSpace(string(b)), `"`) {
	case "true", "1":
		*o = true
	case "false", "0", "null", "":
		*o = false
	default:
		return fmt.Errorf("expected a boolean, got %s", b)
	}
	return nil
}

func textResult(text string) Result {
	return Result{Content: []protocol.Content{{Type: protocol.ContentText, Text: text}}}
}

func errorf(format string, a ...any) Result {
	r := textResult(fmt.Sprintf(format, a...))
	r.IsError = true
	return r
}

func withDetails(r Result, v any) Result {
	b, err := json.Marshal(v)
	if err == nil {
		r.Details = b
	}
	return r
}

// resolve turns a path argument into an absolute path inside the workspace. Absolute paths are
// allowed only inside the workspace; so is the target of any symlink along the way.
func (s *Set) resolve(p string) (string, error) {
	if p == "" {
		p = "."
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			p = filepath.Join(home, p[1:])
		}
	}
	var abs string
	if filepath.IsAbs(p) {
		abs = filepath.Clean(p)
	} else {
		abs = filepath.Join(s.cfg.Workspace, p)
	}
	if !within(s.cfg.Workspace, abs) && !within(s.realRoot, abs) {
		return "", &PathError{Path: p, Err: ErrOutsideWorkspace}
	}
	if real := evalExisting(abs); !within(s.realRoot, real) && !within(s.cfg.Workspace, real) {
		return "", &PathError{Path: p, Err: fmt.Errorf("%w (through a symlink to %s)", ErrOutsideWorkspace, real)}
	}
	return abs, nil
}

// evalExisting resolves the symlinks of the longest existing prefix of abs.
func evalExisting(abs string) string {
	rest := ""
	for cur := abs; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// display is how a path is shown to the model: relative to the workspace when inside it.
func (s *Set) display(abs string) string {
	if rel, err := filepath.Rel(s.cfg.Workspace, abs); err == nil && within(s.cfg.Workspace, abs) {
		return filepath.ToSlash(rel)
	}
	return abs
}

// pathErr turns a resolve or file-system error into an error result.
func (s *Set) pathErr(tool, p string, err error) Result {
	var pe *PathError
	if errors.As(err, &pe) {
		return errorf("%s: %v", tool, err)
	}
	var fe *os.PathError
	if errors.As(err, &fe) {
		err = fe.Err
	}
	return errorf("%s: %s: %v", tool, p, err)
}

// resolveDir resolves p to a directory inside the workspace; bad is the tool's error result when
// it is not one.
func (s *Set) resolveDir(tool, p string) (dir string, bad *Result) {
	dir, err := s.resolve(p)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(dir); err == nil && !fi.IsDir() {
			r := errorf("%s: %s is not a directory", tool, s.display(dir))
			return "", &r
		}
	}
	if err != nil {
		r := s.pathErr(tool, p, err)
		return "", &r
	}
	return dir, nil
}

// lockPath resolves p for a tool that writes it and locks it against the other writers (see
// fileLocks); bad is the tool's error result when it may not, else unlock must be called.
func (s *Set) lockPath(ctx context.Context, tool, p string) (abs string, unlock func(), bad *Result) {
	abs, err := s.resolve(p)
	if err != nil {
		r := s.pathErr(tool, p, err)
		return "", nil, &r
	}
	if err := ctx.Err(); err != nil {
		r := errorf("%s: %v", tool, err)
		return "", nil, &r
	}
	return abs, lockFiles(abs), nil
}

// fileLocks serialises writers of one file within the process (edit, write, apply_patch). The
// paths hash onto a fixed set of stripes so the table stays bounded.
var fileLocks [64]sync.Mutex

func lockFiles(paths ...string) func() {
	var stripes []int
	for _, p := range paths {
		h := fnv.New32a()
		h.Write([]byte(p))
		stripes = append(stripes, int(h.Sum32()%uint32(len(fileLocks))))
	}
	slices.Sort(stripes)
	stripes = slices.Compact(stripes)
	for _, i := range stripes {
		fileLocks[i].Lock()
	}
	return func() {
		for j := len(stripes) - 1; j >= 0; j-- {
			fileLocks[stripes[j]].Unlock()
		}
	}
}

// writeFileAtomic writes data to path through internal/atomicfile (a synced temp file renamed
// over it, the directory synced), creating its directory and keeping the mode of an existing
// file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	st, err := stageFile(path, data, perm)
	if err != nil {
		return err
	}
	return st.Commit()
}

// stageFile stages data for path (atomicfile.Stage) in path's directory, created if missing,
// with the mode of an existing file at path.
func stageFile(path string, data []byte, perm os.FileMode) (*atomicfile.Staged, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, &os.PathError{Op: "write", Path: path, Err: errors.New("is a directory")}
		}
		perm = fi.Mode().Perm()
	}
	return atomicfile.Stage(path, data, perm)
}

func truncateBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(append([]byte(nil), b[:runeStart(b, n)]...), "…"...)
}

// runeStart moves i back to the start of a UTF-8 sequence so a cut at i splits no rune.
func runeStart(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	for j := 0; j < 4 && i > 0 && b[i]&0xC0 == 0x80; j++ {
		i--
	}
	return i
}

// limitText bounds s to max bytes, cutting at a line boundary when one is near, and appends a
// marker saying how much was cut.
func limitText(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	cut := runeStart([]byte(s), max)
	if nl := strings.LastIndexByte(s[:cut], '\n'); nl > max/2 {
		cut = nl
	}
	rest := s[cut:]
	return s[:cut] + fmt.Sprintf("\n[... output truncated: %d more bytes, %d more lines]", len(rest), strings.Count(rest, "\n")+1), true
}

func formatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func isBinary(head []byte) bool { return bytes.IndexByte(head, 0) >= 0 }

func schema(name, desc, params string) protocol.Tool {
	return protocol.Tool{Name: name, Description: desc, Parameters: json.RawMessage(params)}
}

// Manifest is the manifest of the built-in tools (protocol.ToolManifest), which a worker presents
// at admission: a property of the build, whatever the workspace.
func Manifest() []protocol.ToolDigest {
	return protocol.ToolManifest(NewSet(Config{Workspace: "/"}).Schemas())
}
