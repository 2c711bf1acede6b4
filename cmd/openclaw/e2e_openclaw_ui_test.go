package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/openclaw/cloudworkers/gateway/inference/scripted"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/browsertest"
	"github.com/openclaw/cloudworkers/internal/testenv"
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
// lists our sessions with their placement, renders a worker session's history with its tool
// call, streams a sent message to its final answer, and throws no exception.
func TestOpenClawControlUI(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	dir := clientsDir(t)
	ns := clientNetns(t)
	root := t.TempDir()
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, true)
	cfg := fastWorkerConfig + scriptedModels(t, root, map[string]string{"chat": clientsChatScript}) +
		fmt.Sprintf("controlUi: {openclawRoot: %q}\nopenclawClients: {traceFile: %q}\n", filepath.Join(dir, "node_modules", "openclaw"), filepath.Join(root, "trace.jsonl"))
	g := startGatewayIn(t, ns, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	workerID, _ := g.activeSession(ws, "chat/m", "local")
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

// waitPage waits for a JavaScript predicate to hold, reading it again every 100ms across the
// page's own navigations (the UI moves to the chat's route after a send, which ends a DOM
// observer).
func waitPage(p *browsertest.Page, what, predicate string) {
	p.T.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(p.Ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](predicate))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			p.T.Fatalf("waiting for %s (%s): %v", what, predicate, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the page: see above
	}
}
