package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/providers/local"
)

// The demo's workspace and what its scripted turn must do to it. demoScript is the built-in copy
// of examples/demo/script.json (keep the two alike); --script runs another one, whose turn the
// checks still expect to commit demoAfter into demoFile.
const (
	demoFile    = "greeting.txt"
	demoBefore  = "Hello, world!"
	demoAfter   = "Hello from a cloud worker!"
	demoMessage = "Make greeting.txt say where it ran, commit that, and run the project's check."
	demoScript  = `[
  {"text": "I'll read the greeting first.", "toolCalls": [{"name": "read", "arguments": {"path": "greeting.txt"}}]},
  {"text": "Now I'll say where this ran.", "toolCalls": [{"name": "edit", "arguments": {"path": "greeting.txt", "edits": [{"oldText": "Hello, world!", "newText": "Hello from a cloud worker!"}]}}]},
  {"text": "Committing the change on the managed branch.", "toolCalls": [{"name": "exec", "arguments": {"command": "git add greeting.txt && git -c user.name='OpenClaw demo' -c user.email=demo@openclaw.invalid commit -q -m 'greeting: say where it ran' && git log --oneline -1"}}]},
  {"text": "Running the project's check.", "toolCalls": [{"name": "exec", "arguments": {"command": "sh check.sh && git status --short | wc -l"}}]},
  {"text": "Done: greeting.txt now says where it ran, the change is committed, and check.sh passes."}
]
`
	demoGatewayConfig = `# written by openclaw demo
tunnel: {keepaliveInterval: 1s, keepaliveTimeout: 5s, backoffMax: 1s}
worker: {heartbeatTimeout: 3s, relaunchGrace: 1s, admitTimeout: 30s}
models:
  default: demo/demo
  providers:
    demo: {api: scripted, script: %q, models: [{id: demo}]}
`
)

// demoFiles is the user's project: a greeting and a check that passes only once the greeting
// says where it ran.
var demoFiles = map[string]string{
	"README.md":    "# demo project\n\nA checkout that `openclaw demo` hands to a cloud worker.\n",
	demoFile:       demoBefore + "\n",
	"check.sh":     "#!/bin/sh\n# the project's check: the greeting must say where it ran\ngrep -q 'cloud worker' " + demoFile + " && echo \"check passed: $(cat " + demoFile + ")\"\n",
	".gitignore":   "*.log\n",
	"docs/plan.md": "1. say where it ran\n",
}

func newDemoCmd(g *globals) *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the product end to end on a temp data dir: gateway, worker session, turn, pull-back, teardown",
		Long: `demo runs the whole product once on this machine, with nothing to set up but git:

  1. start a gateway (this executable, as a child process) on a temp data dir and a free port, with the
     built-in scripted model (examples/demo/script.json) and the built-in local box profile "local"
  2. create a git workspace: a small project with one commit, made with a clean git environment
  3. start a worker session on it: create the session, dispatch it to profile "local" and print each
     placement step (requested → provisioning → syncing → starting → active) until it is active
  4. send a message; the scripted turn runs on the worker: it reads greeting.txt, edits it, commits
     the change with git and runs the project's check. The turn streams to the terminal
  5. pull the session back and print each step (draining → reconciling → local)
  6. show the managed branch openclaw/<session> fast-forwarded with the worker's commit, and its diff
     against the base commit
  7. show that the user's own checkout is untouched (same branch, same commit, clean tree)
  8. destroy the environment (returns on proof of teardown) and check no box or worker process is left
  9. stop the gateway

Each stage is checked, printed with its timing and listed in a summary table. The command exits 0 only
when every stage really happened. The temp dir, the gateway and any local box are cleaned up even on
failure; a failed demo keeps the temp dir, prints its path and the tail of the gateway log.
--data-dir, --gateway and --token are ignored: the demo always runs its own gateway.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return runDemo(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.script, "script", "", "scripted model turns to use (default: the built-in copy of examples/demo/script.json)")
	f.BoolVar(&o.keep, "keep", false, "keep the temp dir even when the demo passes")
	f.StringVar(&o.tmpParent, "tmp", "", "parent directory of the demo's temp dir (default $TMPDIR)")
	f.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}

type demoOptions struct {
	script    string
	keep      bool
	tmpParent string
	timeout   time.Duration
}

// demoStage is one line of the summary.
type demoStage struct {
	title  string
	ok     bool
	dur    time.Duration
	detail string
}

// demoRun is the state of one demo: what it started, so that cleanup can undo it.
type demoRun struct {
	o     demoOptions
	out   io.Writer
	start time.Time

	tmp, data, home, ws, logPath string

	gw     *exec.Cmd
	gwDone chan struct{} // closed when the gateway process has exited
	gwErr  error
	c      *api.Client

	sessionID, envID, leaseID string
	destroyed                 bool
	pids                      map[string]int // box and worker processes seen, by role
	base, anchor, branch      string
	snapshot                  map[string]string // the user's checkout before the demo

	stages []demoStage
}

func runDemo(ctx context.Context, o demoOptions) error {
	d := &demoRun{o: o, out: stdout, start: time.Now(), pids: map[string]int{}}
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("the demo needs git on PATH: %w", err)
	}
	tmp, err := os.MkdirTemp(o.tmpParent, "openclaw-demo-")
	if err != nil {
		return err
	}
	d.tmp = tmp
	d.data = filepath.Join(tmp, "data")
	d.home = filepath.Join(tmp, "home")
	d.ws = filepath.Join(tmp, "workspace")
	d.logPath = filepath.Join(tmp, "gateway.log")
	fmt.Fprintf(d.out, "openclaw demo: temp dir %s\n", tmp)

	stages := []struct {
		title string
		fn    func(context.Context) (string, error)
	}{
		{"start a gateway", d.startGateway},
		{"create a git workspace", d.createWorkspace},
		{"start a worker session (profile local)", d.startSession},
		{"run a turn on the worker", d.runTurn},
		{"pull back", d.pullBack},
		{"managed branch and diff", d.showBranch},
		{"user checkout untouched", d.checkCheckout},
		{"destroy the environment", d.destroy},
		{"stop the gateway", d.stopGateway},
	}
	var failed error
	for _, s := range stages {
		if err := d.stage(ctx, s.title, s.fn); err != nil {
			failed = err
			break
		}
	}
	if failed != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		d.cleanup(cctx)
		cancel()
	}
	d.summary()
	if failed != nil {
		fmt.Fprintf(d.out, "\ndemo FAILED: %v\nkept the temp dir for inspection: %s\n", failed, d.tmp)
		if tail := fileTail(d.logPath, 25); tail != "" {
			fmt.Fprintf(d.out, "gateway log (%s), last lines:\n%s", d.logPath, tail)
		}
		return &exitError{code: 1, msg: "demo failed"}
	}
	if o.keep {
		fmt.Fprintf(d.out, "\nkept the temp dir: %s\n", d.tmp)
	} else if err := os.RemoveAll(d.tmp); err != nil {
		return fmt.Errorf("remove the demo's temp dir: %w", err)
	}
	fmt.Fprintln(d.out, "\ndemo passed: every stage happened; no machine, box or gateway left behind")
	return nil
}

// stage runs one checked stage, printing its title, its outcome and its duration.
func (d *demoRun) stage(ctx context.Context, title string, fn func(context.Context) (string, error)) error {
	n := len(d.stages) + 1
	fmt.Fprintf(d.out, "\n== %d. %s  [+%s]\n", n, title, demoDur(time.Since(d.start)))
	t := time.Now()
	detail, err := fn(ctx)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	s := demoStage{title: title, ok: err == nil, dur: time.Since(t), detail: detail}
	if err != nil {
		s.detail = err.Error()
	}
	d.stages = append(d.stages, s)
	mark := "ok"
	if !s.ok {
		mark = "FAILED"
	}
	fmt.Fprintf(d.out, "-- %s: %s (%s)\n", mark, s.detail, demoDur(s.dur))
	if err != nil {
		return fmt.Errorf("stage %d (%s): %w", n, title, err)
	}
	return nil
}

func (d *demoRun) summary() {
	fmt.Fprintf(d.out, "\n== summary\n")
	w := table(d.out)
	fmt.Fprintln(w, "#\tSTAGE\tRESULT\tTIME\tWHAT HAPPENED")
	for i, s := range d.stages {
		r := "ok"
		if !s.ok {
			r = "FAILED"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i+1, s.title, r, demoDur(s.dur), runeTrunc(firstLine(s.detail), 90))
	}
	fmt.Fprintf(w, "\ttotal\t\t%s\t\n", demoDur(time.Since(d.start)))
	_ = w.Flush()
}

// startGateway runs this executable's gateway mode as a child process on the temp data dir.
func (d *demoRun) startGateway(ctx context.Context) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	script := filepath.Join(d.tmp, "script.json")
	if d.o.script != "" {
		if script, err = filepath.Abs(d.o.script); err != nil {
			return "", err
		}
		if _, err := os.Stat(script); err != nil {
			return "", fmt.Errorf("--script: %w", err)
		}
	} else if err := os.WriteFile(script, []byte(demoScript), 0o600); err != nil {
		return "", err
	}
	cfgPath := filepath.Join(d.tmp, "gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(demoGatewayConfig, script)), 0o600); err != nil {
		return "", err
	}
	if err := os.MkdirAll(d.home, 0o700); err != nil {
		return "", err
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return "", err
	}
	logf, err := os.Create(d.logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close() // the child holds its own descriptor
	d.gw = exec.Command(exe, "gateway", "--data-dir", d.data, "--listen", addr, "--config", cfgPath)
	// A home of its own: no user git config, hooks or credentials reach the gateway's git commands.
	d.gw.Env = append(os.Environ(), "HOME="+d.home, "XDG_CONFIG_HOME="+filepath.Join(d.home, ".config"), "GIT_CONFIG_NOSYSTEM=1")
	d.gw.Stdout, d.gw.Stderr = logf, logf
	// Its own process group: a ^C reaches only the demo, which then tears down in order.
	d.gw.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.gw.Start(); err != nil {
		return "", fmt.Errorf("start gateway: %w", err)
	}
	d.gwDone = make(chan struct{})
	go func() { d.gwErr = d.gw.Wait(); close(d.gwDone) }()
	fmt.Fprintf(d.out, "   %s gateway --data-dir %s --listen %s --config %s\n", exe, d.data, addr, cfgPath)

	ready := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ready = true
				break
			}
		}
		select {
		case <-d.gwDone:
			return "", fmt.Errorf("gateway exited before it was ready: %v", d.gwErr)
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !ready {
		return "", fmt.Errorf("gateway at %s not ready after 20s", addr)
	}
	tok, err := gateway.ReadToken(d.data)
	if err != nil {
		return "", err
	}
	d.c = api.NewClient("http://"+addr, tok)
	var models struct {
		Default string `json:"default"`
	}
	if _, err := d.c.Do(ctx, http.MethodGet, "/api/v1/models", nil, &models); err != nil {
		return "", err
	}
	if models.Default != "demo/demo" {
		return "", fmt.Errorf("default model is %q, want the scripted demo/demo", models.Default)
	}
	return fmt.Sprintf("gateway pid %d ready at %s, scripted model %s (%s)", d.gw.Process.Pid, addr, models.Default, script), nil
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// git runs git in dir with a clean environment (no system or user config) and returns its output.
func (d *demoRun) git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + d.home, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C", "GIT_PAGER=cat", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Demo User", "GIT_AUTHOR_EMAIL=user@example.invalid",
		"GIT_COMMITTER_NAME=Demo User", "GIT_COMMITTER_EMAIL=user@example.invalid",
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (d *demoRun) createWorkspace(ctx context.Context) (string, error) {
	for name, content := range demoFiles {
		p := filepath.Join(d.ws, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"symbolic-ref", "HEAD", "refs/heads/main"},
		{"add", "-A"},
		{"commit", "-q", "-m", "initial commit"},
	} {
		if _, err := d.git(ctx, d.ws, args...); err != nil {
			return "", err
		}
	}
	base, err := d.git(ctx, d.ws, "rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	d.base = strings.TrimSpace(base)
	// An ignored file of the user's: it stays where it is, and is never sent to the worker.
	if err := os.WriteFile(filepath.Join(d.ws, "scratch.log"), []byte("the user's own notes\n"), 0o644); err != nil {
		return "", err
	}
	if d.snapshot, err = snapshotDir(d.ws); err != nil {
		return "", err
	}
	log, _ := d.git(ctx, d.ws, "log", "--oneline", "--stat", "-1")
	printIndented(d.out, "   ", log)
	return fmt.Sprintf("%s: %d files committed on main at %s", d.ws, len(demoFiles), short12(d.base)), nil
}

func (d *demoRun) startSession(ctx context.Context) (string, error) {
	var ses sessions.Session
	if _, err := d.c.Do(ctx, http.MethodPost, "/api/v1/sessions", sessions.CreateParams{Title: "openclaw demo", Workspace: d.ws}, &ses); err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	d.sessionID = ses.ID
	fmt.Fprintf(d.out, "   session %s on %s; dispatching to profile local:\n", ses.ID, d.ws)
	skip := placementEvents(ctx, d.c, ses.ID)
	if _, err := d.c.Do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(ses.ID)+"/dispatch", placement.DispatchRequest{ProfileID: "local"}, nil); err != nil {
		return "", fmt.Errorf("dispatch: %w", err)
	}
	v, err := watchPlacement(ctx, d.c, ses.ID, skip)
	if err != nil {
		return "", err
	}
	if v.Placement.State != placement.Active {
		return "", fmt.Errorf("placement ended %s, not active: %s", v.Placement.State, v.Placement.Error)
	}
	d.envID = v.Placement.EnvironmentID
	e, err := d.env(ctx)
	if err != nil {
		return "", err
	}
	d.leaseID = e.LeaseID
	if st, err := local.ReadState(filepath.Join(d.data, "boxes", e.LeaseID)); err == nil && st.PID > 0 {
		d.pids["box"] = st.PID
	}
	if pid, err := readPIDFile(filepath.Join(e.WorkerHome, bootstrap.StateDir(e.ID), "worker.pid")); err == nil {
		d.pids["worker"] = pid
	}
	if d.pids["box"] == 0 || d.pids["worker"] == 0 {
		return "", fmt.Errorf("environment %s is %s, but its box or worker process is not to be found (%v)", e.ID, e.State, d.pids)
	}
	return fmt.Sprintf("placement active on environment %s (lease %s, box pid %d, worker pid %d, %s sync)",
		d.envID, e.LeaseID, d.pids["box"], d.pids["worker"], v.Placement.SyncMode), nil
}

func (d *demoRun) env(ctx context.Context) (envs.Environment, error) {
	var e envs.Environment
	_, err := d.c.Do(ctx, http.MethodGet, "/api/v1/environments/"+url.PathEscape(d.envID), nil, &e)
	return e, err
}

// runTurn sends the message and streams the turn as `session send --follow` does.
func (d *demoRun) runTurn(ctx context.Context) (string, error) {
	var t turns.Turn
	if _, err := d.c.Do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(d.sessionID)+"/messages",
		turns.SendRequest{Text: demoMessage}, &t); err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	if t.Placement != "worker" {
		return "", fmt.Errorf("turn %s was admitted with placement %q, not on the worker", t.RunID, t.Placement)
	}
	fmt.Fprintf(d.out, "   > %s\n", demoMessage)
	p := &livePrinter{out: d.out, info: d.out}
	cursor := t.Cursor
	var outcome *sessions.LiveRecord
	tools, toolErrors := 0, 0
	until := func(r *sessions.LiveRecord) bool {
		if r.RunID != t.RunID {
			return false
		}
		switch r.Event.Type {
		case sessions.LiveToolResult:
			tools++
			if r.Event.IsError {
				toolErrors++
			}
		case sessions.LiveLifecycleEnd, sessions.LiveLifecycleError:
			outcome = r
			return true
		}
		return false
	}
	for outcome == nil {
		err := watchOnce(ctx, d.c, d.sessionID, &cursor, p, until)
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.StatusTryAgainLater {
			continue
		}
		if err != nil {
			return "", err
		}
	}
	if outcome.Event.Type != sessions.LiveLifecycleEnd {
		return "", fmt.Errorf("turn %s ended %s: %s", t.RunID, outcome.Event.Type, outcome.Event.Error)
	}
	if toolErrors > 0 {
		return "", fmt.Errorf("turn %s ended, but %d of its %d tool calls failed", t.RunID, toolErrors, tools)
	}
	// The turn row records the outcome right after the live event: wait for it.
	var done turns.Turn
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := d.c.Do(ctx, http.MethodGet, "/api/v1/turns/"+url.PathEscape(t.RunID), nil, &done); err != nil {
			return "", err
		}
		if done.Status != turns.TurnRunning || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
	if done.Status != turns.TurnDone {
		return "", fmt.Errorf("turn %s is %s: %s", t.RunID, done.Status, done.Error)
	}
	var wi api.WorkerInfo
	if _, err := d.c.Do(ctx, http.MethodGet, "/api/v1/environments/"+url.PathEscape(d.envID)+"/worker", nil, &wi); err != nil {
		return "", err
	}
	if wi.Inference.Calls == 0 {
		return "", fmt.Errorf("no model call of environment %s went through the gateway's proxy", d.envID)
	}
	return fmt.Sprintf("turn %s %s (%s) on the worker: %d tool calls, %d model calls proxied by the gateway",
		t.RunID, outcome.Event.Type, done.Status, tools, wi.Inference.Calls), nil
}

func (d *demoRun) pullBack(ctx context.Context) (string, error) {
	skip := placementEvents(ctx, d.c, d.sessionID)
	if _, err := d.c.Do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(d.sessionID)+"/pullback", nil, nil); err != nil {
		return "", fmt.Errorf("pull back: %w", err)
	}
	v, err := watchPlacement(ctx, d.c, d.sessionID, skip)
	if err != nil {
		return "", err
	}
	if v.Placement.State != placement.Local {
		return "", fmt.Errorf("pull-back ended %s, not local: %s", v.Placement.State, v.Placement.Error)
	}
	d.anchor = v.Placement.AnchorDir
	fmt.Fprintf(d.out, "   the session's workspace is now %s\n", d.anchor)
	reason := "session local again"
	if n := len(v.Events); n > 0 {
		reason = v.Events[n-1].Reason
	}
	return reason, nil
}

// showBranch shows the managed branch in the pulled-back workspace and checks it carries the
// worker's commit with the edited file.
func (d *demoRun) showBranch(ctx context.Context) (string, error) {
	b, err := d.git(ctx, d.anchor, "symbolic-ref", "--short", "HEAD")
	if err != nil {
		return "", err
	}
	d.branch = strings.TrimSpace(b)
	if !strings.HasPrefix(d.branch, "openclaw/") {
		return "", fmt.Errorf("the pulled-back workspace %s is on %q, not a managed openclaw/ branch", d.anchor, d.branch)
	}
	log, err := d.git(ctx, d.anchor, "log", "--oneline", d.branch)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(d.out, "   $ git log --oneline %s\n", d.branch)
	printIndented(d.out, "   ", log)
	diff, err := d.git(ctx, d.anchor, "diff", "--stat", "-p", short12(d.base)+".."+d.branch)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(d.out, "   $ git diff %s..%s\n", short12(d.base), d.branch)
	printIndented(d.out, "   ", diff)
	n, err := d.git(ctx, d.anchor, "rev-list", "--count", d.base+".."+d.branch)
	if err != nil {
		return "", err
	}
	count, _ := strconv.Atoi(strings.TrimSpace(n))
	if count < 1 {
		return "", fmt.Errorf("%s has no commit after the base %s", d.branch, short12(d.base))
	}
	if _, err := d.git(ctx, d.anchor, "merge-base", "--is-ancestor", d.base, d.branch); err != nil {
		return "", fmt.Errorf("%s does not descend from the base %s", d.branch, short12(d.base))
	}
	content, err := d.git(ctx, d.anchor, "show", d.branch+":"+demoFile)
	if err != nil {
		return "", err
	}
	if !strings.Contains(content, demoAfter) || strings.Contains(content, demoBefore) {
		return "", fmt.Errorf("%s on %s reads %q, want the edit %q", demoFile, d.branch, strings.TrimSpace(content), demoAfter)
	}
	onDisk, err := os.ReadFile(filepath.Join(d.anchor, demoFile))
	if err != nil {
		return "", err
	}
	if string(onDisk) != content {
		return "", fmt.Errorf("%s in the pulled-back workspace differs from %s", demoFile, d.branch)
	}
	tip, _ := d.git(ctx, d.anchor, "rev-parse", "--short=12", d.branch)
	return fmt.Sprintf("%s fast-forwarded %s → %s (%d commit); %s now reads %q",
		d.branch, short12(d.base), strings.TrimSpace(tip), count, demoFile, strings.TrimSpace(content)), nil
}

// checkCheckout checks the user's checkout: same branch, same commit, same files, nothing staged.
func (d *demoRun) checkCheckout(ctx context.Context) (string, error) {
	head, err := d.git(ctx, d.ws, "symbolic-ref", "HEAD")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(head) != "refs/heads/main" {
		return "", fmt.Errorf("the user's checkout moved to %s", strings.TrimSpace(head))
	}
	commit, err := d.git(ctx, d.ws, "rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(commit) != d.base {
		return "", fmt.Errorf("main moved from %s to %s", short12(d.base), short12(strings.TrimSpace(commit)))
	}
	status, err := d.git(ctx, d.ws, "status", "--porcelain")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(status) != "" {
		return "", fmt.Errorf("git status of the user's checkout changed:\n%s", status)
	}
	now, err := snapshotDir(d.ws)
	if err != nil {
		return "", err
	}
	for name, was := range d.snapshot {
		if now[name] != was {
			return "", fmt.Errorf("%s in the user's checkout changed", name)
		}
	}
	for name := range now {
		if _, ok := d.snapshot[name]; !ok {
			return "", fmt.Errorf("%s appeared in the user's checkout", name)
		}
	}
	fmt.Fprintf(d.out, "   $ git -C %s status --short --branch\n", d.ws)
	st, _ := d.git(ctx, d.ws, "status", "--short", "--branch")
	printIndented(d.out, "   ", st)
	return fmt.Sprintf("main still at %s, clean, %d files byte for byte as before (ignored scratch.log too); take the work with `git merge %s`",
		short12(d.base), len(now), d.branch), nil
}

// destroy tears the environment down and checks that no box or worker process is left.
func (d *demoRun) destroy(ctx context.Context) (string, error) {
	var e envs.Environment
	if _, err := d.c.Do(ctx, http.MethodDelete, "/api/v1/environments/"+url.PathEscape(d.envID)+"?wait=60s", nil, &e); err != nil {
		return "", fmt.Errorf("destroy %s: %w", d.envID, err)
	}
	var evs []envs.Event
	_, _ = d.c.Do(ctx, http.MethodGet, "/api/v1/environments/"+url.PathEscape(d.envID)+"/events", nil, &evs)
	for _, ev := range evs {
		if ev.To == envs.Destroying || ev.To == envs.Destroyed || ev.To == envs.Idle {
			fmt.Fprintf(d.out, "   %s  %-11s %s\n", ev.At.Local().Format("15:04:05.000"), ev.To, ev.Reason)
		}
	}
	if e.State != envs.Destroyed {
		return "", fmt.Errorf("environment %s is %s after 60s: %s", d.envID, e.State, e.Error)
	}
	d.destroyed = true
	if err := waitGone(ctx, d.pids, 10*time.Second); err != nil {
		return "", err
	}
	boxDir := filepath.Join(d.data, "boxes", d.leaseID)
	if _, err := os.Stat(boxDir); !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("box directory %s is still there", boxDir)
	}
	if live := liveBoxes(filepath.Join(d.data, "boxes")); len(live) > 0 {
		return "", fmt.Errorf("box processes still running: %v", live)
	}
	return fmt.Sprintf("environment %s destroyed, provider confirmed; box pid %d and worker pid %d gone, box directory removed",
		d.envID, d.pids["box"], d.pids["worker"]), nil
}

func (d *demoRun) stopGateway(ctx context.Context) (string, error) {
	pid := d.gw.Process.Pid
	if err := d.stopGatewayProcess(ctx); err != nil {
		return "", err
	}
	if d.gwErr != nil {
		return "", fmt.Errorf("gateway pid %d exited with %v", pid, d.gwErr)
	}
	if live := liveBoxes(filepath.Join(d.data, "boxes")); len(live) > 0 {
		return "", fmt.Errorf("box processes still running: %v", live)
	}
	if left := procsUnder(d.tmp); len(left) > 0 {
		return "", fmt.Errorf("processes still running from %s: %v", d.tmp, left)
	}
	return fmt.Sprintf("gateway pid %d stopped cleanly (SIGTERM); no box process left", pid), nil
}

// stopGatewayProcess sends SIGTERM, then SIGKILL after 15s, and waits for the exit.
func (d *demoRun) stopGatewayProcess(ctx context.Context) error {
	if d.gw == nil || d.gwDone == nil {
		return nil
	}
	select {
	case <-d.gwDone:
		return nil
	default:
	}
	_ = d.gw.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.gwDone:
		return nil
	case <-time.After(15 * time.Second):
	case <-ctx.Done():
	}
	_ = d.gw.Process.Kill()
	<-d.gwDone
	return fmt.Errorf("gateway pid %d did not stop within 15s of SIGTERM; killed", d.gw.Process.Pid)
}

// cleanup undoes what a failed demo started: the environment (through the gateway while it
// runs), the gateway, then any box or worker process still alive. The temp dir stays.
func (d *demoRun) cleanup(ctx context.Context) {
	fmt.Fprintf(d.out, "\n== cleaning up after the failure\n")
	gwAlive := d.gwDone != nil
	if gwAlive {
		select {
		case <-d.gwDone:
			gwAlive = false
		default:
		}
	}
	if gwAlive && d.c != nil && d.envID == "" && d.sessionID != "" {
		// interrupted mid-dispatch: the placement knows the environment being leased
		var v placementView
		if _, err := d.c.Do(ctx, http.MethodGet, "/api/v1/sessions/"+url.PathEscape(d.sessionID)+"/placement", nil, &v); err == nil {
			d.envID = v.Placement.EnvironmentID
		}
	}
	if gwAlive && d.c != nil && d.envID != "" && !d.destroyed {
		var e envs.Environment
		_, err := d.c.Do(ctx, http.MethodDelete, "/api/v1/environments/"+url.PathEscape(d.envID)+"?force=true&wait=30s", nil, &e)
		fmt.Fprintf(d.out, "   destroy environment %s: state %s %v\n", d.envID, dash(string(e.State)), errOrEmpty(err))
	}
	if err := d.stopGatewayProcess(ctx); err != nil {
		fmt.Fprintf(d.out, "   %v\n", err)
	} else if d.gw != nil {
		fmt.Fprintf(d.out, "   gateway pid %d stopped\n", d.gw.Process.Pid)
	}
	// Worker processes are detached from their box: end them by their pidfiles, then the boxes.
	boxes := filepath.Join(d.data, "boxes")
	workers, _ := filepath.Glob(filepath.Join(boxes, "*", ".openclaw-worker", "state", "*", "worker.pid"))
	for _, f := range workers {
		if pid, err := readPIDFile(f); err == nil && isOpenclawProcess(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			fmt.Fprintf(d.out, "   killed worker pid %d\n", pid)
		}
	}
	for dir, pid := range liveBoxes(boxes) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if waitGone(ctx, map[string]int{dir: pid}, 3*time.Second) != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		fmt.Fprintf(d.out, "   stopped box pid %d (%s)\n", pid, dir)
	}
	// Last resort: anything still running from the temp dir (a worker launched while its box was
	// being destroyed has no pidfile left).
	for _, pid := range procsUnder(d.tmp) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		fmt.Fprintf(d.out, "   killed pid %d, still running from %s\n", pid, d.tmp)
	}
	if live := liveBoxes(boxes); len(live) > 0 {
		fmt.Fprintf(d.out, "   box processes still running: %v\n", live)
	}
}

// procsUnder lists the processes whose command line names a path under dir (Linux; elsewhere none).
func procsUnder(dir string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || processExited(pid) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(dir+string(filepath.Separator))) {
			out = append(out, pid)
		}
	}
	return out
}

// liveBoxes maps each box directory under boxes whose process still holds its lock to that pid.
func liveBoxes(boxes string) map[string]int {
	out := map[string]int{}
	locks, _ := filepath.Glob(filepath.Join(boxes, "*", ".localbox", "lock"))
	for _, lock := range locks {
		f, err := os.Open(lock)
		if err != nil {
			continue
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		} else if errors.Is(err, syscall.EWOULDBLOCK) {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
			out[filepath.Dir(filepath.Dir(lock))] = pid
		}
		f.Close()
	}
	return out
}

// waitGone waits until every pid has exited (a zombie counts as exited).
func waitGone(ctx context.Context, pids map[string]int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var alive []string
		for role, pid := range pids {
			if pid > 0 && !processExited(pid) {
				alive = append(alive, fmt.Sprintf("%s pid %d", role, pid))
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running after %s: %s", within, strings.Join(alive, ", "))
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleepCtx waits for d or the end of ctx.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func processExited(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S …": the state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// isOpenclawProcess reports whether pid is alive and (where /proc tells) runs an openclaw worker,
// so that a recycled pid is never killed.
func isOpenclawProcess(pid int) bool {
	if pid <= 1 || processExited(pid) {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) // no /proc on this system: trust the pidfile
	}
	return bytes.Contains(cmdline, []byte("worker"))
}

func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// snapshotDir maps every file of dir outside .git to its content.
func snapshotDir(dir string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() {
			if de.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	return out, err
}

func printIndented(w io.Writer, prefix, text string) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		fmt.Fprintf(w, "%s%s\n", prefix, sc.Text())
	}
}

func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.SplitAfter(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "") + "\n"
}

// runeTrunc cuts s to n runes, never inside a character.
func runeTrunc(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func short12(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func demoDur(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
