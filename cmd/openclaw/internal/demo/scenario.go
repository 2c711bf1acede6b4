package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/spend"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers/local"
)

// The demo's workspace and what its scripted turn must do to it. builtinScript is the built-in copy
// of examples/demo/script.json (keep the two alike); --script runs another one, whose turn the
// checks still expect to commit greetingAfter into greetingFile.
const (
	greetingFile   = "greeting.txt"
	greetingBefore = "Hello, world!"
	greetingAfter  = "Hello from a cloud worker!"
	message        = "Make greeting.txt say where it ran, commit that, and run the project's check."
	builtinScript  = `[
  {"text": "I'll read the greeting first.", "toolCalls": [{"name": "read", "arguments": {"path": "greeting.txt"}}]},
  {"text": "Now I'll say where this ran.", "toolCalls": [{"name": "edit", "arguments": {"path": "greeting.txt", "edits": [{"oldText": "Hello, world!", "newText": "Hello from a cloud worker!"}]}}]},
  {"text": "Committing the change on the managed branch.", "toolCalls": [{"name": "exec", "arguments": {"command": "git add greeting.txt && git commit -q -m 'greeting: say where it ran' && git log --oneline -1"}}]},
  {"text": "Running the project's check.", "toolCalls": [{"name": "exec", "arguments": {"command": "sh check.sh && git status --short | wc -l"}}]},
  {"text": "Done: greeting.txt now says where it ran, the change is committed, and check.sh passes."}
]
`
	gatewayConfig = `# written by openclaw demo
tunnel: {keepaliveInterval: 1s, keepaliveTimeout: 5s, backoffMax: 1s}
worker: {heartbeatTimeout: 3s, relaunchGrace: 1s, admitTimeout: 30s}
agents: {defaultProfile: local}
# the identity of the worker's commits, set in the box repository
git: {author: {name: OpenClaw demo, email: demo@openclaw.invalid}}
# the demo's workspaces live in its temp dir, outside the home directory (the default root)
workspaces: {roots: [%q]}
models:
  default: demo/demo
  providers:
    demo: {api: scripted, script: %q, models: [{id: demo, cost: {input: 3, output: 15}}]}
    spawner: {api: scripted, script: %q, models: [{id: demo, cost: {input: 3, output: 15}}]}
# the built-in local profile, publishing with the forge credential the demo sets, priced as if
# its boxes were small cloud machines (the spend ledger charges their leased time)
profiles:
  - id: local
    provider: local
    hygiene: {metadataRoute: warn, dockerSocket: warn}
    publish: {credential: forge}
    price: {perHour: 0.05, minimumMinutes: 1}
# one budget for machines and model calls together (openclaw budget list)
budgets:
  - {id: demo-day, scope: gateway, window: day, limitUsd: 5}
`
	// forgeUser and forgeToken are the demo forge's HTTPS credential (a GitHub-style token shape).
	forgeUser  = "x-access-token"
	forgeToken = "ghs_openclawDemoForgeToken0123456789ab"
)

// files is the user's project: a greeting and a check that passes only once the greeting
// says where it ran.
var files = map[string]string{
	"README.md":    "# demo project\n\nA checkout that `openclaw demo` hands to a cloud worker.\n",
	greetingFile:   greetingBefore + "\n",
	"check.sh":     "#!/bin/sh\n# the project's check: the greeting must say where it ran\ngrep -q 'cloud worker' " + greetingFile + " && echo \"check passed: $(cat " + greetingFile + ")\"\n",
	".gitignore":   "*.log\n",
	"docs/plan.md": "1. say where it ran\n",
}

// git runs git in dir with a clean environment (no system or user config) and returns its output.
func (d *run) git(ctx context.Context, dir string, args ...string) (string, error) {
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

func (d *run) createWorkspace(ctx context.Context) (string, error) {
	for name, content := range files {
		p := filepath.Join(d.ws, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	// The project's forge: a real smart-HTTP git server on loopback, where main already is.
	f, err := gitforge.Start(filepath.Join(d.tmp, "forge"), forgeUser, forgeToken)
	if err != nil {
		return "", err
	}
	d.forge = f
	if d.forgeRepo, d.forgeURL, err = f.Init(ctx, "demo/project.git"); err != nil {
		return "", err
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"symbolic-ref", "HEAD", "refs/heads/main"},
		{"add", "-A"},
		{"commit", "-q", "-m", "initial commit"},
		{"remote", "add", "origin", d.forgeURL},
		{"-c", "credential.helper=", "-c", "credential.helper=!f() { echo username=" + forgeUser + "; echo password=" + forgeToken + "; }; f", "push", "-q", "origin", "main"},
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
	return fmt.Sprintf("%s: %d files committed on main at %s, origin %s (a git http-backend forge)", d.ws, len(files), short12(d.base), d.forgeURL), nil
}

// publish sets the forge's token as a git credential through the CLI, publishes the session's
// branch with `openclaw session publish`, and checks the forge has it at the managed branch's tip.
func (d *run) publish(ctx context.Context) (string, error) {
	gwAddr := strings.TrimPrefix(d.c.BaseURL, "http://")
	cli := func(stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, d.exe, append(args, "--gateway", gwAddr, "--data-dir", d.data)...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), "HOME="+d.home)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("openclaw %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return strings.TrimSpace(string(out)), nil
	}
	fmt.Fprintf(d.out, "   $ printf %%s \"$FORGE_TOKEN\" | openclaw credential set forge --git-token\n")
	out, err := cli(forgeToken, "credential", "set", "forge", "--git-token")
	if err != nil {
		return "", err
	}
	printIndented(d.out, "   ", out)
	fmt.Fprintf(d.out, "   $ openclaw session publish %s\n", d.sessionID)
	if out, err = cli("", "session", "publish", d.sessionID); err != nil {
		return "", err
	}
	printIndented(d.out, "   ", out)
	ref := "refs/heads/" + d.branch
	tip, err := d.git(ctx, d.anchor, "rev-parse", d.branch)
	if err != nil {
		return "", err
	}
	pushed, err := gitforge.Git(ctx, "-C", d.forgeRepo, "rev-parse", ref)
	if err != nil {
		return "", fmt.Errorf("the forge has no %s: %w", ref, err)
	}
	if pushed != strings.TrimSpace(tip) {
		return "", fmt.Errorf("the forge has %s at %s, the managed branch is at %s", ref, short12(pushed), short12(tip))
	}
	if d.forge.Authed.Load() == 0 {
		return "", errors.New("the forge saw no authenticated request")
	}
	return fmt.Sprintf("pushed %s at %s to %s with the gateway's token", ref, short12(pushed), d.forgeURL), nil
}

func (d *run) startSession(ctx context.Context) (string, error) {
	ses, err := d.c.CreateSession(ctx, sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: "openclaw demo", Workspace: d.ws}})
	if err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	d.sessionID = ses.ID
	fmt.Fprintf(d.out, "   session %s on %s; dispatching to profile local:\n", ses.ID, d.ws)
	v, err := d.movePlacement(ctx, "dispatch", placement.Active, func() error {
		_, err := d.c.Dispatch(ctx, ses.ID, placement.DispatchRequest{ProfileID: "local"})
		return err
	})
	if err != nil {
		return "", err
	}
	d.envID = v.Placement.EnvironmentID
	ev, err := d.c.Environment(ctx, d.envID)
	if err != nil {
		return "", err
	}
	e := ev.Environment
	d.leaseID = e.LeaseID
	if st, err := local.ReadState(local.BoxDir(d.boxes(), e.LeaseID)); err == nil && st.PID > 0 {
		d.pids["box"] = st.PID
	}
	if pid, err := readPIDFile(bootstrap.WorkerPIDPath(e.WorkerHome, e.ID)); err == nil {
		d.pids["worker"] = pid
	}
	if d.pids["box"] == 0 || d.pids["worker"] == 0 {
		return "", fmt.Errorf("environment %s is %s, but its box or worker process is not to be found (%v)", e.ID, e.State, d.pids)
	}
	return fmt.Sprintf("placement active on environment %s (lease %s, box pid %d, worker pid %d, %s sync)",
		d.envID, e.LeaseID, d.pids["box"], d.pids["worker"], v.Placement.SyncMode), nil
}

// boxes is the directory of the gateway's local boxes.
func (d *run) boxes() string { return local.BoxesDir(d.data) }

// movePlacement asks for the placement change what with ask, prints the steps the placement takes
// until it settles, and checks that it settled in want.
func (d *run) movePlacement(ctx context.Context, what string, want placement.State, ask func() error) (api.PlacementView, error) {
	skip := d.placementSteps(ctx)
	if err := ask(); err != nil {
		return api.PlacementView{}, fmt.Errorf("%s: %w", what, err)
	}
	v, err := d.c.WaitPlacement(ctx, d.sessionID, skip, console.PlacementSteps(d.o.Err))
	if err != nil {
		return v, err
	}
	if v.Placement.State != want {
		return v, fmt.Errorf("%s ended %s, not %s: %s", what, v.Placement.State, want, v.Placement.Error)
	}
	return v, nil
}

// placementSteps counts the steps the session's placement has taken (0 when it cannot be read).
func (d *run) placementSteps(ctx context.Context) int {
	v, _ := d.c.Placement(ctx, d.sessionID)
	return len(v.Events)
}

// runTurn sends the message and streams the turn as `session send --follow` does.
func (d *run) runTurn(ctx context.Context) (string, error) {
	t, err := d.c.SendMessage(ctx, d.sessionID, turns.SendRequest{Text: message})
	if err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	if t.Placement != "worker" {
		return "", fmt.Errorf("turn %s was admitted with placement %q, not on the worker", t.RunID, t.Placement)
	}
	fmt.Fprintf(d.out, "   > %s\n", message)
	p := &console.Printer{Out: d.out, Info: d.out}
	tools, toolErrors := 0, 0
	outcome, err := p.FollowTurn(ctx, d.c, d.sessionID, t.RunID, t.Cursor, func(r *sessions.LiveRecord) {
		if r.Event.Type == protocol.LiveToolResult {
			tools++
			if r.Event.IsError {
				toolErrors++
			}
		}
	})
	if err != nil {
		return "", err
	}
	if outcome.Event.Type != protocol.LiveLifecycleEnd {
		return "", fmt.Errorf("turn %s ended %s: %s", t.RunID, outcome.Event.Type, outcome.Event.Error)
	}
	if toolErrors > 0 {
		return "", fmt.Errorf("turn %s ended, but %d of its %d tool calls failed", t.RunID, toolErrors, tools)
	}
	// The turn row records the outcome right after the live event: wait for it.
	var done turns.Turn
	for deadline := time.Now().Add(10 * time.Second); ; {
		if done, err = d.c.Turn(ctx, t.RunID); err != nil {
			return "", err
		}
		if !done.Status.Ongoing() || time.Now().After(deadline) {
			break
		}
		if err := clock.Sleep(ctx, clock.Real, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
	if done.Status != turns.TurnDone {
		return "", fmt.Errorf("turn %s is %s: %s", t.RunID, done.Status, done.Error)
	}
	wi, err := d.c.EnvironmentWorker(ctx, d.envID)
	if err != nil {
		return "", err
	}
	if wi.Inference.Calls == 0 {
		return "", fmt.Errorf("no model call of environment %s went through the gateway's proxy", d.envID)
	}
	return fmt.Sprintf("turn %s %s (%s) on the worker: %d tool calls, %d model calls proxied by the gateway",
		t.RunID, outcome.Event.Type, done.Status, tools, wi.Inference.Calls), nil
}

func (d *run) pullBack(ctx context.Context) (string, error) {
	v, err := d.movePlacement(ctx, "pull-back", placement.Local, func() error {
		_, err := d.c.PullBack(ctx, d.sessionID, placement.PullBackRequest{})
		return err
	})
	if err != nil {
		return "", err
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
func (d *run) showBranch(ctx context.Context) (string, error) {
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
	content, err := d.git(ctx, d.anchor, "show", d.branch+":"+greetingFile)
	if err != nil {
		return "", err
	}
	if !strings.Contains(content, greetingAfter) || strings.Contains(content, greetingBefore) {
		return "", fmt.Errorf("%s on %s reads %q, want the edit %q", greetingFile, d.branch, strings.TrimSpace(content), greetingAfter)
	}
	onDisk, err := os.ReadFile(filepath.Join(d.anchor, greetingFile))
	if err != nil {
		return "", err
	}
	if string(onDisk) != content {
		return "", fmt.Errorf("%s in the pulled-back workspace differs from %s", greetingFile, d.branch)
	}
	tip, _ := d.git(ctx, d.anchor, "rev-parse", "--short=12", d.branch)
	return fmt.Sprintf("%s fast-forwarded %s → %s (%d commit); %s now reads %q",
		d.branch, short12(d.base), strings.TrimSpace(tip), count, greetingFile, strings.TrimSpace(content)), nil
}

// checkCheckout checks the user's checkout: same branch, same commit, same files, nothing staged.
func (d *run) checkCheckout(ctx context.Context) (string, error) {
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
func (d *run) destroy(ctx context.Context) (string, error) {
	e, err := d.c.DestroyEnvironment(ctx, d.envID, api.DestroyOptions{Wait: 60 * time.Second})
	if err != nil {
		return "", fmt.Errorf("destroy %s: %w", d.envID, err)
	}
	evs, _ := d.c.EnvironmentEvents(ctx, d.envID)
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
	boxDir := local.BoxDir(d.boxes(), d.leaseID)
	if _, err := os.Stat(boxDir); !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("box directory %s is still there", boxDir)
	}
	if live := local.LiveBoxes(d.boxes()); len(live) > 0 {
		return "", fmt.Errorf("box processes still running: %v", live)
	}
	return fmt.Sprintf("environment %s destroyed, provider confirmed; box pid %d and worker pid %d gone, box directory removed",
		d.envID, d.pids["box"], d.pids["worker"]), nil
}

// spend reports the demo's spend from the ledger (openclaw usage --by kind) and its budget.
func (d *run) spend(ctx context.Context) (string, error) {
	rows, err := d.c.Usage(ctx, "kind", "")
	if err != nil {
		return "", fmt.Errorf("usage: %w", err)
	}
	var models, machines spend.UsageRow
	for _, r := range rows {
		if r.Key == spend.KindModel {
			models = r
		} else {
			machines = r
		}
	}
	fmt.Fprintf(d.out, "   models:   $%.4f  (%d calls, %d tokens in, %d out, %d cache reads)\n", models.USD, models.Calls, models.InputTokens, models.OutputTokens, models.CacheReadTokens)
	fmt.Fprintf(d.out, "   machines: $%.4f  (%s of leased time at $0.05/h, at least a minute each)\n", machines.USD, (time.Duration(machines.MachineSeconds) * time.Second).Round(time.Second))
	if models.Calls == 0 {
		return "", errors.New("the ledger has no model call")
	}
	if machines.USD <= 0 {
		return "", errors.New("the ledger has no machine time")
	}
	bs, err := d.c.Budgets(ctx)
	if err != nil || len(bs) != 1 {
		return "", fmt.Errorf("budgets: %v %v", bs, err)
	}
	fmt.Fprintf(d.out, "   budget %s: $%.4f of $%.2f spent today (resets %s)\n", bs[0].ID, bs[0].SpentUSD, bs[0].LimitUSD, bs[0].ResetAt.Local().Format("Jan 2 15:04"))
	return fmt.Sprintf("spent $%.4f: $%.4f on model calls, $%.4f on machines (openclaw usage)", models.USD+machines.USD, models.USD, machines.USD), nil
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
