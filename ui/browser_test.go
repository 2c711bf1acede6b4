package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/internal/testrig/browsertest"
	"github.com/openclaw/cloudworkers/ui"
)

// fakeAPI serves the UI over stand-in /api/v1 routes of the shapes the gateway serves, so the
// browser can be given sizes a real gateway takes long to build (10,000 entries, 1,000 sessions).
type fakeAPI struct {
	sessions int
	entries  int
	// deltas, when set, is streamed to GET /sessions/:id/stream as one running turn's text.
	deltas int
	gap    time.Duration
	// placement and worker, when set, answer GET /sessions/:id/placement and
	// GET /environments/:id/worker.
	placement map[string]any
	worker    map[string]any
	// env, when set, is the one environment GET /environments/:id answers; deletes records the
	// query of each DELETE.
	env     map[string]any
	deletes chan string
	// events, when set, is what GET /environments/:id/events answers.
	events []map[string]any
	// parents, when set, maps a session's index to its parent's (sessions spawned by an agent).
	parents map[int]int
	// published, when set, receives the body of each POST /sessions/:id/publish, answered with
	// publishResult.
	published     chan map[string]any
	publishResult map[string]any
}

func (f *fakeAPI) start(t testing.TB) string {
	t.Helper()
	b := signin(t, nil)
	h, err := ui.New(ui.Config{Sessions: b})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	running := f.deltas > 0
	routes := func(g *echo.Group) {
		g.GET("/sessions", func(c echo.Context) error {
			list := make([]map[string]any, f.sessions)
			for i := range list {
				list[i] = map[string]any{"id": fmt.Sprintf("ses_%06d", i), "title": fmt.Sprintf("session %d", i), "model": "demo/demo",
					"createdAt": now.Add(time.Duration(i) * time.Second)}
				if p, ok := f.parents[i]; ok {
					list[i]["parentSessionId"] = fmt.Sprintf("ses_%06d", p)
				}
			}
			return c.JSON(http.StatusOK, list)
		})
		g.GET("/placements", func(c echo.Context) error {
			list := []map[string]any{}
			for i := 0; i < f.sessions; i += 3 {
				list = append(list, map[string]any{"sessionId": fmt.Sprintf("ses_%06d", i), "state": "active"})
			}
			return c.JSON(http.StatusOK, list)
		})
		g.GET("/profiles", func(c echo.Context) error { return c.JSON(http.StatusOK, []any{}) })
		g.GET("/sessions/:id/transcript", func(c echo.Context) error {
			// the newest ?limit= entries, as the gateway pages them
			limit, _ := strconv.Atoi(c.QueryParam("limit"))
			offset := 0
			if limit > 0 && limit < f.entries {
				offset = f.entries - limit
			}
			entries := make([]map[string]any, f.entries-offset)
			for j := range entries {
				i := offset + j
				role := "user"
				if i%2 == 1 {
					role = "assistant"
				}
				msg, _ := json.Marshal(map[string]any{"role": role, "content": []map[string]string{{"type": "text", "text": fmt.Sprintf("entry %d", i)}}})
				entries[j] = map[string]any{"id": fmt.Sprintf("e%d", i), "type": "message", "runEpoch": i / 2, "content": json.RawMessage(msg)}
			}
			return c.JSON(http.StatusOK, map[string]any{"session": map[string]any{"id": c.Param("id"), "title": "big"}, "entries": entries,
				"offset": offset, "total": f.entries})
		})
		g.GET("/sessions/:id/turns", func(c echo.Context) error {
			if running {
				return c.JSON(http.StatusOK, []map[string]any{{"runId": "run_1", "runEpoch": 1 << 30, "status": "running", "cursor": 0}})
			}
			return c.JSON(http.StatusOK, []any{})
		})
		g.GET("/sessions/:id/placement", func(c echo.Context) error {
			if f.placement != nil {
				return c.JSON(http.StatusOK, f.placement)
			}
			return c.JSON(http.StatusOK, map[string]any{"placement": map[string]any{"state": "local"}, "events": []any{}})
		})
		g.POST("/sessions/:id/publish", func(c echo.Context) error {
			var body map[string]any
			if err := c.Bind(&body); err != nil {
				return err
			}
			f.published <- body
			return c.JSON(http.StatusOK, f.publishResult)
		})
		g.GET("/environments/:id/worker", func(c echo.Context) error { return c.JSON(http.StatusOK, f.worker) })
		g.GET("/environments/:id", func(c echo.Context) error { return c.JSON(http.StatusOK, f.env) })
		g.GET("/environments/:id/events", func(c echo.Context) error {
			if f.events != nil {
				return c.JSON(http.StatusOK, f.events)
			}
			return c.JSON(http.StatusOK, []map[string]any{{"at": now, "from": "idle", "to": "destroying", "reason": "destroy requested"},
				{"at": now.Add(time.Second), "from": "destroying", "to": "destroying", "reason": "provider destroy failed: temporary error; retrying"}})
		})
		g.DELETE("/environments/:id", func(c echo.Context) error {
			f.deletes <- c.Request().URL.RawQuery
			return c.JSON(http.StatusAccepted, f.env)
		})
		g.GET("/events", func(c echo.Context) error {
			conn, err := websocket.Accept(c.Response(), c.Request(), nil)
			if err != nil {
				return nil
			}
			defer conn.CloseNow()
			<-conn.CloseRead(c.Request().Context()).Done()
			return nil
		})
		g.GET("/sessions/:id/stream", func(c echo.Context) error {
			conn, err := websocket.Accept(c.Response(), c.Request(), nil)
			if err != nil {
				return nil
			}
			defer conn.CloseNow()
			ctx := conn.CloseRead(c.Request().Context())
			tick := time.NewTicker(f.gap)
			defer tick.Stop()
			for i := 1; i <= f.deltas; i++ {
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				// the delta carries its send time (µs since the epoch) for the page to measure
				d := fmt.Sprintf("[%d] ", time.Now().UnixMicro())
				if err := wsjson.Write(ctx, conn, map[string]any{"type": "live", "cursor": i, "runId": "run_1",
					"event": map[string]any{"type": "text_delta", "delta": d}}); err != nil {
					return nil
				}
			}
			<-ctx.Done()
			return nil
		})
	}
	srv := api.New(api.Config{Token: token, UI: h, Browser: b, Mount: []func(g *echo.Group){routes}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts.URL
}

// shared is the one Chromium of this package's browser tests.
var shared browsertest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	shared.Stop()
	os.Exit(code)
}

func signIn(t testing.TB, p *browsertest.Page, base string) {
	t.Helper()
	p.Do("sign in", chromedp.Navigate(mintLink(t, base)), chromedp.WaitVisible(`#session-list-status`))
}

// A 10,000-entry transcript renders a window of the newest entries; "Show earlier entries"
// widens it. The page never holds the whole transcript in its DOM.
func TestLongTranscriptIsWindowed(t *testing.T) {
	browser := shared.Get(t)
	base := (&fakeAPI{sessions: 3, entries: 10000}).start(t)
	p := browsertest.NewPage(t, browser, "window", false)
	signIn(t, p, base)
	p.Do("open", chromedp.Navigate(base+"/sessions/ses_big"), chromedp.WaitVisible(`#message`))
	p.Until("the window", `document.getElementById('transcript').dataset.total === '10000'`)
	if n := browsertest.Eval[int](p, `document.querySelectorAll('#transcript > li').length`); n != 200 {
		t.Fatalf("%d entries in the DOM, want a window of 200", n)
	}
	first := browsertest.Eval[string](p, `document.querySelector('#transcript > li p').textContent`)
	last := browsertest.Eval[string](p, `document.querySelector('#transcript > li:last-child p').textContent`)
	if first != "entry 9800" || last != "entry 9999" {
		t.Fatalf("window from %q to %q, want entry 9800 to entry 9999", first, last)
	}
	p.Do("show earlier", chromedp.Click(`#earlier`))
	p.Until("a wider window", `document.querySelectorAll('#transcript > li').length === 400`)
	if fetched := browsertest.Eval[int](p, `performance.getEntriesByType('resource').filter(r => r.name.includes('/transcript')).length`); fetched != 2 {
		t.Fatalf("%d transcript fetches, want 2 (the first window, then a wider one)", fetched)
	}
	if got := browsertest.Eval[string](p, `performance.getEntriesByType('resource').filter(r => r.name.includes('/transcript')).map(r => new URL(r.name).search).join(' ')`); got != "?limit=264 ?limit=464" {
		t.Fatalf("transcript fetched as %q, want pages of the newest entries", got)
	}
	if got := browsertest.Eval[string](p, `document.getElementById('earlier').textContent`); got != "Show earlier entries (9600 more)" {
		t.Fatalf("button says %q", got)
	}
}

// BenchmarkUI reports, measured in the browser: the Sessions page's first render with 1,000
// sessions, opening a session of 10,000 entries, and stream-to-DOM latency of 1,000 deltas
// (p50, p99: from the server writing the delta to the text being in the page).
func BenchmarkUI(b *testing.B) {
	browser := shared.Get(b)
	b.Run("sessions-1000", func(b *testing.B) {
		base := (&fakeAPI{sessions: 1000}).start(b)
		p := browsertest.NewPage(b, browser, "sessions", false)
		signIn(b, p, base)
		var total float64
		for i := 0; i < b.N; i++ {
			p.Do("load", chromedp.Navigate(base+"/"))
			p.Until("1000 rows", `document.querySelectorAll('#session-list li').length === 1000`)
			total += browsertest.Eval[float64](p, `performance.now()`)
		}
		b.ReportMetric(total/float64(b.N), "ms/first-render")
	})
	b.Run("transcript-10000", func(b *testing.B) {
		base := (&fakeAPI{sessions: 1, entries: 10000}).start(b)
		p := browsertest.NewPage(b, browser, "transcript", false)
		signIn(b, p, base)
		var total float64
		for i := 0; i < b.N; i++ {
			p.Do("load", chromedp.Navigate(base+"/sessions/ses_big"))
			p.Until("the window", `document.getElementById('transcript').dataset.total === '10000'`)
			total += browsertest.Eval[float64](p, `performance.now()`)
		}
		b.ReportMetric(total/float64(b.N), "ms/open")
	})
	b.Run("stream-to-dom-1000", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			base := (&fakeAPI{sessions: 1, deltas: 1000, gap: 2 * time.Millisecond}).start(b)
			p := browsertest.NewPage(b, browser, "stream", false)
			signIn(b, p, base)
			p.Do("open", chromedp.Navigate(base+"/sessions/ses_live"), chromedp.WaitVisible(`#message`))
			_ = browsertest.Eval[bool](p, `(() => { window.__lat = [];
				new MutationObserver(() => {
					const el = document.querySelector('#live .text'); if (!el) return;
					const now = (performance.timeOrigin + performance.now()) * 1000;
					for (const m of el.textContent.slice(window.__seen || 0).matchAll(/\[(\d+)\]/g)) window.__lat.push((now - Number(m[1])) / 1000);
					window.__seen = el.textContent.length;
				}).observe(document.getElementById('live'), {subtree: true, childList: true, characterData: true}); return true })()`)
			p.Until("1000 deltas", `window.__lat.length >= 990`)
			lat := browsertest.Eval[[]float64](p, `window.__lat`)
			sort.Float64s(lat)
			b.ReportMetric(lat[len(lat)/2], "ms-p50")
			b.ReportMetric(lat[len(lat)*99/100], "ms-p99")
			if !strings.Contains(browsertest.Eval[string](p, `document.getElementById('turn-status').textContent`), "running") {
				b.Fatal("the streamed turn is not shown as running")
			}
		}
	})
}

// Every control of every page has a name a screen reader reads (a label, aria-label or its
// text), and the keyboard reaches the page: the first Tab is "Skip to content", which moves
// focus into the page.
func TestControlsAreLabelledAndKeyboardReachable(t *testing.T) {
	browser := shared.Get(t)
	base := (&fakeAPI{sessions: 3, entries: 4}).start(t)
	p := browsertest.NewPage(t, browser, "a11y", false)
	signIn(t, p, base)
	unnamed := `[...document.querySelectorAll('button, input, select, textarea, a[href]')].filter(e => !e.closest('[hidden]'))
		.filter(e => !((e.labels && e.labels.length) || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') || e.textContent.trim()))
		.map(e => e.outerHTML.slice(0, 80))`
	for _, path := range []string{"/", "/new", "/sessions/ses_000001", "/environments", "/environments/env_x", "/profiles"} {
		p.Do("open "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(`#main`))
		p.Until("the sidebar", `document.querySelectorAll('#session-list li').length === 3`)
		if got := browsertest.Eval[[]string](p, unnamed); len(got) > 0 {
			t.Fatalf("%s: controls without a name: %q", path, got)
		}
	}
	p.Do("tab", chromedp.Navigate(base+"/sessions/ses_000001"), chromedp.WaitVisible(`#message`), chromedp.KeyEvent("\t"))
	if got := browsertest.Eval[string](p, `document.activeElement.textContent`); got != "Skip to content" {
		t.Fatalf("first Tab focuses %q", got)
	}
	p.Do("skip", chromedp.KeyEvent("\r"))
	p.Until("focus in the page", `document.activeElement.id === 'main' || document.getElementById('main').contains(document.activeElement)`)
}

// What a worker session's header says when its worker sheds load, and what a reclaimed session
// says it lost.
func TestBackpressureAndReclaimAreShown(t *testing.T) {
	browser := shared.Get(t)
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	busy := &fakeAPI{sessions: 1, entries: 2,
		placement: map[string]any{"placement": map[string]any{"state": "active", "profileId": "crab", "environmentId": "env_1"},
			"events": []map[string]any{{"at": at, "from": "local", "to": "requested", "reason": "dispatch"}, {"at": at, "from": "starting", "to": "active"}}},
		worker: map[string]any{"tunnelStatus": "connected", "backpressure": true, "queued": 7, "capacityRejections": 3}}
	p := browsertest.NewPage(t, browser, "busy", false)
	base := busy.start(t)
	signIn(t, p, base)
	p.Do("open", chromedp.Navigate(base+"/sessions/ses_000000"), chromedp.WaitVisible(`#message`))
	p.Until("the header", `document.getElementById('runs-on').textContent.startsWith('Runs on worker · crab · env_1') && !document.getElementById('pressure').hidden`)
	if got := browsertest.Eval[string](p, `document.getElementById('pressure').textContent + ' | ' + document.getElementById('tunnel').textContent`); got != "The worker is shedding load: 7 requests queued, 3 refused for capacity. | tunnel connected" {
		t.Fatalf("header says %q", got)
	}

	lost := &fakeAPI{sessions: 1, entries: 2,
		placement: map[string]any{"placement": map[string]any{"state": "reclaimed", "profileId": "crab", "environmentId": "env_1"},
			"events": []map[string]any{{"at": at, "from": "active", "to": "active", "reason": "checkpoint 3: 2 files"},
				{"at": at.Add(time.Minute), "from": "active", "to": "reclaimed", "reason": "lease env_1 lost: provider reports it gone"}}}}
	q := browsertest.NewPage(t, browser, "lost", false)
	base = lost.start(t)
	signIn(t, q, base)
	q.Do("open", chromedp.Navigate(base+"/sessions/ses_000000"), chromedp.WaitVisible(`#message`))
	q.Until("the loss", `document.querySelector('#came-back .warn') !== null`)
	got := browsertest.Eval[string](q, `document.querySelector('#came-back .warn').textContent`)
	if !strings.Contains(got, "lease env_1 lost: provider reports it gone") || !strings.Contains(got, "after checkpoint 3") || !strings.Contains(got, "are lost") {
		t.Fatalf("a reclaimed session says %q", got)
	}
	if s := browsertest.Eval[string](q, `document.getElementById('runs-on').textContent`); !strings.HasPrefix(s, "Runs on gateway") || !strings.Contains(s, "reclaimed") {
		t.Fatalf("header of a reclaimed session: %q", s)
	}
	if !browsertest.Eval[bool](q, `!document.getElementById('move-local').hidden && !document.getElementById('move').hidden && document.getElementById('pullback').hidden`) {
		t.Fatal("a reclaimed session must offer Move to gateway and Move to worker, not Pull back")
	}
}

// A destroy that is stuck (the environment stays destroying) offers "Force destroy", which asks
// the gateway for a forced destroy; the timeline marks the failed step.
func TestForceDestroyWhenStuck(t *testing.T) {
	browser := shared.Get(t)
	f := &fakeAPI{sessions: 1, deletes: make(chan string, 4),
		env: map[string]any{"id": "env_1", "state": "destroying", "profileId": "crab", "providerId": "command", "leaseId": "l-1", "tunnelStatus": "stopped"}}
	base := f.start(t)
	p := browsertest.NewPage(t, browser, "env", false)
	signIn(t, p, base)
	p.Do("open", chromedp.Navigate(base+"/environments/env_1"), chromedp.WaitVisible(`#timeline li.error`))
	p.Until("Force destroy", `!document.getElementById('force-destroy').hidden`)
	p.Do("force", chromedp.Click(`#force-destroy`))
	wait, cancel := context.WithTimeout(p.Ctx, 30*time.Second)
	defer cancel()
	select {
	case q := <-f.deletes:
		if q != "force=true" {
			t.Fatalf("Force destroy sent DELETE ?%s", q)
		}
	case <-wait.Done():
		t.Fatal("no DELETE")
	}
}

// The environment page shows the timeline's steps: kind and name, result, duration, and the output
// tail of a failed setup step (open); the profile a fallback leased from is named.
func TestEnvironmentTimelineSteps(t *testing.T) {
	browser := shared.Get(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := &fakeAPI{sessions: 1,
		env: map[string]any{"id": "env_1", "state": "failed", "profileId": "gpu", "leasedProfileId": "gpu-b", "providerId": "command",
			"leaseId": "l-1", "tunnelStatus": "stopped", "error": `setup step "deps" failed with exit status 3`},
		events: []map[string]any{
			{"at": at, "from": "provisioning", "to": "provisioning", "reason": "provision gpu: failed",
				"step": map[string]any{"kind": "provision", "name": "gpu", "startedAt": at, "durationMs": 300, "result": "failed", "detail": "capacity exhausted — falling back to profile gpu-b"}},
			{"at": at.Add(time.Second), "from": "bootstrapping", "to": "bootstrapping", "reason": "bootstrap bundle: ok",
				"step": map[string]any{"kind": "bootstrap", "name": "bundle", "startedAt": at, "durationMs": 1200, "result": "ok"}},
			{"at": at.Add(2 * time.Second), "from": "ready", "to": "ready", "reason": "setup deps: failed",
				"step": map[string]any{"kind": "setup", "name": "deps", "startedAt": at, "durationMs": 4000, "result": "failed", "exitCode": 3, "output": "fetching\nE404 <b>no such</b> package"}},
		}}
	base := f.start(t)
	p := browsertest.NewPage(t, browser, "timeline", false)
	signIn(t, p, base)
	p.Do("open", chromedp.Navigate(base+"/environments/env_1"), chromedp.WaitVisible(`#timeline li[data-step="setup:deps"]`))
	got := browsertest.Eval[string](p, `document.querySelector('#timeline li[data-step="setup:deps"]').textContent`)
	for _, want := range []string{"setup deps", "failed", "4.0 s", "E404 <b>no such</b> package"} {
		if !strings.Contains(got, want) {
			t.Errorf("the failed setup step reads %q, want %q in it", got, want)
		}
	}
	if !browsertest.Eval[bool](p, `document.querySelector('#timeline li[data-step="setup:deps"]').classList.contains('error') && document.querySelector('#timeline li[data-step="setup:deps"] details').open`) {
		t.Error("a failed step is not marked as an error with its output open")
	}
	if got := browsertest.Eval[string](p, `document.querySelector('#timeline li[data-step="provision:gpu"]').textContent`); !strings.Contains(got, "falling back to profile gpu-b") {
		t.Errorf("the provisioning attempt reads %q", got)
	}
	if got := browsertest.Eval[string](p, `document.querySelector('[data-field="leased from"]').textContent`); got != "gpu-b (fallback)" {
		t.Errorf("leased from: %q", got)
	}
}

// "Sign out" clears the cookie in the browser: the pages and the API ask to sign in again.
func TestSignOutInBrowser(t *testing.T) {
	browser := shared.Get(t)
	base := (&fakeAPI{sessions: 1}).start(t)
	p := browsertest.NewPage(t, browser, "signout", true)
	signIn(t, p, base)
	p.Do("sign out", chromedp.Click(`form[action="/logout"] button`), chromedp.WaitVisible(`input#code`))
	p.Do("home", chromedp.Navigate(base+"/"), chromedp.WaitVisible(`input#code`))
	if got := browsertest.Eval[int](p, `fetch('/api/v1/sessions').then(r => r.status)`); got != http.StatusUnauthorized {
		t.Fatalf("the API after sign-out answers %d", got)
	}
}

// The sign-in form works in a browser (its POST carries the page's Origin).
func TestSignInFormInBrowser(t *testing.T) {
	browser := shared.Get(t)
	base := (&fakeAPI{sessions: 1}).start(t)
	p := browsertest.NewPage(t, browser, "form", true)
	link, err := url.Parse(mintLink(t, base))
	if err != nil {
		t.Fatal(err)
	}
	p.Do("sign in by the form", chromedp.Navigate(base+"/login"), chromedp.SendKeys(`#code`, link.Query().Get("code")), chromedp.Submit(`#code`),
		chromedp.WaitVisible(`#session-list-status`))
	if loc := browsertest.Eval[string](p, `location.pathname + location.search`); loc != "/" {
		t.Fatalf("after the form: %s", loc)
	}
}

// Sessions spawned by an agent are listed under their parent (newest first), one step in per
// level, with their worker badge and "child of …"; the others keep their newest-first order.
func TestChildrenAreListedUnderTheirParent(t *testing.T) {
	browser := shared.Get(t)
	// 0 has children 2 and 4; 4 has child 5; 3 is unrelated (placements: every third is active)
	base := (&fakeAPI{sessions: 6, entries: 1, parents: map[int]int{2: 0, 4: 0, 5: 4}}).start(t)
	p := browsertest.NewPage(t, browser, "children", false)
	signIn(t, p, base)
	p.Until("six rows", `document.querySelectorAll('#session-list li').length === 6`)
	order := browsertest.Eval[string](p, `[...document.querySelectorAll('#session-list li')].map(li => li.dataset.session.slice(-1) + (li.dataset.parent ? '<' + li.dataset.parent.slice(-1) : '')).join(' ')`)
	if order != "3 1 0 4<0 5<4 2<0" {
		t.Fatalf("sidebar order %q, want \"3 1 0 4<0 5<4 2<0\" (children under their parent, newest first)", order)
	}
	if got := browsertest.Eval[string](p, `document.querySelector('#session-list li[data-session="ses_000005"]').className`); got != "child depth-2" {
		t.Fatalf("grandchild row class %q, want \"child depth-2\"", got)
	}
	if got := browsertest.Eval[string](p, `document.querySelector('#session-list li[data-session="ses_000004"] .session-parent').textContent`); got != "child of session 0" {
		t.Fatalf("child row says %q", got)
	}
	if got := browsertest.Eval[string](p, `(document.querySelector('#session-list li[data-session="ses_000003"] .badge') || {}).textContent || ''`); got != "running" {
		t.Fatalf("worker badge of session 3: %q, want running", got)
	}
}

// The session page's publish action sends the remote and --pr as chosen and shows the pull
// request the gateway reports as a link; a pull request address that is not http(s) is shown as
// text, never made a link.
func TestPublishActionWithPullRequest(t *testing.T) {
	browser := shared.Get(t)
	home := map[string]any{"placement": map[string]any{"state": "local", "syncMode": "git", "anchorDir": "/data/worktrees/x/s1"}, "events": []any{}}
	for _, tc := range []struct{ name, url, link string }{
		{"https", "https://forge.example/org/repo/pull/7", "https://forge.example/org/repo/pull/7"},
		{"script", "javascript:alert(1)", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAPI{sessions: 1, entries: 2, placement: home, published: make(chan map[string]any, 1),
				publishResult: map[string]any{"remoteUrl": "https://forge.example/org/repo.git", "ref": "refs/heads/openclaw/s1", "commit": "0123456789abcdef0123",
					"status": "new", "pullRequest": map[string]any{"number": 7, "url": tc.url, "created": true}}}
			p := browsertest.NewPage(t, browser, "publish-"+tc.name, false)
			base := f.start(t)
			signIn(t, p, base)
			p.Do("open", chromedp.Navigate(base+"/sessions/ses_000000"), chromedp.WaitVisible(`#publish`))
			p.Do("publish with a pull request", chromedp.SetValue(`#publish-remote`, "upstream"), chromedp.Click(`#publish-pr`), chromedp.Click(`#publish`))
			select {
			case body := <-f.published:
				if body["remote"] != "upstream" || body["pr"] != true {
					t.Fatalf("publish sent %v, want remote upstream and pr true", body)
				}
			case <-p.Ctx.Done():
				t.Fatal("no publish request")
			}
			p.Until("the result", `document.getElementById('publish-result').className === 'published'`)
			got := browsertest.Eval[string](p, `document.getElementById('publish-result').textContent`)
			if !strings.HasPrefix(got, "Pushed refs/heads/openclaw/s1 at 0123456789ab to https://forge.example/org/repo.git (new); pull request #7") || !strings.HasSuffix(got, " opened") {
				t.Fatalf("the page says %q", got)
			}
			if href := browsertest.Eval[string](p, `(document.querySelector('#publish-result a') || {href: ''}).href`); href != tc.link {
				t.Fatalf("pull request link %q, want %q", href, tc.link)
			}
		})
	}
}
