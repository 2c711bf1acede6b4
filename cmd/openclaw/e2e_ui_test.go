package main_test

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/browsertest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// rootRel is the repository root seen from this package (screenshots go to docs/ there).
const rootRel = "../.."

// uiScript is the worker session's script: a first turn that writes a file, then waits in a
// command for the test to release it (so the test can reload mid-turn) and commits; a second
// turn whose command never ends until it is stopped (and a third, canceled by a pull-back); a
// fourth that waits for the file live, then runs a second command, after its session moved live.
func uiScript(release, never string) string {
	return fmt.Sprintf(`[
  {"text": "Writing the file.", "toolCalls": [{"name": "write", "arguments": {"path": "hello.txt", "content": "hi\n"}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "while [ ! -e %s ]; do sleep 0.05; done; git add hello.txt && git -c user.name=w -c user.email=w@example.com commit -qm 'worker commit' && echo committed", "timeout": 120}}]},
  {"thinking": "Check for notes.", "toolCalls": [{"name": "read", "arguments": {"path": "missing-notes.txt"}}]},
  {"text": "All done here."},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "while [ ! -e %[2]s ]; do sleep 0.05; done", "timeout": 120}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "while [ ! -e %[2]s ]; do sleep 0.05; done", "timeout": 120}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "while [ ! -e %[2]s.live ]; do sleep 0.05; done", "timeout": 120}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "echo moved > moved-live.txt", "timeout": 60}}]},
  {"text": "Went on after the move."}
]`, release, never)
}

// TestControlUIInChromium drives the Control UI in Debian's Chromium against a real gateway with
// the built-in local box and the scripted model: sign in through `openclaw ui`, create a worker
// session from the UI and watch its badge reach running, stream a turn and reload in the middle
// of it (nothing lost, nothing doubled), stop a turn, pull back and see the worker's commit,
// destroy the environment, and get a bad profile's field named.
func TestControlUIInChromium(t *testing.T) {
	testenv.RequireCommands(t, "chromium", "git")
	browser := browsertest.Start(t)
	root := t.TempDir()
	release, never := filepath.Join(root, "release"), filepath.Join(root, "never")
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedPriced(t, root, "ui", uiScript(release, never), "cost: {input: 3, output: 15}")+
		// warns from its first hundredth of a cent: the page shows the warning banner
		"budgets:\n  - {id: ui-day, scope: gateway, window: day, limitUsd: 10, warnAt: 0.00001}\n")
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "project")
	testenv.InitRepo(t, ws, "initial", map[string]string{"README.md": "hello\n"})
	base := "http://" + g.addr

	// Sign in with the link `openclaw ui` prints, in a browser context of its own.
	out, err := exec.Command(openclawBin, "ui", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
	if err != nil {
		t.Fatalf("openclaw ui: %v", err)
	}
	// a link that would not work is not printed: a wrong token, or no gateway at the address
	if out, err := exec.Command(openclawBin, "ui", "--gateway", g.addr, "--token", "wrong").CombinedOutput(); err == nil || strings.Contains(string(out), "login?") ||
		!strings.Contains(string(out), "unauthorized") {
		t.Fatalf("openclaw ui with a wrong token: %v %s", err, out)
	}
	if out, err := exec.Command(openclawBin, "ui", "--gateway", freeAddr(t), "--token", "x").CombinedOutput(); err == nil || strings.Contains(string(out), "login?") ||
		!strings.Contains(string(out), "gateway at http://127.0.0.1:") {
		t.Fatalf("openclaw ui without a gateway: %v %s", err, out)
	}
	link := strings.TrimSpace(string(out))
	if !strings.HasPrefix(link, base+"/login?code=") || strings.Contains(link, g.client.Token) {
		t.Fatalf("openclaw ui printed %q, want %s/login?code=… (never the token)", link, base)
	}
	fresh := browsertest.NewPage(t, browser, "signin", true)
	fresh.Do("open the sign-in form", chromedp.Navigate(base+"/"), chromedp.WaitVisible(`input#code`))
	if label := browsertest.Eval[string](fresh, `document.querySelector('label[for=code]').textContent`); label != "Sign-in code" {
		t.Fatalf("sign-in field labelled %q", label)
	}
	fresh.Shot(rootRel, "login")
	// the old link form, with the operator token, is refused and says how to sign in
	fresh.Do("the old token link", chromedp.Navigate(base+"/login?token="+g.client.Token), chromedp.WaitVisible(`.error`))
	if msg := browsertest.Eval[string](fresh, `document.querySelector('.error').textContent`); !strings.Contains(msg, "openclaw ui") {
		t.Fatalf("the old token link says %q, want how to sign in", msg)
	}
	p := browsertest.NewPage(t, browser, "main", true)
	p.Do("sign in", chromedp.Navigate(link), chromedp.WaitVisible(`#session-list-status`))
	if loc := browsertest.Eval[string](p, `location.href`); loc != base+"/" {
		t.Fatalf("after sign-in the address is %q, want %s/ (no code)", loc, base)
	}
	if c := browsertest.Eval[string](p, `document.cookie`); c != "" {
		t.Fatalf("page script can read cookies %q (the session cookie must be HttpOnly)", c)
	}
	// the link signs in once: in another browser context it is refused
	fresh.Do("the used link", chromedp.Navigate(link), chromedp.WaitVisible(`.error`))
	if msg := browsertest.Eval[string](fresh, `document.querySelector('.error').textContent`); !strings.Contains(msg, "already used") {
		t.Fatalf("the used link says %q", msg)
	}
	// `openclaw ui sessions` lists the browser's session
	if out, err := exec.Command(openclawBin, "ui", "sessions", "--gateway", g.addr, "--data-dir", g.dataDir, "-o", "json").Output(); err != nil ||
		strings.Count(string(out), `"state": "active"`) != 1 {
		t.Fatalf("openclaw ui sessions: %v %s", err, out)
	}

	// The list follows the gateway-wide feed: a session created elsewhere appears without a reload.
	if _, err := g.do("POST", "/api/v1/sessions", map[string]string{"title": "from the CLI"}, nil); err != nil {
		t.Fatal(err)
	}
	p.Until("the new session in the list", browsertest.TextCount("#session-list .session-title", "from the CLI")+` === 1`)

	// A new worker session on the local profile: the badge walks the placement states to running.
	p.Do("open New session", chromedp.Click(`a[href="/new"]`), chromedp.WaitVisible(`button.target[data-profile=local]`),
		chromedp.WaitReady(`#model option`))
	p.Do("fill in", chromedp.SetValue(`#workspace`, ws), chromedp.Click(`#git`), chromedp.SetValue(`#title`, "ui worker"),
		chromedp.Click(`button.target[data-profile=local]`))
	_ = browsertest.Eval[bool](p, `(() => { window.__badges = [];
		new MutationObserver(() => { const b = document.querySelector('#session-list .badge'); if (b && window.__badges.at(-1) !== b.textContent) window.__badges.push(b.textContent); })
			.observe(document.getElementById('session-list'), {subtree: true, childList: true, characterData: true}); return true })()`)
	p.Do("create", chromedp.Click(`#create`))
	p.Until("the badge says running", `document.querySelector('#session-list .badge')?.textContent === 'running'`)
	p.Until("the steps reach active", `document.querySelector('#create-steps li[data-to=active]') !== null`)
	badges := browsertest.Eval[[]string](p, `window.__badges`)
	order := map[string]int{"provisioning": 1, "syncing": 2, "starting": 3, "running": 4}
	if len(badges) < 2 || badges[len(badges)-1] != "running" {
		t.Fatalf("badge went %v: want at least one placement step before running", badges)
	}
	for i := 1; i < len(badges); i++ {
		if order[badges[i]] <= order[badges[i-1]] {
			t.Fatalf("badge went %v: out of placement order", badges)
		}
	}
	p.Shot(rootRel, "new-session")
	id := browsertest.Eval[string](p, `[...document.querySelectorAll('#session-list li')].find(l => l.textContent.includes('ui worker')).dataset.session`)

	// The chat view: send, stream, reload mid-turn.
	p.Do("open the session", chromedp.Click(`#open-session`), chromedp.WaitVisible(`#message`))
	p.Until("the header says where it runs", `document.getElementById('runs-on').textContent.startsWith('Runs on worker · local · env_')`)
	if got := browsertest.Eval[string](p, `document.querySelector('label[for=message]').textContent`); got != "Message" {
		t.Fatalf("message field labelled %q", got)
	}
	p.Do("send", chromedp.SetValue(`#message`, "do the work"), chromedp.Click(`#send`))
	liveExec := `[...document.querySelectorAll('#live .tool')].some(r => r.querySelector('.tool-name').textContent === 'exec' && r.querySelector('.tool-status').textContent === 'running')`
	p.Until("the streamed text and a running exec row", liveExec+` && `+browsertest.TextCount("#live .text", "Writing the file.")+` === 1`)
	if !browsertest.Eval[bool](p, `document.getElementById('send').disabled && !document.getElementById('stop').disabled`) {
		t.Fatal("while the turn runs, Send must be disabled and Stop enabled")
	}
	counts := `JSON.stringify({text: ` + browsertest.TextCount("main .text", "Writing the file.") + `, write: ` + browsertest.TextCount("main .tool .tool-name", "write") +
		`, exec: ` + browsertest.TextCount("main .tool .tool-name", "exec") + `, user: ` + browsertest.TextCount("main .msg.user", "do the work") + `})`
	before := browsertest.Eval[string](p, counts)
	p.Shot(rootRel, "chat-streaming")
	p.Do("reload mid-turn", chromedp.Reload(), chromedp.WaitVisible(`#message`))
	p.Until("the replayed turn", liveExec+` && `+browsertest.TextCount("#live .text", "Writing the file.")+` === 1 && `+browsertest.TextCount("main .msg.user", "do the work")+` === 1`)
	if after := browsertest.Eval[string](p, counts); after != before || before != `{"text":1,"write":1,"exec":1,"user":1}` {
		t.Fatalf("before the reload the page showed %s, after it %s: want each once", before, after)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Until("the turn ends", `document.body.dataset.turn === 'idle' && `+browsertest.TextCount("#transcript .text", "All done here.")+` === 1`)
	p.Until("the budget's warning, from the gateway-wide feed", `!document.getElementById('budget-warning').hidden && document.getElementById('budget-warning').textContent.includes('Budget ui-day has spent $0.')`)
	if got := browsertest.Eval[string](p, counts); got != `{"text":1,"write":1,"exec":1,"user":1}` {
		t.Fatalf("after the turn the page shows %s: want each once", got)
	}
	if res := browsertest.Eval[string](p, `[...document.querySelectorAll('#transcript .tool')].find(r => r.querySelector('.tool-name').textContent === 'exec').querySelector('.tool-result').textContent`); !strings.Contains(res, "committed") {
		t.Fatalf("exec row result %q", res)
	}
	if !browsertest.Eval[bool](p, `(() => { const d = document.querySelector('#transcript details.thinking'); return !!d && !d.open && d.textContent.includes('Check for notes.') })()`) {
		t.Fatal("the thinking is not shown collapsed")
	}
	if got := browsertest.Eval[string](p, `(() => { const r = [...document.querySelectorAll('#transcript .tool')].find(r => r.querySelector('.tool-name').textContent === 'read'); return r ? r.className + ' ' + r.querySelector('.tool-status').textContent : 'none' })()`); got != "tool tool-error error" {
		t.Fatalf("the failing read's row: %q, want it marked as an error", got)
	}
	p.Shot(rootRel, "chat")

	// After a worker turn the gateway takes a checkpoint; Send waits for it.
	p.Until("the checkpoint", `document.getElementById('checkpoint').textContent.startsWith('Last checkpoint 1:') && !document.getElementById('send').disabled`)

	// Stop: a turn that would never end is cancelled from the page.
	p.Do("send again", chromedp.SetValue(`#message`, "wait forever"), chromedp.Click(`#send`))
	p.Until("the second turn runs its command", liveExec)
	p.Do("stop", chromedp.Click(`#stop`))
	p.Until("the turn is over", `document.body.dataset.turn === 'idle' && !document.getElementById('send').disabled`)
	for _, tr := range g.turns(id) {
		if tr.Status == turns.TurnRunning {
			t.Fatalf("turn %s still running after Stop", tr.RunID)
		}
	}

	// Pull back: the steps pass and the worker's commit is named.
	p.Until("Pull back is offered", `!document.getElementById('pullback').hidden`)
	envID := browsertest.Eval[string](p, `document.getElementById('runs-on').dataset.env`)
	p.Do("pull back", chromedp.Click(`#pullback`))
	p.Until("what came back", `document.querySelector('#came-back .commits li') !== null`)
	tip := testenv.Git(t, ws, "rev-parse", "openclaw/"+strings.TrimPrefix(id, "ses_"))
	if got := browsertest.Eval[string](p, `[...document.querySelectorAll('#came-back .commits li')].map(l => l.dataset.commit + ' ' + l.textContent).join('|')`); !strings.HasPrefix(got, tip+" "+tip[:12]+" worker commit") || strings.Contains(got, "|") {
		t.Fatalf("after pull-back the page lists the commits %q, want only the worker's commit %s", got, tip[:12])
	}
	if got := browsertest.Eval[string](p, `document.querySelector('#came-back .files').textContent`); got != "A hello.txt" {
		t.Fatalf("files of the commits: %q", got)
	}
	if got := testenv.Git(t, ws, "log", "-1", "--format=%s", tip); got != "worker commit" {
		t.Fatalf("branch tip %s is %q", tip, got)
	}
	p.Do("view the diff", chromedp.Click(`#came-back .commits a.diff-link`), chromedp.WaitVisible(`#diff`))
	p.Until("the diff", `document.getElementById('diff').textContent.includes('worker commit') && document.getElementById('diff').textContent.includes('+hi')`)
	p.Shot(rootRel, "diff")
	// the diff route shows only the worker's commits: the base, or anything that is not a commit id, is refused
	base0 := testenv.Git(t, ws, "rev-parse", "main")
	for _, bad := range []string{base0, "--output=" + filepath.Join(root, "x"), strings.Repeat("g", 40)} {
		if code, err := g.do("GET", "/api/v1/sessions/"+id+"/changes/"+url.PathEscape(bad), nil, nil); err == nil || (code != 404 && code != 400) {
			t.Fatalf("diff of %q: %d %v, want 404 or 400", bad, code, err)
		}
	}
	if exists(filepath.Join(root, "x")) {
		t.Fatal("a diff request wrote a file")
	}
	p.Do("back", chromedp.NavigateBack(), chromedp.WaitVisible(`#message`))
	p.Until("runs on gateway", `document.getElementById('runs-on').textContent.startsWith('Runs on gateway')`)
	if steps := browsertest.Eval[string](p, `[...document.querySelectorAll('#steps li[data-to]')].map(l => l.dataset.to).join(',')`); steps != "draining,reconciling,local" {
		t.Fatalf("pull-back steps %q", steps)
	}
	p.Shot(rootRel, "pulled-back")

	// Move to worker: the session goes back out (to the warm environment) and returns again.
	p.Do("move to worker", chromedp.SetValue(`#move-profile`, "local"), chromedp.Click(`#move`))
	p.Until("running again", `document.querySelector('#runs-on .badge')?.textContent === 'running' && document.querySelector('#steps li[data-to=active]') !== null`)
	if steps := browsertest.Eval[string](p, `[...document.querySelectorAll('#steps li[data-to]')].map(l => l.dataset.to).join(',')`); !strings.HasPrefix(steps, "requested,provisioning,syncing,starting,active") {
		t.Fatalf("dispatch steps %q", steps)
	}
	// A pull-back while a turn runs: the page asks what becomes of the turn; "is stopped" cancels it.
	if !browsertest.Eval[bool](p, `document.getElementById('move-busy').hidden`) {
		t.Fatal("the running-turn choice shows while no turn runs")
	}
	p.Do("send a turn that waits", chromedp.SetValue(`#message`, "wait again"), chromedp.Click(`#send`))
	p.Until("the turn runs its command", liveExec+` && !document.getElementById('move-busy').hidden`)
	p.Do("pull back again, stopping the turn", chromedp.SetValue(`#move-busy`, "cancel"), chromedp.Click(`#pullback`))
	p.Until("back on the gateway", `document.getElementById('runs-on').textContent.startsWith('Runs on gateway') && document.querySelector('#came-back .commits') !== null`)
	if ts := g.turns(id); ts[len(ts)-1].Status != turns.TurnCanceled {
		t.Fatalf("the turn running at the pull-back ended %s, want canceled", ts[len(ts)-1].Status)
	}
	p.Until("the timeline names the canceled turn", browsertest.TextCount("#steps li", "barrier step 2: the running turn was canceled (policy cancel)")+` === 1`)

	// A live move: the running turn goes with the session to the worker and ends there.
	p.Do("send a turn to move live", chromedp.SetValue(`#message`, "move me live"), chromedp.Click(`#send`))
	p.Until("the turn runs its command", liveExec+` && !document.getElementById('move-busy').hidden`)
	p.Do("move to worker, live", chromedp.SetValue(`#move-profile`, "local"), chromedp.SetValue(`#move-busy`, "live"), chromedp.Click(`#move`))
	if err := os.WriteFile(never+".live", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Until("the turn went on on the worker", `document.body.dataset.turn === 'idle' && `+browsertest.TextCount("#transcript .text", "Went on after the move.")+` === 1`)
	liveTurn := g.turns(id)[len(g.turns(id))-1]
	if liveTurn.Status != turns.TurnDone || liveTurn.Placement != "worker" {
		t.Fatalf("the turn moved live ended %s on %s (%s), want done on the worker", liveTurn.Status, liveTurn.Placement, liveTurn.Error)
	}
	p.Until("runs on the worker", `document.getElementById('runs-on').textContent.startsWith('Runs on worker')`)
	p.Shot(rootRel, "chat-live-move")
	p.Do("pull back", chromedp.Click(`#pullback`))
	p.Until("back on the gateway", `document.getElementById('runs-on').textContent.startsWith('Runs on gateway') && document.getElementById('pullback').hidden`)

	// Environments: destroy the session's environment from its page.
	p.Do("environments", chromedp.Click(`a[href="/environments"]`), chromedp.WaitVisible(`#env-table tr[data-env=`+envID+`]`))
	p.Shot(rootRel, "environments")
	p.Do("open the environment", chromedp.Click(`tr[data-env=`+envID+`] a`), chromedp.WaitVisible(`#timeline li`))
	p.Shot(rootRel, "environment")
	p.Do("destroy", chromedp.Click(`#destroy`), chromedp.WaitVisible(`#confirm-destroy`), chromedp.Click(`#confirm-destroy`))
	p.Until("destroyed", `document.querySelector('dd[data-field=state]')?.textContent === 'destroyed'`)

	// Profiles: a bad value is named; a static profile shows its development-only warning.
	p.Do("profiles", chromedp.Click(`a[href="/profiles"]`), chromedp.WaitVisible(`#profile-list li[data-profile=local]`))
	p.Do("bad profile", chromedp.SetValue(`#profile-yaml`, "id: bad\nprovider: local\nlifetime: {idleTimeout: banana}\n"), chromedp.Click(`#save-profile`))
	p.Until("the named field", `document.querySelector('#profile-error .field')?.textContent === 'lifetime.idleTimeout: '`)
	p.Shot(rootRel, "profile-error")
	hostKey := tunneltest.HostKey(t)
	static := fmt.Sprintf("id: shared-host\nprovider: static\nsettings:\n  hosts:\n    - host: 198.18.0.10\n      user: worker\n      keyPath: %s\n      hostKey: %s\n", filepath.Join(root, "key"), hostKey)
	p.Do("static profile", chromedp.SetValue(`#profile-yaml`, static), chromedp.Click(`#save-profile`))
	p.Until("the static warning", `document.getElementById('profile-warning').textContent.includes('development only')`)
	p.Until("the list shows it", `document.querySelector('#profile-list li[data-profile=shared-host] .warn') !== null`)
	p.Shot(rootRel, "profiles")

	// A dispatch that fails names the reason and the recovery; Retry tries again once the
	// operator has fixed the profile.
	leases := filepath.Join(root, "leases")
	applyProfile := func(env map[string]string) {
		t.Helper()
		f := filepath.Join(root, "flaky.yaml")
		if err := os.WriteFile(f, []byte("profiles:\n"+leaseDirProfile("flaky", leases, env)), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(openclawBin, "profile", "apply", "-f", f, "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err != nil {
			t.Fatalf("profile apply: %v %s", err, out)
		}
	}
	applyProfile(map[string]string{"LEASE_DIR_WARMUP_FAIL": "no capacity in region"})
	p.Do("new session on the flaky profile", chromedp.Navigate(base+"/new"), chromedp.WaitVisible(`button.target[data-profile=flaky]`),
		chromedp.SetValue(`#workspace`, ws), chromedp.Click(`button.target[data-profile=flaky]`), chromedp.WaitVisible(`#machine-class`), chromedp.Click(`#create`))
	p.Until("the failure and Retry", `document.getElementById('create-error').textContent.includes('no capacity in region') && !document.getElementById('retry').hidden`)
	if got := browsertest.Eval[string](p, `document.getElementById('create-error').textContent`); !strings.Contains(got, "Recovery:") {
		t.Fatalf("failure without a recovery: %q", got)
	}
	p.Shot(rootRel, "new-session-failed")
	applyProfile(nil)
	p.Do("retry", chromedp.Click(`#retry`))
	p.Until("the retried dispatch is running", `document.querySelector('#create-steps li[data-to=active]') !== null && document.getElementById('retry').hidden`)

	// 390×844: the chat view fits the width (no sideways scrolling) and keeps its controls.
	// Usage: spend per day as stacked bars (today's model calls drawn), the budget's bar, the session on top.
	p.Do("usage", chromedp.Click(`a[href="/usage"]`), chromedp.WaitVisible(`#usage-chart svg`))
	today := time.Now().UTC().Format(time.DateOnly)
	p.Until("today's model calls in the chart", `(() => { const r = document.querySelector('#usage-chart rect[data-kind=model][data-day="`+today+`"]'); return !!r && +r.getAttribute('height') > 0 })()`)
	p.Until("the budget's bar", `(() => { const b = document.querySelector('#budgets li[data-budget=ui-day]'); return !!b && b.querySelector('.budget-figures').textContent.includes('of $10.00') && parseFloat(b.querySelector('.fill').style.width) > 0 })()`)
	p.Until("the session among the top ones", `document.querySelector('#usage-sessions tr[data-session="`+id+`"]') !== null`)
	if bars := browsertest.Eval[int](p, `document.querySelectorAll('#usage-chart rect[data-kind=model]').length`); bars != 30 {
		t.Fatalf("the chart has %d days, want 30", bars)
	}
	p.Shot(rootRel, "usage")
	p.Do("phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/sessions/"+id), chromedp.WaitVisible(`#send`))
	p.Until("the session's spend", `/^Spent \$0\.\d{4}/.test(document.getElementById('spend').textContent)`)
	p.Until("the transcript", browsertest.TextCount("#transcript .text", "All done here.")+` === 1`)
	if w := browsertest.Eval[int](p, `document.documentElement.scrollWidth`); w > 390 {
		t.Fatalf("at 390 px wide the page is %d px wide", w)
	}
	p.Shot(rootRel, "chat-phone")
	p.Do("home", chromedp.EmulateViewport(1280, 800), chromedp.Navigate(base+"/"), chromedp.WaitVisible(`#session-list .badge, #session-list li`))
	p.Shot(rootRel, "sessions")
}
