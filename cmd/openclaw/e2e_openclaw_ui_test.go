package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/openclaw/cloudworkers/gateway/inference/scripted"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/browsertest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// chromiumIn starts headless Chromium inside ns (OpenClaw's Control UI reaches for icons and a
// catalog by itself: it may only see ns's loopback) and returns a chromedp browser context. The
// DevTools protocol runs over the pipe chromedp gives the browser (file descriptors 3 and 4, which
// ip netns exec passes on), so nothing listens anywhere.
func chromiumIn(t *testing.T, ns string) context.Context {
	t.Helper()
	testenv.RequireCommands(t, "chromium")
	bin, err := testenv.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	profile := t.TempDir()
	tmp := filepath.Join(profile, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "chromium-in-netns")
	if err := os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", ns, bin)), 0o700); err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(wrapper), chromedp.UserDataDir(profile), chromedp.Env("TMPDIR=" + tmp),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints"),
		chromedp.Flag("window-size", "1280,800"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium in %s: %v", ns, err)
	}
	return bctx
}

// OpenClaw's own Control UI (from the pinned package), served by this gateway behind its sign-in,
// in Chromium inside a network namespace with only loopback: it signs in with a one-time code,
// lists our sessions with their placement, renders the history (with its tool call) of a worker
// session on the local box and of one on a netns sshd box, streams a sent message to its final answer, stops a running turn, dispatches a new
// session with Where → Cloud · local, another from a folder picked in the folder browser, lists
// and adds profiles in Settings → Cloud workers, lists
// the worker environments in Systems, and throws no exception.
func TestOpenClawControlUI(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	dir := clientsDir(t)
	ns := clientNetns(t)
	root := t.TempDir()
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, true)
	// a second worker session on a netns sshd box (real OpenSSH in a namespace of its own)
	netns, _ := netnsProfile(t)
	cfg := fastWorkerConfig + scriptedModels(t, root, map[string]string{"chat": clientsChatScript, "slow": clientsSlowScript}) +
		fmt.Sprintf("controlUi: {openclawRoot: %q}\nopenclawClients: {traceFile: %q}\n", filepath.Join(dir, "node_modules", "openclaw"), filepath.Join(root, "trace.jsonl")) + netns
	g := startGatewayIn(t, ns, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	sshdWS := filepath.Join(root, "sshd-repo")
	userWorkspace(t, sshdWS, true)
	sshdID, sshdEnvID := g.activeSession(sshdWS, "chat/m", "netns")
	g.runTurn(sshdID, "What does the README say?", "worker")
	slowID := g.newSession(ws, "slow/m") // older than the worker session: the home chat shows the newest
	workerID, envID := g.activeSession(ws, "chat/m", "local")
	g.runTurn(workerID, "What does the README say?", "worker")

	browser := chromiumIn(t, ns)
	p := browsertest.NewPage(t, browser, "openclaw-ui", false)
	var exceptions []string
	var mu sync.Mutex
	_ = chromedp.Listen(p.Ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			exceptions = append(exceptions, msg)
			mu.Unlock()
		}
	})
	code, err := g.client.MintSignInCode(g.ctx())
	if err != nil {
		t.Fatal(err)
	}
	p.Do("sign in with a one-time code, continuing to /openclaw/", chromedp.Navigate("http://"+g.addr+code.Path+"&next=/openclaw/"))
	p.Until("the worker session's history with its tool call",
		`document.body.innerText.includes("The README says hello.") && document.body.innerText.includes("Read") && document.body.innerText.includes("README.md")`)
	p.Until("the session in the sidebar", `document.body.innerText.includes("dispatch")`)
	p.Shot("../..", "openclaw-control-ui")
	// A message sent from the composer runs a turn on the worker and streams back.
	p.Do("send a message", chromedp.SendKeys(`textarea[aria-label="Chat composer"]`, "Anything else?\r"))
	waitPage(p, "the streamed reply", fmt.Sprintf(`document.body.innerText.includes(%q)`, scripted.Finished))
	ts := g.turns(workerID)
	if len(ts) != 2 || ts[1].Status != turns.TurnDone || ts[1].Placement != "worker" {
		t.Errorf("the worker session's turns after the UI's send: %+v, want a second one done on the worker", ts)
	}

	// The session on the netns sshd box opens with its history like the other.
	p.Do("open the sshd box's session", chromedp.Navigate("http://"+g.addr+"/openclaw/chat/main/"+sshdID))
	waitPage(p, "the sshd box session's history with its tool call", `document.body.innerText.includes("The README says hello.") && document.body.innerText.includes("README.md")`)

	// Stop generating ends a running turn: the tool's sleep is cut and the turn is canceled.
	p.Do("open the slow session", chromedp.Navigate("http://"+g.addr+"/openclaw/chat/main/"+slowID))
	waitPage(p, "the slow session's composer", `!!document.querySelector('textarea[aria-label="Chat composer"]')`)
	p.Do("send a long task", chromedp.SendKeys(`textarea[aria-label="Chat composer"]`, "Wait for a long time.\r"))
	waitPage(p, "the Stop generating button", `!!document.querySelector('button[aria-label="Stop generating"]')`)
	p.Do("stop it", chromedp.Click(`button[aria-label="Stop generating"]`))
	testenv.Eventually(t, "the slow turn canceled", func() bool {
		ts := g.turns(slowID)
		return len(ts) == 1 && ts[0].Status == turns.TurnCanceled
	})

	// New session → Where → Cloud · local: the session is made in a new workspace, dispatched to
	// a worker of profile local, and its first message runs there.
	before := map[string]bool{}
	list, err := g.client.Sessions(g.ctx())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		before[s.ID] = true
	}
	p.Do("open New session", chromedp.Navigate("http://"+g.addr+"/openclaw/new?agent=main"))
	waitPage(p, "the Where picker", `!!document.querySelector('button[aria-label="Where: Local"]')`)
	// The picker re-renders when the profile catalog arrives, which can swallow a click made
	// just before: choose again until the choice shows (bounded by waitPageDoing's deadline).
	waitPageDoing(p, "Where: local", `!!document.querySelector('button[aria-label="Where: local"]')`, func() {
		p.Do("open Where", chromedp.Click(`button[aria-label="Where: Local"]`))
		waitPage(p, "the cloud profile local in the picker", `[...document.querySelectorAll('button')].some(b => b.innerText.trim() === "local")`)
		p.Do("choose Cloud · local", chromedp.Click(`//button[normalize-space()="local"]`), chromedp.KeyEvent("\x1b"))
	})
	p.Do("type and start", chromedp.SendKeys(`textarea`, "What does the README say?"), chromedp.Click(`button[aria-label="Start session"]`))
	waitPage(p, "the dispatched session's reply", `document.body.innerText.includes("The README says hello.")`)
	var newID string
	testenv.Eventually(t, "the new session's turn done on a worker", func() bool {
		list, err := g.client.Sessions(g.ctx())
		if err != nil {
			return false
		}
		for _, s := range list {
			if !before[s.ID] {
				newID = s.ID
				ts := g.turns(s.ID)
				return len(ts) == 1 && ts[0].Status == turns.TurnDone && ts[0].Placement == "worker"
			}
		}
		return false
	})
	if pl := g.placement(newID).Placement; pl.State != "active" || pl.ProfileID != "local" || pl.EnvironmentID == "" || pl.EnvironmentID == envID {
		t.Errorf("the session made from Where → Cloud · local: placement %+v, want active on a new environment of profile local", pl)
	}

	// New session → Folder → Browse folders: the browser walks the directories inside the
	// workspace roots (from the first, /tmp here); the git checkout chosen is the new session's
	// workspace, dispatched (Where is still Cloud · local) to a worker where its first message runs.
	picked := filepath.Join(root, "picked")
	userWorkspace(t, picked, true)
	for _, s := range must(g.client.Sessions(g.ctx()))(t) {
		before[s.ID] = true
	}
	p.Do("open New session again", chromedp.Navigate("http://"+g.addr+"/openclaw/new?agent=main"))
	waitPage(p, "the folder picker", `!!document.querySelector('#new-session-project-trigger')`)
	waitPageDoing(p, "the folder browser", `!!document.querySelector('.new-session-page__browser')`, func() {
		p.Do("open Folder", chromedp.Click(`#new-session-project-trigger`))
		waitPage(p, "Browse folders", `!!document.querySelector('button[data-value="browse"]:not([disabled])')`)
		p.Do("choose Browse folders", chromedp.Click(`button[data-value="browse"]`))
	})
	for _, name := range strings.Split(strings.TrimPrefix(picked, filepath.Clean(os.TempDir())+"/"), "/") {
		entry := fmt.Sprintf(`[...document.querySelectorAll('.new-session-page__browser-entry')].find(b => b.innerText.trim() === %q)`, name)
		waitPage(p, "the folder "+name, "!!"+entry)
		if name == "picked" { // the listing of root, which holds the gateway's data dir
			if ok, _ := pageHolds(p, `![...document.querySelectorAll('.new-session-page__browser-entry')].some(b => b.innerText.trim() === "data")`, time.Now()); !ok {
				t.Error("the folder browser listed the gateway's data dir")
			}
		}
		p.Do("open "+name, chromedp.Click(fmt.Sprintf(`//button[contains(@class,"new-session-page__browser-entry")][normalize-space()=%q]`, name)))
	}
	waitPage(p, "inside the picked folder", fmt.Sprintf(`document.querySelector('.new-session-page__browser-path')?.value === %q && document.body.innerText.includes("lib")`, picked))
	p.Do("use this folder", chromedp.Click(`.new-session-page__browser-use`))
	p.Do("type and start in the folder", chromedp.SendKeys(`textarea`, "What does the README say?"), chromedp.Click(`button[aria-label="Start session"]`))
	testenv.Eventually(t, "the session made in the picked folder, its turn done on a worker", func() bool {
		for _, s := range must(g.client.Sessions(g.ctx()))(t) {
			if !before[s.ID] && s.Workspace == picked {
				ts := g.turns(s.ID)
				return len(ts) == 1 && ts[0].Status == turns.TurnDone && ts[0].Placement == "worker"
			}
		}
		return false
	})

	// Settings → Cloud workers lists our profiles; one added there is one of ours, validated as
	// any: a bad machine class is refused with the field named, then a good one is saved.
	p.Do("open Settings → Cloud workers", chromedp.Navigate("http://"+g.addr+"/openclaw/settings/cloud-workers"))
	waitPage(p, "our profile local", `document.body.innerText.includes("Provider: local")`)
	p.Do("add a profile", chromedp.Click(`//button[normalize-space()="Add profile"]`))
	waitPage(p, "the profile form", `!!document.querySelector('input[aria-label="Profile ID"]')`)
	p.Do("fill it with a bad class", chromedp.SendKeys(`input[aria-label="Profile ID"]`, "cbx-ui"),
		chromedp.SendKeys(`input[aria-label="Crabbox backend"]`, "hetzner"), chromedp.SendKeys(`input[aria-label="Machine class"]`, "cx22;id"),
		chromedp.SendKeys(`input[aria-label="Crabbox binary"]`, crabboxBin), chromedp.Click(`//button[normalize-space()="Save"]`))
	waitPage(p, "the refusal naming the class", `document.body.innerText.includes("Profile needs attention") && document.body.innerText.includes("settings.class")`)
	if _, err := g.client.Profile(g.ctx(), "cbx-ui"); err == nil {
		t.Fatal("a profile with a refused class was stored")
	}
	p.Do("fix the class and save", chromedp.SendKeys(`input[aria-label="Machine class"]`, kb.End+strings.Repeat(kb.Backspace, len("cx22;id"))+"cx22"),
		chromedp.Click(`//button[normalize-space()="Save"]`))
	waitPage(p, "the saved profile listed", `document.body.innerText.includes("Crabbox backend: hetzner · Class: cx22")`)
	prof, err := g.client.Profile(g.ctx(), "cbx-ui")
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Provider, Class, Binary string }
	_ = json.Unmarshal(prof.Settings, &st)
	if prof.Provider != "crabbox" || st.Provider != "hetzner" || st.Class != "cx22" || st.Binary != crabboxBin {
		t.Errorf("the profile saved from the Cloud workers page: %+v %s", prof, prof.Settings)
	}
	// Systems lists the worker environments.
	p.Do("open Systems", chromedp.Navigate("http://"+g.addr+"/openclaw/systems"))
	waitPage(p, "both worker environments", fmt.Sprintf(`document.body.innerText.includes("Workers") && document.body.innerText.includes(%q) && document.body.innerText.includes(%q)`, envID[:6], sshdEnvID[:6]))

	mu.Lock()
	if len(exceptions) > 0 {
		t.Errorf("the Control UI threw: %q", exceptions)
	}
	mu.Unlock()
	// the reply reached the page as live chat deltas for the key the UI uses (the worker merges
	// the deltas of ~40 ms into one event, so a fast scripted reply may be a single one), not only
	// through a history reload
	if deltas, _ := tuiTrace(t, filepath.Join(root, "trace.jsonl"), "agent:main:main"); deltas < 1 {
		t.Errorf("the Control UI was sent no chat delta for its message")
	}
	validateTrace(t, ns, dir, filepath.Join(root, "trace.jsonl"))
}

// waitPageDoing does act, then waits up to 10 s for predicate, and does act again while it
// does not hold, for at most 60 s.
func waitPageDoing(p *browsertest.Page, what, predicate string, act func()) {
	p.T.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		act()
		ok, _ := pageHolds(p, predicate, time.Now().Add(10*time.Second))
		if ok {
			return
		}
		if time.Now().After(deadline) {
			p.T.Fatalf("waiting for %s (%s)", what, predicate)
		}
	}
}

// waitPage waits for a JavaScript predicate to hold, reading it again every 100ms across the
// page's own navigations (the UI moves to the chat's route after a send, which ends a DOM
// observer).
func waitPage(p *browsertest.Page, what, predicate string) {
	p.T.Helper()
	if ok, err := pageHolds(p, predicate, time.Now().Add(60*time.Second)); !ok {
		p.T.Fatalf("waiting for %s (%s): %v", what, predicate, err)
	}
}

// pageHolds reads predicate every 100ms until it holds (true) or until passes (false, with the
// last read's error).
func pageHolds(p *browsertest.Page, predicate string, until time.Time) (bool, error) {
	for {
		ctx, cancel := context.WithTimeout(p.Ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](predicate))
		cancel()
		if err == nil && ok {
			return true, nil
		}
		if time.Now().After(until) {
			return false, err
		}
		time.Sleep(100 * time.Millisecond) // polling the page: see waitPage
	}
}
