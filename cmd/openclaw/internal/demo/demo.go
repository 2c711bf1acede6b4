// Package demo runs the product end to end on a temp data dir: a gateway, a worker session on
// the built-in local box, a turn, the pull-back and the teardown, each stage checked.
package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/providers/local"
)

// Options configure one demo.
type Options struct {
	// Exe is the openclaw executable the demo runs its gateway from (default this one).
	Exe string
	// Script is a file of scripted model turns (default the built-in copy of
	// examples/demo/script.json); its turn must still edit and commit greeting.txt as that one does.
	Script string
	// Keep keeps the temp dir and, when the demo passes, leaves its gateway running and prints
	// the Control UI's sign-in link (the gateway runs until killed; the pid is printed).
	Keep bool
	// TmpParent is the parent directory of the demo's temp dir (default $TMPDIR).
	TmpParent string
	// Out receives the demo's report; Err the placement steps as they happen.
	Out, Err io.Writer
}

// ErrFailed is returned when a stage failed (the report says which, and why).
var ErrFailed = errors.New("demo failed")

// stageResult is one line of the summary.
type stageResult struct {
	title  string
	ok     bool
	dur    time.Duration
	detail string
}

// run is the state of one demo: what it started, so that cleanup can undo it.
type run struct {
	o     Options
	out   io.Writer
	start time.Time

	tmp, data, home, ws, logPath string
	exe                          string // the openclaw executable the gateway and the CLI run from

	forge               *gitforge.Forge
	forgeRepo, forgeURL string

	gw     *exec.Cmd
	gwDone chan struct{} // closed when the gateway process has exited
	gwErr  error
	c      *api.Client

	sessionID, envID, leaseID string
	destroyed                 bool
	pids                      map[string]int // box and worker processes seen, by role
	base, anchor, branch      string
	snapshot                  map[string]string // the user's checkout before the demo

	stages []stageResult
}

// Run runs the demo: it starts a gateway on a temp data dir, runs a worker session on it end
// to end, checks every stage and tears everything down, also on failure.
func Run(ctx context.Context, o Options) error {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Err == nil {
		o.Err = o.Out
	}
	d := &run{o: o, out: o.Out, start: time.Now(), pids: map[string]int{}}
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("the demo needs git on PATH: %w", err)
	}
	tmp, err := os.MkdirTemp(o.TmpParent, "openclaw-demo-")
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
		{"publish the branch to the forge (openclaw session publish)", d.publish},
		{"user checkout untouched", d.checkCheckout},
		{"destroy the environment", d.destroy},
		{"an agent spawns a child on a worker (sessions_spawn)", d.spawnChild},
		{"what it cost: machines and model calls (openclaw usage)", d.spend},
		{"stop the gateway", d.stopGateway},
	}
	if o.Keep {
		stages[len(stages)-1] = struct {
			title string
			fn    func(context.Context) (string, error)
		}{"leave the gateway running (--keep)", d.keepGateway}
	}
	defer func() {
		if d.forge != nil {
			d.forge.Close()
		}
	}()
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
		return ErrFailed
	}
	if o.Keep {
		fmt.Fprintf(d.out, "\nkept the temp dir: %s\n", d.tmp)
		fmt.Fprintln(d.out, "\ndemo passed: every stage happened; no machine or box left behind; the gateway is still running")
		fmt.Fprintf(d.out, "gateway pid %d: %s (log %s)\n", d.gw.Process.Pid, d.c.BaseURL, d.logPath)
		link, err := SignInLink(ctx, d.c)
		if err != nil {
			return fmt.Errorf("sign-in link of the kept gateway: %w", err)
		}
		fmt.Fprintf(d.out, "sign in to the Control UI: %s\n  (a one-time link, valid 2 minutes; `openclaw ui --gateway %s --data-dir %s` prints another)\n", link, d.c.BaseURL, d.data)
		fmt.Fprintf(d.out, "stop it with: kill %d\n", d.gw.Process.Pid)
		return nil
	}
	if err := os.RemoveAll(d.tmp); err != nil {
		return fmt.Errorf("remove the demo's temp dir: %w", err)
	}
	fmt.Fprintln(d.out, "\ndemo passed: every stage happened; no machine, box or gateway left behind")
	return nil
}

// stage runs one checked stage, printing its title, its outcome and its duration.
func (d *run) stage(ctx context.Context, title string, fn func(context.Context) (string, error)) error {
	n := len(d.stages) + 1
	fmt.Fprintf(d.out, "\n== %d. %s  [+%s]\n", n, title, dur(time.Since(d.start)))
	t := time.Now()
	detail, err := fn(ctx)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	s := stageResult{title: title, ok: err == nil, dur: time.Since(t), detail: detail}
	if err != nil {
		s.detail = err.Error()
	}
	d.stages = append(d.stages, s)
	mark := "ok"
	if !s.ok {
		mark = "FAILED"
	}
	fmt.Fprintf(d.out, "-- %s: %s (%s)\n", mark, s.detail, dur(s.dur))
	if err != nil {
		return fmt.Errorf("stage %d (%s): %w", n, title, err)
	}
	return nil
}

func (d *run) summary() {
	fmt.Fprintf(d.out, "\n== summary\n")
	w := tabwriter.NewWriter(d.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "#\tSTAGE\tRESULT\tTIME\tWHAT HAPPENED")
	for i, s := range d.stages {
		r := "ok"
		if !s.ok {
			r = "FAILED"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i+1, s.title, r, dur(s.dur), truncRunes(firstLine(s.detail), 90))
	}
	fmt.Fprintf(w, "\ttotal\t\t%s\t\n", dur(time.Since(d.start)))
	_ = w.Flush()
}

// startGateway runs this executable's gateway mode as a child process on the temp data dir.
func (d *run) startGateway(ctx context.Context) (string, error) {
	exe := d.o.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return "", err
		}
	}
	script := filepath.Join(d.tmp, "script.json")
	var err error
	if d.o.Script != "" {
		if script, err = filepath.Abs(d.o.Script); err != nil {
			return "", err
		}
		if _, err := os.Stat(script); err != nil {
			return "", fmt.Errorf("--script: %w", err)
		}
	} else if err := os.WriteFile(script, []byte(builtinScript), 0o600); err != nil {
		return "", err
	}
	d.exe = exe
	cfgPath := filepath.Join(d.tmp, "gateway.yaml")
	spawner := filepath.Join(d.tmp, "spawner-script.json")
	if err := os.WriteFile(spawner, []byte(spawnScript), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(gatewayConfig, d.tmp, script, spawner)), 0o600); err != nil {
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
	models, err := d.c.Models(ctx)
	if err != nil {
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

func (d *run) stopGateway(ctx context.Context) (string, error) {
	pid := d.gw.Process.Pid
	if err := d.stopGatewayProcess(ctx); err != nil {
		return "", err
	}
	if d.gwErr != nil {
		return "", fmt.Errorf("gateway pid %d exited with %v", pid, d.gwErr)
	}
	if live := local.LiveBoxes(d.boxes()); len(live) > 0 {
		return "", fmt.Errorf("box processes still running: %v", live)
	}
	if left := d.liveWorkers(); len(left) > 0 {
		return "", fmt.Errorf("worker processes still running: %v", left)
	}
	return fmt.Sprintf("gateway pid %d stopped cleanly (SIGTERM); no box process left", pid), nil
}

// keepGateway is the last stage with --keep: the gateway stays up (its own process group, its
// log in the temp dir), with no box or worker process left from the destroyed environment.
func (d *run) keepGateway(ctx context.Context) (string, error) {
	select {
	case <-d.gwDone:
		return "", fmt.Errorf("gateway pid %d exited: %v", d.gw.Process.Pid, d.gwErr)
	default:
	}
	if _, err := d.c.Gateway(ctx); err != nil {
		return "", fmt.Errorf("gateway at %s: %w", d.c.BaseURL, err)
	}
	if live := local.LiveBoxes(d.boxes()); len(live) > 0 {
		return "", fmt.Errorf("box processes still running: %v", live)
	}
	if left := d.liveWorkers(); len(left) > 0 {
		return "", fmt.Errorf("worker processes still running: %v", left)
	}
	return fmt.Sprintf("gateway pid %d left running at %s; no box process left", d.gw.Process.Pid, d.c.BaseURL), nil
}

// SignInLink mints a one-time sign-in link of the Control UI with c's operator token (what
// `openclaw ui` prints).
func SignInLink(ctx context.Context, c *api.Client) (string, error) {
	code, err := c.MintSignInCode(ctx)
	if err != nil {
		return "", err
	}
	return c.BaseURL + code.Path, nil
}

// stopGatewayProcess sends SIGTERM, then SIGKILL after 15s, and waits for the exit.
func (d *run) stopGatewayProcess(ctx context.Context) error {
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
func (d *run) cleanup(ctx context.Context) {
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
		if v, err := d.c.Placement(ctx, d.sessionID); err == nil {
			d.envID = v.Placement.EnvironmentID
		}
	}
	if gwAlive && d.c != nil && d.envID != "" && !d.destroyed {
		e, err := d.c.DestroyEnvironment(ctx, d.envID, api.DestroyOptions{Force: true, Wait: 30 * time.Second})
		fmt.Fprintf(d.out, "   destroy environment %s: state %s %v\n", d.envID, console.Dash(string(e.State)), errOrEmpty(err))
	}
	if err := d.stopGatewayProcess(ctx); err != nil {
		fmt.Fprintf(d.out, "   %v\n", err)
	} else if d.gw != nil {
		fmt.Fprintf(d.out, "   gateway pid %d stopped\n", d.gw.Process.Pid)
	}
	// Worker processes are detached from their box: end them by their pidfiles, then the boxes.
	for _, pid := range d.liveWorkers() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		fmt.Fprintf(d.out, "   killed worker pid %d\n", pid)
	}
	for dir, pid := range local.LiveBoxes(d.boxes()) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if waitGone(ctx, map[string]int{dir: pid}, 3*time.Second) != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		fmt.Fprintf(d.out, "   stopped box pid %d (%s)\n", pid, dir)
	}
	if live := local.LiveBoxes(d.boxes()); len(live) > 0 {
		fmt.Fprintf(d.out, "   box processes still running: %v\n", live)
	}
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

// truncRunes cuts s to n runes, never inside a character.
func truncRunes(s string, n int) string {
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

func dur(d time.Duration) string {
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
