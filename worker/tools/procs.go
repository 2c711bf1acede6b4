package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// outBuf keeps the first headMax bytes and the last tailMax bytes written to it, and counts all.
type outBuf struct {
	mu      sync.Mutex
	head    []byte
	tail    []byte
	headMax int
	tailMax int
	total   int64
	changed chan struct{} // closed and replaced on every write
}

func newOutBuf(headMax, tailMax int) *outBuf {
	return &outBuf{headMax: headMax, tailMax: tailMax, changed: make(chan struct{})}
}

func (b *outBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.headMax - len(b.head); room > 0 {
		b.head = append(b.head, p[:min(room, len(p))]...)
	}
	b.tail = append(b.tail, p...)
	if len(b.tail) > b.tailMax {
		b.tail = b.tail[len(b.tail)-b.tailMax:]
	}
	b.total += int64(len(p))
	close(b.changed)
	b.changed = make(chan struct{})
	return len(p), nil
}

// wait returns a channel closed at the next write.
func (b *outBuf) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

func (b *outBuf) size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// headTail renders all output within limit bytes: the start and the end with a marker between
// that says how many bytes were left out.
func (b *outBuf) headTail(limit int) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total <= int64(limit) && int64(len(b.tail)) == b.total {
		return string(b.tail), false
	}
	h := b.head[:runeStart(b.head, min(limit/2, len(b.head)))]
	t := b.tail[len(b.tail)-min(limit/2, len(b.tail)):]
	for i := 0; i < 3 && len(t) > 0 && t[0]&0xC0 == 0x80; i++ {
		t = t[1:]
	}
	omitted := b.total - int64(len(h)) - int64(len(t))
	return fmt.Sprintf("%s\n[... %d bytes of output omitted ...]\n%s", h, omitted, t), true
}

// since returns the output written at or after offset (absolute), at most limit bytes of it
// (the latest), and the offset of its end. skipped counts bytes no longer retained or left out.
func (b *outBuf) since(offset int64, limit int) (out []byte, end, skipped int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := b.total - int64(len(b.tail))
	if offset < start {
		skipped, offset = start-offset, start
	}
	out = b.tail[offset-start:]
	if len(out) > limit {
		skipped += int64(len(out) - limit)
		out = out[len(out)-limit:]
	}
	return append([]byte(nil), out...), b.total, skipped
}

// retained returns the output still held and how many earlier bytes were dropped.
func (b *outBuf) retained() ([]byte, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.tail...), b.total - int64(len(b.tail))
}

// process is one command started by exec.
type process struct {
	id      string
	command string
	cwd     string
	pid     int
	started time.Time
	out     *outBuf
	done    chan struct{} // closed once the process is reaped; the fields below are then fixed

	cmd   *exec.Cmd
	stdin *os.File
	timer *time.Timer

	mu         sync.Mutex
	background bool
	pollOffset int64
	timedOut   bool
	killed     bool
	stdinOpen  bool
	exitCode   int // -1 when killed by a signal
	signal     string
	waitErr    string
	ended      time.Time
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// killGroup kills the process group; the shell and every child it started.
func (p *process) killGroup(reason string) {
	p.mu.Lock()
	switch reason {
	case "timeout":
		p.timedOut = true
	case "kill":
		p.killed = true
	}
	p.mu.Unlock()
	if !p.exited() {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

func (p *process) status() string {
	if !p.exited() {
		return "running"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.timedOut:
		return "timed out"
	case p.killed:
		return "killed"
	case p.signal != "":
		return "killed by " + p.signal
	case p.exitCode == 0:
		return "completed"
	}
	return fmt.Sprintf("failed (exit code %d)", p.exitCode)
}

// ErrTooManyProcesses is returned when every process slot holds a running process.
var ErrTooManyProcesses = errors.New("too many running processes; kill or remove some with the process tool")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("tool set is closed")

// ScopeEnv is the environment variable every command of a tool set starts with: the set's scope,
// by which the set finds the processes its commands left behind (see containment).
const ScopeEnv = "OPENCLAW_TOOL_SCOPE"

// registry owns the processes started by exec: the waiter goroutines, the timers, the slots, and
// the containment that finds what they started.
type registry struct {
	cfg     *Config
	mu      sync.Mutex
	procs   map[string]*process
	nextID  int
	closed  bool
	wg      sync.WaitGroup
	contain *containment
	stopped Stopped
}

// Stopped says what closing a tool set stopped: the processes its commands started that were
// still running (detached ones included), and how they were found.
type Stopped struct {
	Processes int
	By        string
}

func newRegistry(cfg *Config) *registry {
	return &registry{cfg: cfg, procs: map[string]*process{}, contain: newContainment(newScope(cfg.Owner))}
}

// newScope is a set's scope: its owner (when it has one), then random.
func newScope(owner string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	if owner != "" {
		return owner + "-" + hex.EncodeToString(b)
	}
	return hex.EncodeToString(b)
}

type startSpec struct {
	command string
	cwd     string
	env     []string
	timeout time.Duration // 0: none
}

// start starts a command in its own process group and registers it.
func (r *registry) start(sp startSpec) (*process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if len(r.procs) >= r.cfg.MaxProcesses && !r.evictLocked() {
		return nil, ErrTooManyProcesses
	}
	out := newOutBuf(r.cfg.MaxOutputBytes, r.cfg.ProcessOutputBytes)
	// Our own pipe rather than StdinPipe, so a write to a process that does not read can time out.
	stdinR, stdin, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(r.cfg.Shell, "-c", sp.command)
	cmd.Dir = sp.cwd
	cmd.Env = append(withoutVar(sp.env, ScopeEnv), ScopeEnv+"="+r.contain.scope)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.contain.prepare(cmd.SysProcAttr, r.cfg.Shell)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = out, out, stdinR
	// A child left holding the output pipe must not keep the process "running" forever.
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Start()
	stdinR.Close()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	r.nextID++
	p := &process{
		id: fmt.Sprintf("proc-%d", r.nextID), command: sp.command, cwd: sp.cwd, pid: cmd.Process.Pid,
		started: time.Now(), out: out, done: make(chan struct{}), cmd: cmd, stdin: stdin, stdinOpen: true,
	}
	if sp.timeout > 0 {
		p.timer = time.AfterFunc(sp.timeout, func() { p.killGroup("timeout") })
	}
	r.procs[p.id] = p
	r.wg.Add(1)
	go r.wait(p)
	return p, nil
}

func (r *registry) wait(p *process) {
	defer r.wg.Done()
	err := p.cmd.Wait()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.stdin.Close()
	p.mu.Lock()
	p.ended = time.Now()
	p.exitCode = -1
	p.stdinOpen = false
	if st := p.cmd.ProcessState; st != nil {
		p.exitCode = st.ExitCode()
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.signal = ws.Signal().String()
		}
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) && !errors.Is(err, exec.ErrWaitDelay) {
		p.waitErr = err.Error()
	}
	p.mu.Unlock()
	close(p.done)
}

// evictLocked drops the oldest exited process; false if all are running.
func (r *registry) evictLocked() bool {
	var oldest *process
	for _, p := range r.procs {
		if p.exited() && (oldest == nil || p.started.Before(oldest.started)) {
			oldest = p
		}
	}
	if oldest == nil {
		return false
	}
	delete(r.procs, oldest.id)
	return true
}

func (r *registry) get(id string) (*process, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.procs[id]
	return p, ok
}

func (r *registry) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.procs, id)
}

// list returns the background processes, oldest first.
func (r *registry) list() []*process {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*process
	for _, p := range r.procs {
		p.mu.Lock()
		bg := p.background
		p.mu.Unlock()
		if bg {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].started.Before(out[j].started) })
	return out
}

// close kills every running process group and waits for all to be reaped.
func (r *registry) close(ctx context.Context) error {
	r.mu.Lock()
	again := r.closed
	r.closed = true
	procs := make([]*process, 0, len(r.procs))
	for _, p := range r.procs {
		procs = append(procs, p)
	}
	r.mu.Unlock()
	for _, p := range procs {
		p.killGroup("kill")
	}
	// then what left the groups (setsid, double forks), found by the containment; once per set
	var err error
	if !again {
		var n int
		by := r.contain.how()
		n, err = r.contain.stop(ctx)
		r.mu.Lock()
		r.stopped = Stopped{Processes: n, By: by}
		r.mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("close tools: %w", ctx.Err()))
	}
}

// kill kills p's group and waits up to grace for it to be reaped.
func (p *process) kill(ctx context.Context, grace time.Duration) bool {
	p.killGroup("kill")
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// withoutVar returns env without the entries of name.
func withoutVar(env []string, name string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return out
}

func environ(base []string, extra map[string]string) []string {
	if base == nil {
		base = os.Environ()
	}
	env := append([]string(nil), base...)
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}
