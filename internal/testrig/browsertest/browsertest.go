// Package browsertest drives Debian's headless Chromium through chromedp for the Control UI's tests.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// ScreenshotsEnv names a directory where tests write the PNG screenshots docs/ui.md shows
// (OPENCLAW_UI_SCREENSHOTS=docs, relative to the repository root).
const ScreenshotsEnv = "OPENCLAW_UI_SCREENSHOTS"

// Start starts one headless Chromium for the test with a fresh profile and no background traffic
// (no sync, component updates, QUIC or first-run calls: a test talks to loopback only). Without
// Chromium the test skips loudly, and fails under OPENCLAW_REQUIRE_INTEGRATION=1.
func Start(t testing.TB) context.Context {
	t.Helper()
	testenv.RequireCommands(t, "chromium")
	ctx, stop, err := Launch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ctx
}

// Launch starts Chromium with its profile in userDataDir, for tests that share one browser
// (Shared); stop ends it. The caller has checked that chromium is installed.
func Launch(userDataDir string) (ctx context.Context, stop func(), err error) {
	bin, err := testenv.LookPath("chromium")
	if err != nil {
		return nil, nil, err
	}
	// Chromium's own temp directories (org.chromium.Chromium.*) go inside the profile, so that
	// they are removed with it even when the browser is killed.
	tmp := filepath.Join(userDataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, nil, err
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin), chromedp.UserDataDir(userDataDir), chromedp.Env("TMPDIR=" + tmp),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints"),
		chromedp.Flag("window-size", "1280,800"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	stop = func() { cancelBrowser(); cancelAlloc() }
	if err := chromedp.Do(bctx); err != nil {
		stop()
		return nil, nil, fmt.Errorf("start chromium: %w", err)
	}
	return bctx, stop, nil
}

// Shared is one browser for the tests of a package: Get starts it on first use (skipping or
// failing a test without Chromium as Start does), Stop ends it from TestMain.
type Shared struct {
	once sync.Once
	ctx  context.Context
	stop func()
	dir  string
	err  error
}

// Get returns the shared browser, starting it on first use.
func (s *Shared) Get(t testing.TB) context.Context {
	t.Helper()
	testenv.RequireCommands(t, "chromium")
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", "openclaw-chromium-"); s.err == nil {
			s.ctx, s.stop, s.err = Launch(s.dir)
		}
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.ctx
}

// Stop ends the shared browser, if it was started, and removes its profile.
func (s *Shared) Stop() {
	if s.stop != nil {
		s.stop()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// Page is one browser tab under test: its steps are bounded, and a failing test leaves a
// screenshot and the page's HTML in its artifact directory (go test -artifacts keeps them).
type Page struct {
	T    testing.TB
	Ctx  context.Context
	name string
}

// NewPage opens a tab at 1280×800; isolated gives it a browser context (cookies) of its own.
func NewPage(t testing.TB, browser context.Context, name string, isolated bool) *Page {
	t.Helper()
	var opts []chromedp.ContextOption
	if isolated {
		opts = append(opts, chromedp.WithNewBrowserContext())
	}
	ctx, cancel := chromedp.NewContext(browser, opts...)
	p := &Page{T: t, Ctx: ctx, name: name}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			p.artifacts()
		}
		cancel()
	})
	return p
}

func (p *Page) artifacts() {
	ctx, cancel := context.WithTimeout(p.Ctx, 10*time.Second)
	defer cancel()
	dir := p.T.ArtifactDir()
	if png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot()); err == nil {
		_ = os.WriteFile(filepath.Join(dir, p.name+"-failure.png"), png, 0o644)
	}
	if html, err := chromedp.Run(ctx, chromedp.OuterHTML("html")); err == nil {
		_ = os.WriteFile(filepath.Join(dir, p.name+"-failure.html"), []byte(html), 0o644)
	}
	p.T.Logf("browser artifacts of tab %s (screenshot, HTML) in %s", p.name, dir)
}

// Do runs steps with a bound.
func (p *Page) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.T.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.T.Fatalf("%s: %v", what, err)
	}
}

// Eval evaluates a JavaScript expression in the page.
func Eval[T any](p *Page, expr string) T {
	p.T.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.T.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// Until waits, on every DOM change, for a JavaScript predicate to hold.
func (p *Page) Until(what, predicate string) {
	p.T.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, 90*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(80*time.Second))); err != nil {
		p.T.Fatalf("waiting for %s (%s): %v", what, predicate, err)
	}
}

// Shot writes docs/ui-<name>.png when OPENCLAW_UI_SCREENSHOTS is set. rootRel is the path from
// the test's package directory to the repository root.
func (p *Page) Shot(rootRel, name string) {
	p.T.Helper()
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(rootRel, dir)
	}
	png, err := chromedp.Run(p.Ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.T.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ui-"+name+".png"), png, 0o644); err != nil {
		p.T.Fatal(err)
	}
}

// TextCount is a JS expression counting the elements matching sel whose text contains s.
func TextCount(sel, s string) string {
	return fmt.Sprintf(`[...document.querySelectorAll(%q)].filter(e => e.textContent.includes(%q)).length`, sel, s)
}
