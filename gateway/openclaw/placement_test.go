package openclaw

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// fakePlacements walks a session's placement through the states a dispatch and a pull-back take,
// announcing each on the sessions feed as the placement store does.
type fakePlacements struct {
	ss *sessions.Store
	mu sync.Mutex
	p  map[string]Placement
	// fail: dispatches to this profile end failed
	fail      string
	destroyed []string
}

func (f *fakePlacements) get(_ context.Context, id string) (Placement, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.p[id]
	return p, ok
}

func (f *fakePlacements) walk(id string, states ...Placement) {
	go func() {
		for _, st := range states {
			time.Sleep(20 * time.Millisecond)
			f.mu.Lock()
			st.Generation = f.p[id].Generation + 1
			f.p[id] = st
			f.mu.Unlock()
			f.ss.Notify("placement.updated", id)
		}
	}()
}

func (f *fakePlacements) dispatch(_ context.Context, id, profile, class string) error {
	if profile == "nope" {
		return &EnvironmentError{Invalid: true, Code: "profile_not_found", Message: "profile nope: not found"}
	}
	on := Placement{ProfileID: profile, EnvironmentID: "env_1", ProviderID: "local", BundleHash: strings.Repeat("b", 64), BaseManifest: "m1", BoxWorkspace: "/w", OwnerEpoch: 2}
	last := on
	last.State = "active"
	if profile == f.fail {
		last = Placement{State: "failed", ProfileID: profile, Error: "provision: the lease CLI exited 1"}
	}
	req, prov := on, on
	req.State, prov.State = "requested", "provisioning"
	if profile == "stuck" {
		f.walk(id, req, prov) // a lease that never comes
		return nil
	}
	f.walk(id, req, prov, last)
	return nil
}

func (f *fakePlacements) reclaim(_ context.Context, id string, _ bool) error {
	p, _ := f.get(context.Background(), id)
	if p.State != "active" {
		return &EnvironmentError{Invalid: true, Code: "stale", Message: "session is " + p.State + ", not active on a worker"}
	}
	dr := p
	dr.State = "draining"
	f.walk(id, dr, Placement{State: "local"})
	return nil
}

func placementRig(t *testing.T) (*rig, *fakePlacements) {
	fp := &fakePlacements{p: map[string]Placement{}, fail: "broken"}
	r := newRig(t, func(c *Config) {
		fp.ss = c.Sessions
		c.Placement, c.Dispatch, c.Reclaim = fp.get, fp.dispatch, fp.reclaim
		c.Environments = func(context.Context) ([]Environment, error) {
			return []Environment{{ID: "env_1", ProfileID: "box", ProviderID: "local", State: "attached", TunnelStatus: "connected"}}, nil
		}
		c.DestroyEnvironment = func(_ context.Context, id string, _ bool) (Environment, error) {
			fp.mu.Lock()
			fp.destroyed = append(fp.destroyed, id)
			fp.mu.Unlock()
			return Environment{ID: id, ProfileID: "box", ProviderID: "local", State: "destroyed"}, nil
		}
	})
	return r, fp
}

func adminClient(t *testing.T, r *rig) *tclient {
	c := dial(t, r)
	p := connectBody(testToken)
	p["scopes"] = []string{"operator.admin"}
	if m := c.connect(p); m["ok"] != true {
		t.Fatalf("connect: %v", m)
	}
	return c
}

func call(c *tclient, id, method string, params any) map[string]any {
	c.t.Helper()
	c.write(map[string]any{"type": "req", "id": id, "method": method, "params": params})
	return c.res(id)
}

// sessions.dispatch answers once the session is active on a worker, with the placement the
// protocol's result requires; sessions.reclaim once it rests on the gateway again.
func TestDispatchAndReclaimWaitForThePlacement(t *testing.T) {
	r, _ := placementRig(t)
	s, err := r.sess.Create(testCtx(t), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	key := sessionKeyFor(s.Agent, s.ID)
	c := adminClient(t, r)
	m := call(c, "d1", "sessions.dispatch", map[string]any{"key": key, "profileId": "box"})
	if m["ok"] != true {
		t.Fatalf("dispatch: %v", m)
	}
	pl := m["payload"].(map[string]any)["placement"].(map[string]any)
	if pl["state"] != "active" || pl["environmentId"] != "env_1" || pl["profileId"] != "box" || pl["activeOwnerEpoch"] != float64(2) || pl["remoteWorkspaceDir"] != "/w" {
		t.Fatalf("dispatch placement %v", pl)
	}
	st := call(c, "s1", "environments.session.status", map[string]any{"sessionKey": key})
	att, _ := st["payload"].(map[string]any)["attachment"].(map[string]any)
	if att == nil || att["environmentId"] != "env_1" || st["payload"].(map[string]any)["environment"] == nil {
		t.Fatalf("environments.session.status while active: %v", st)
	}
	// Dispatching again to the same profile while active is the same placement, not a new move.
	if m := call(c, "d2", "sessions.dispatch", map[string]any{"key": key, "profileId": "box"}); m["ok"] != true {
		t.Fatalf("second dispatch: %v", m)
	}
	m = call(c, "r1", "sessions.reclaim", map[string]any{"key": key})
	if m["ok"] != true || m["payload"].(map[string]any)["placement"].(map[string]any)["state"] != "local" {
		t.Fatalf("reclaim: %v", m)
	}
	st = call(c, "s2", "environments.session.status", map[string]any{"sessionKey": key})
	if a, ok := st["payload"].(map[string]any)["attachment"]; !ok || a != nil {
		t.Fatalf("status after reclaim: %v", st)
	}
	// A reclaim of a session at rest on the gateway is refused with a code.
	m = call(c, "r2", "sessions.reclaim", map[string]any{"key": key})
	if code, _, detail := errCode(m); m["ok"] != false || code != CodeInvalidRequest || detail != "stale" {
		t.Fatalf("reclaim of a local session: %v", m)
	}
}

// A dispatch that fails answers with the placement's error; an unknown profile, a device target,
// another OS, a desktop and a missing scope are refused before anything moves.
func TestDispatchRefusals(t *testing.T) {
	r, fp := placementRig(t)
	s, err := r.sess.Create(testCtx(t), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	key := sessionKeyFor(s.Agent, s.ID)
	c := adminClient(t, r)
	m := call(c, "1", "sessions.dispatch", map[string]any{"key": key, "profileId": "broken"})
	if code, msg, detail := errCode(m); code != CodeUnavailable || detail != "placement_failed" || !strings.Contains(msg, "lease CLI exited 1") {
		t.Fatalf("failed dispatch: %v", m)
	}
	fp.mu.Lock()
	fp.p[s.ID] = Placement{State: "local"}
	fp.mu.Unlock()
	for _, tc := range []struct {
		method string
		params map[string]any
		code   string
		msg    string
	}{
		{"sessions.dispatch", map[string]any{"key": key, "profileId": "nope"}, CodeInvalidRequest, "profile nope"},
		{"sessions.dispatch", map[string]any{"key": key, "deviceId": "dev1"}, CodeInvalidRequest, "not on paired devices"},
		{"sessions.dispatch", map[string]any{"key": key, "profileId": "box", "os": "macos"}, CodeInvalidRequest, "os macos is not offered"},
		{"sessions.dispatch", map[string]any{"key": "agent:main:ses_nope", "profileId": "box"}, CodeInvalidRequest, "unknown session key"},
		{"environments.session.create", map[string]any{"sessionKey": key, "profileId": "box", "idempotencyKey": "k", "presentation": "desktop"}, CodeInvalidRequest, "no desktop"},
		{"environments.session.create", map[string]any{"profileId": "box", "idempotencyKey": "k"}, CodeInvalidRequest, "sessionKey is required"},
		{"sessions.reclaim", map[string]any{"key": key, "recoverToGateway": map[string]any{}}, CodeInvalidRequest, "expectedGeneration"},
	} {
		m := call(c, "x", tc.method, tc.params)
		if code, msg, _ := errCode(m); m["ok"] != false || code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s %v: got %v, want %s %q", tc.method, tc.params, m, tc.code, tc.msg)
		}
	}
	w := dial(t, r)
	if m := w.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	for _, meth := range []string{"sessions.dispatch", "sessions.reclaim", "environments.session.create", "environments.session.destroy"} {
		m := call(w, "w", meth, map[string]any{"key": key, "sessionKey": key, "profileId": "box", "idempotencyKey": "k"})
		if code, msg, _ := errCode(m); code != CodeForbidden || !strings.Contains(msg, "operator.admin") {
			t.Errorf("%s with read+write scopes: %v", meth, m)
		}
	}
	if m := call(w, "w2", "sessions.create", map[string]any{"cwd": "/etc"}); m["ok"] != false {
		t.Errorf("sessions.create with cwd and no admin scope: %v", m)
	}
}

// environments.session.create dispatches the conversation to a worker of the profile;
// environments.session.destroy brings its work home first, then destroys the environment.
func TestEnvironmentSessionLifecycle(t *testing.T) {
	r, fp := placementRig(t)
	s, err := r.sess.Create(testCtx(t), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	key := sessionKeyFor(s.Agent, s.ID)
	c := adminClient(t, r)
	m := call(c, "1", "environments.session.create", map[string]any{"sessionKey": key, "profileId": "box", "idempotencyKey": "k1"})
	if m["ok"] != true || m["payload"].(map[string]any)["attachment"].(map[string]any)["environmentId"] != "env_1" {
		t.Fatalf("create: %v", m)
	}
	m = call(c, "2", "environments.session.destroy", map[string]any{"sessionKey": key, "environmentId": "env_other"})
	if code, msg, _ := errCode(m); code != CodeInvalidRequest || !strings.Contains(msg, "target changed") {
		t.Fatalf("destroy of another environment: %v", m)
	}
	m = call(c, "3", "environments.session.destroy", map[string]any{"sessionKey": key})
	if m["ok"] != true || m["payload"].(map[string]any)["stopped"] != true {
		t.Fatalf("destroy: %v", m)
	}
	if p, _ := fp.get(context.Background(), s.ID); p.State != "local" {
		t.Fatalf("placement after destroy %v, want local (work brought home first)", p)
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if len(fp.destroyed) != 1 || fp.destroyed[0] != "env_1" {
		t.Fatalf("destroyed %v, want env_1", fp.destroyed)
	}
}

// TestPlacementShapeKeepsEachStateClosed follows the pinned package's SessionPlacement union:
// each state is a closed object with its own required fields. The engine can hold a state
// before all its facts are recorded (syncing before the bundle hash is known); such a
// placement must still be one a client accepts, so it is shown as the latest state its facts
// support, and no state carries a field it does not allow.
func TestPlacementShapeKeepsEachStateClosed(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	timing := []string{"state", "generation", "createdAtMs", "updatedAtMs", "stateChangedAtMs"}
	identity := []string{"profileId", "providerId"}
	// allowed and required fields per state, as the package's schema declares them
	allowed := map[string][]string{
		"local": nil, "requested": nil, "reclaimed": nil,
		"provisioning": {"environmentId"},
		"syncing":      {"environmentId", "workerBundleHash"},
		"starting":     {"environmentId", "workerBundleHash", "workspaceBaseManifestRef", "remoteWorkspaceDir"},
		"active":       {"environmentId", "workerBundleHash", "workspaceBaseManifestRef", "remoteWorkspaceDir", "activeOwnerEpoch"},
		"failed":       {"environmentId", "workerBundleHash", "workspaceBaseManifestRef", "remoteWorkspaceDir", "activeOwnerEpoch", "recoveryError"},
	}
	allowed["draining"], allowed["reconciling"] = allowed["active"], allowed["active"]
	required := map[string][]string{
		"syncing": allowed["syncing"], "starting": allowed["starting"], "active": allowed["active"],
		"draining": allowed["active"], "reconciling": allowed["active"], "failed": {"recoveryError"},
	}
	full := Placement{EnvironmentID: "env_1", ProfileID: "p", ProviderID: "local", BundleHash: hash,
		BaseManifest: "man_1", BoxWorkspace: "/w", OwnerEpoch: 3, Generation: 2}
	strip := map[string]func(*Placement){
		"nothing":     func(*Placement) {},
		"environment": func(p *Placement) { p.EnvironmentID = "" },
		"bundle":      func(p *Placement) { p.BundleHash = "" },
		"bad bundle":  func(p *Placement) { p.BundleHash = "sha256:" + hash },
		"manifest":    func(p *Placement) { p.BaseManifest = "" },
		"box dir":     func(p *Placement) { p.BoxWorkspace = "" },
		"epoch":       func(p *Placement) { p.OwnerEpoch = 0 },
	}
	c := &conn{}
	s := sessions.Session{ID: "ses_1", CreatedAt: time.Unix(10, 0), UpdatedAt: time.Unix(20, 0)}
	order := map[string]int{"provisioning": 0, "syncing": 1, "starting": 2, "active": 3, "draining": 3, "reconciling": 3}
	for _, state := range []string{"local", "requested", "provisioning", "syncing", "starting", "active", "draining", "reconciling", "reclaimed", "failed", "bootstrapping"} {
		for what, f := range strip {
			p := full
			p.State = state
			f(&p)
			out := c.placementShape(s, p)
			got, _ := out["state"].(string)
			ok := slices.Concat(timing, allowed[got])
			if got != "local" && got != "requested" && got != "reclaimed" {
				ok = append(ok, identity...)
			}
			for k := range out {
				if !slices.Contains(ok, k) {
					t.Errorf("%s without %s: shown as %s with field %s it does not allow: %v", state, what, got, k, out)
				}
			}
			for _, k := range required[got] {
				if _, has := out[k]; !has {
					t.Errorf("%s without %s: shown as %s without required %s: %v", state, what, got, k, out)
				}
			}
			if h, has := out["workerBundleHash"]; has && h != hash {
				t.Errorf("%s: bundle hash %v is not the protocol's 64 hex digits", state, h)
			}
			want, known := order[state]
			if state == "bootstrapping" {
				want, known = 0, true
			}
			if known && what == "nothing" && order[got] != want {
				t.Errorf("%s with every fact: shown as %s", state, got)
			}
			if known && order[got] > want {
				t.Errorf("%s without %s: shown as the later state %s", state, what, got)
			}
			if !known && got != state {
				t.Errorf("%s: shown as %s", state, got)
			}
		}
	}
	// a syncing placement whose bundle hash is not yet known is shown as provisioning
	p := full
	p.State, p.BundleHash = "syncing", ""
	if got := c.placementShape(s, p)["state"]; got != "provisioning" {
		t.Errorf("syncing without a bundle hash: shown as %v, want provisioning", got)
	}
}

// sessions.create with worktreeSource: only "empty" (a new workspace the gateway makes), never
// combined with cwd, refused before any session exists; when the workspace cannot be made the
// half-made session is archived and the refusal does not show the gateway's paths.
func TestCreateWithANewWorkspace(t *testing.T) {
	var made []string
	fail := false
	r := newRig(t, func(c *Config) {
		c.NewWorkspace = func(id string) (string, error) {
			if fail {
				return "", errors.New("mkdir /srv/secret-data/workspaces/" + id + ": permission denied")
			}
			dir := t.TempDir()
			made = append(made, dir)
			return dir, nil
		}
	})
	c := adminClient(t, r)
	count := func() int {
		list, err := r.sess.List(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	for _, tc := range []struct {
		params map[string]any
		msg    string
	}{
		{map[string]any{"worktreeSource": "repository"}, `worktreeSource must be "empty"`},
		{map[string]any{"worktreeSource": "empty", "cwd": t.TempDir()}, "cannot be combined with cwd"},
	} {
		m := call(c, "x", "sessions.create", tc.params)
		if _, msg, _ := errCode(m); m["ok"] == true || !strings.Contains(msg, tc.msg) {
			t.Errorf("sessions.create %v: %v, want an error saying %q", tc.params, m, tc.msg)
		}
	}
	if n := count(); n != 0 {
		t.Fatalf("refused creates left %d sessions", n)
	}
	m := call(c, "ok", "sessions.create", map[string]any{"worktreeSource": "empty", "label": "fresh"})
	if m["ok"] != true || len(made) != 1 {
		t.Fatalf("sessions.create empty: %v (made %v)", m, made)
	}
	s, err := r.sess.Get(testCtx(t), m["payload"].(map[string]any)["sessionId"].(string))
	if err != nil || s.Workspace != made[0] {
		t.Fatalf("new session %+v (%v), want workspace %s", s, err, made[0])
	}
	fail = true
	m = call(c, "bad", "sessions.create", map[string]any{"worktreeSource": "empty"})
	code, msg, _ := errCode(m)
	if m["ok"] == true || code != CodeUnavailable || strings.Contains(msg, "/srv") {
		t.Fatalf("sessions.create when the workspace cannot be made: %v", m)
	}
	list, _ := r.sess.List(testCtx(t))
	if len(list) != 2 {
		t.Fatalf("%d sessions, want the good one and the archived half-made one", len(list))
	}
	for _, s := range list {
		if s.Workspace == "" && s.ArchivedAt == nil {
			t.Fatalf("the session whose workspace could not be made is left live: %+v", s)
		}
	}
}

// A dispatch waiting on the sessions feed ends when the feed closes (the gateway stopping), with
// a retryable refusal naming the state, instead of joining the closed feed again and again.
func TestDispatchWaitEndsWhenTheFeedCloses(t *testing.T) {
	r, fp := placementRig(t)
	s, err := r.sess.Create(testCtx(t), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	c := adminClient(t, r)
	c.write(map[string]any{"type": "req", "id": "d", "method": "sessions.dispatch", "params": map[string]any{"key": sessionKeyFor(s.Agent, s.ID), "profileId": "stuck"}})
	for {
		if p, _ := fp.get(context.Background(), s.ID); p.State == "provisioning" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.sess.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// the refusal names the state the wait last read: requested if the feed closed before it read
	// the move to provisioning, provisioning otherwise
	m := c.res("d")
	if code, msg, _ := errCode(m); m["ok"] == true || code != CodeUnavailable ||
		!(strings.Contains(msg, "still provisioning") || strings.Contains(msg, "still requested")) {
		t.Fatalf("dispatch when the feed closed: %v", m)
	}
}
