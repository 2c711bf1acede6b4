package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// occ calls POST /occ/v1/compute/{method} (or GET the descriptor when method is "") with OCC's
// token and decodes the answer into out; it returns the HTTP status and the raw body.
func (g *gw) occ(method string, in any, out any) (int, string) {
	g.t.Helper()
	return g.occSide("compute", method, in, out)
}

// occSide is occ on either side: "compute" or "credential-gateway".
func (g *gw) occSide(side, method string, in any, out any) (int, string) {
	g.t.Helper()
	tok, err := os.ReadFile(filepath.Join(g.dataDir, "occ.token"))
	if err != nil {
		g.t.Fatal(err)
	}
	verb, url, body := http.MethodPost, "http://"+g.addr+"/occ/v1/"+side+"/"+method, []byte(nil)
	if method == "" {
		verb, url = http.MethodGet, "http://"+g.addr+"/occ/v1/"+side
	} else if body, err = json.Marshal(in); err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, verb, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("occ %s: %v", method, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(raw, out); err != nil {
			g.t.Fatalf("occ %s answer %s: %v", method, raw, err)
		}
	}
	return resp.StatusCode, string(raw)
}

// occOK is occ requiring a 200.
func (g *gw) occOK(method string, in any, out any) {
	g.t.Helper()
	if st, raw := g.occ(method, in, out); st != 200 {
		g.t.Fatalf("occ %s = %d %s", method, st, raw)
	}
}

type occReadiness struct {
	NamespaceID, AgentID, RevisionID string
	Ready                            bool
	PendingReason                    string
	RuntimeFailure                   *struct{ Component, Check, CheckedAt, Code string }
}

func occRevision(ns, agent, id string, config map[string]any) map[string]any {
	if config == nil {
		config = map[string]any{}
	}
	return map[string]any{"revision": map[string]any{"id": id, "namespaceId": ns, "agentId": agent, "revision": 1,
		"configuration": config, "harness": map[string]any{"id": "openclaw", "mode": "embedded"}}}
}

// occPrepareUntil repeats prepareRevision, as OCC does, until done says the answer is final.
func (g *gw) occPrepareUntil(rev map[string]any, done func(occReadiness) bool) occReadiness {
	g.t.Helper()
	var r occReadiness
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling, as OCC does
		r = occReadiness{}
		g.occOK("prepareRevision", rev, &r)
		if done(r) {
			return r
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("prepareRevision never reached the expected answer; last %+v", r)
		}
	}
}

// occEnv is the revision's current environment, from describeAgentRuntime.
func (g *gw) occEnv(ns, agent, rev string) envs.Environment {
	g.t.Helper()
	var d struct{ Workloads []struct{ Name string } }
	g.occOK("describeAgentRuntime", map[string]any{"binding": map[string]any{"namespace": map[string]any{"id": ns},
		"agent": map[string]any{"id": agent}, "revision": map[string]any{"id": rev}}, "options": map[string]any{}}, &d)
	if len(d.Workloads) != 1 {
		g.t.Fatalf("revision %s has %d workloads; want 1", rev, len(d.Workloads))
	}
	v, err := g.client.Environment(g.ctx(), d.Workloads[0].Name)
	if err != nil {
		g.t.Fatal(err)
	}
	return v.Environment
}

var reasonCharset = regexp.MustCompile(`^[A-Za-z0-9 ._:/@-]{1,256}$`)

// The OCC ComputeDriver contract walked through on a real gateway whose profiles lease real local
// boxes through a lease CLI (lease-dir + localbox), plus the failure paths a lease CLI injects.
func TestOCCComputeLifecycle(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	fullDir := filepath.Join(root, "full")
	cfg := "profiles:\n" + leaseDirProfile("occbox", leaseDir, nil) +
		leaseDirProfile("full", fullDir, map[string]string{"LEASE_DIR_WARMUP_FAIL": "capacity exhausted in zone z1"}) +
		leaseDirProfile("nobox", filepath.Join(root, "nobox"), map[string]string{"LEASE_DIR_LOCALBOX": ""}) +
		fmt.Sprintf(`  - id: broken
    provider: command
    settings:
      provision: [%[1]s, warmup, --lease-id, "{leaseId}"]
      inspect: [%[1]s, inspect, --id, "{leaseId}", --json]
      destroy: [%[1]s, stop, "{leaseId}"]
      list: [/bin/sh, -c, "echo 'token=SECRET-list-output <b> | ;' >&2; exit 7"]
      timeout: 3s
occ:
  defaultProfile: occbox
  endpointURL: ws://127.0.0.1:7999/
  namespaces:
    team-broken: {profile: broken}
    team-full: {profile: full}
    team-nobox: {profile: nobox}
    team-a: {profile: occbox, allowedProfiles: [nobox]}
`, leaseDirBin)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { stopLeaseDir(leaseDir) })

	// The descriptor lists every method.
	var desc struct {
		ID, Capability, ActivationOrder, RuntimeLogging string
		Methods                                         []string
	}
	g.occOK("", nil, &desc)
	if desc.Capability != "compute" || desc.ActivationOrder != "afterCommit" || desc.RuntimeLogging != "platform" || len(desc.Methods) != 18 {
		t.Fatalf("descriptor %+v", desc)
	}

	nsA := map[string]any{"namespace": map[string]any{"id": "ns_a", "name": "team-a", "status": "provisioning"}}
	t.Run("ensure twice", func(t *testing.T) {
		for range 2 {
			var res struct {
				NamespaceID    string
				NamespaceReady bool
				Failure        string
			}
			g.occOK("ensureNamespace", nsA, &res)
			if res.NamespaceID != "ns_a" || !res.NamespaceReady || res.Failure != "" {
				t.Fatalf("ensureNamespace = %+v", res)
			}
		}
		var res struct{ Failure, Reason string }
		g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_a", "name": "team-b"}}, &res)
		if res.Failure != "permanent" || !reasonCharset.MatchString(res.Reason) {
			t.Fatalf("the same id under another name = %+v; want a permanent failure", res)
		}
	})

	g.occOK("bindAgent", map[string]any{"namespace": map[string]any{"id": "ns_a", "name": "team-a"}, "agent": map[string]any{"id": "agent_1"}}, nil)
	rev1 := occRevision("ns_a", "agent_1", "rev_1", map[string]any{"model": "", "someOccKey": map[string]any{"x": 1}})
	var env1 envs.Environment
	t.Run("prepare until ready without a second lease", func(t *testing.T) {
		r := g.occPrepareUntil(rev1, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil })
		if !r.Ready || r.RevisionID != "rev_1" || r.NamespaceID != "ns_a" || r.AgentID != "agent_1" {
			t.Fatalf("prepareRevision = %+v", r)
		}
		calls := len(warmupCalls(t, leaseDir))
		g.occOK("prepareRevision", rev1, &r)
		if !r.Ready {
			t.Fatalf("repeated prepareRevision = %+v", r)
		}
		if n := len(warmupCalls(t, leaseDir)); n != calls || len(liveLeases(t, leaseDir)) != 1 {
			t.Fatalf("repeat leased again: %d warmup calls (was %d), %d live leases", n, calls, len(liveLeases(t, leaseDir)))
		}
		env1 = g.occEnv("ns_a", "agent_1", "rev_1")
		if env1.State != envs.Attached {
			t.Fatalf("a ready revision's environment is %s; want attached (never reused as a warm lease, never idle-stopped)", env1.State)
		}
		if _, err := g.destroy(env1.ID, false, 0); err == nil || !strings.Contains(err.Error(), "attached") {
			t.Fatalf("an unforced destroy of a serving revision's environment: %v; want it refused as attached", err)
		}
		if !strings.HasPrefix(env1.IdempotencyKey, "occ:ns_a:rev_1:") {
			t.Fatalf("the revision's environment does not carry its namespace: key %q", env1.IdempotencyKey)
		}
	})
	t.Run("activate twice", func(t *testing.T) {
		for range 2 {
			g.occOK("activateRevision", rev1, nil)
		}
		var ep string
		g.occOK("getGatewayEndpoint", rev1, &ep)
		if !regexp.MustCompile(`^ws://127\.0\.0\.1:7999/api/v1/sessions/ses_[0-9a-z]+/stream$`).MatchString(ep) {
			t.Fatalf("getGatewayEndpoint = %q", ep)
		}
	})
	t.Run("observation", func(t *testing.T) {
		binding := map[string]any{"binding": map[string]any{"namespace": map[string]any{"id": "ns_a"}, "agent": map[string]any{"id": "agent_1"},
			"revision": map[string]any{"id": "rev_1"}}}
		var diag struct {
			Checks []struct {
				Component, Check, State string
				CheckedAt               *string
			}
		}
		g.occOK("diagnoseAgentDeployment", binding, &diag)
		if len(diag.Checks) == 0 || len(diag.Checks) > 32 {
			t.Fatalf("diagnoseAgentDeployment: %d checks", len(diag.Checks))
		}
		for _, c := range diag.Checks {
			if c.State != "ok" || c.CheckedAt == nil {
				t.Errorf("check %s/%s = %s at %v on a serving revision", c.Component, c.Check, c.State, c.CheckedAt)
			}
		}
		binding["request"] = map[string]any{"tailLines": 3, "limitBytes": 300}
		var logs struct {
			Lines     []string
			Truncated bool
		}
		g.occOK("readAgentRuntimeLogs", binding, &logs)
		if len(logs.Lines) == 0 || len(logs.Lines) > 3 || len(strings.Join(logs.Lines, "\n")) > 300 {
			t.Fatalf("readAgentRuntimeLogs within 3 lines and 300 bytes = %q", logs.Lines)
		}
		binding["request"] = map[string]any{"limitBytes": 600 << 10}
		if st, raw := g.occ("readAgentRuntimeLogs", binding, nil); st != 400 || !strings.Contains(raw, "request.limitBytes") {
			t.Fatalf("a limit over 512 KiB = %d %s", st, raw)
		}
		var images []struct {
			Workload, Container string
			ImageID             *string
			Commit              *string
		}
		g.occOK("getRuntimeImages", rev1, &images)
		if len(images) != 1 || images[0].Workload != env1.ID || images[0].ImageID == nil || *images[0].ImageID != "sha256:"+env1.BundleHash {
			t.Fatalf("getRuntimeImages = %+v", images)
		}
		if c := images[0].Commit; c != nil && !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(*c) {
			t.Fatalf("commit %q is not a full lowercase SHA", *c)
		}
	})

	rev2 := occRevision("ns_a", "agent_1", "rev_2", nil)
	var env2 envs.Environment
	t.Run("second revision prepared while the first serves", func(t *testing.T) {
		r := g.occPrepareUntil(rev2, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil })
		if !r.Ready {
			t.Fatalf("rev_2 = %+v", r)
		}
		env2 = g.occEnv("ns_a", "agent_1", "rev_2")
		if env2.ID == env1.ID || len(liveLeases(t, leaseDir)) != 2 {
			t.Fatalf("rev_2 shares rev_1's environment or lease count is off (%d)", len(liveLeases(t, leaseDir)))
		}
		g.occOK("activateRevision", rev2, nil)
	})
	t.Run("stop twice", func(t *testing.T) {
		for range 2 {
			g.occOK("stopRevision", rev1, nil)
		}
		if e, _ := g.client.Environment(g.ctx(), env1.ID); e.State != envs.Destroyed {
			t.Fatalf("rev_1's environment after stop: %s", e.State)
		}
		if l := liveLeases(t, leaseDir); len(l) != 1 {
			t.Fatalf("live leases after stopping rev_1: %v", l)
		}
		if e, _ := g.client.Environment(g.ctx(), env2.ID); e.State != envs.Attached {
			t.Fatalf("stopping rev_1 touched rev_2's environment: %s", e.State)
		}
		var ep string
		g.occOK("getGatewayEndpoint", rev1, &ep)
		sid := ep[strings.Index(ep, "ses_"):strings.LastIndex(ep, "/")]
		if _, err := g.client.Session(g.ctx(), sid); err != nil {
			t.Fatalf("the agent's session after stop: %v", err)
		}
	})
	t.Run("retire revokes the worker credentials", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(env2.WorkerHome, ".openclaw-worker/state", env2.ID, "launch.json"))
		if err != nil {
			t.Fatal(err)
		}
		var d struct{ Credential string }
		if err := json.Unmarshal(raw, &d); err != nil || d.Credential == "" {
			t.Fatalf("launch descriptor: %v", err)
		}
		if live := liveWorkerCredentials(t, g, env2.ID); live == 0 {
			t.Fatal("rev_2's worker holds no live credential before retire")
		}
		g.occOK("retireRevision", rev2, nil)
		g.occOK("retireRevision", rev2, nil)
		if live := liveWorkerCredentials(t, g, env2.ID); live != 0 {
			t.Fatalf("%d credentials of rev_2's environment still live after retire", live)
		}
		db := openDB(t, g)
		if _, err := hub.NewCredentials(db).Verify(g.ctx(), d.Credential); !errors.Is(err, hub.ErrUnknownCredential) {
			t.Fatalf("a worker presenting rev_2's launch credential after retire: %v; want it refused as unknown", err)
		}
		if l := liveLeases(t, leaseDir); len(l) != 0 {
			t.Fatalf("leases left after retire: %v", l)
		}
		if st, raw := g.occ("prepareRevision", rev2, nil); st != 409 || !strings.Contains(raw, "REVISION_RETIRED") {
			t.Fatalf("prepare a retired revision = %d %s", st, raw)
		}
	})
	t.Run("delete refuses a namespace with an unretired revision", func(t *testing.T) {
		var res struct {
			NamespaceDeleted bool
			Failure, Reason  string
		}
		g.occOK("deleteNamespace", nsA, &res)
		if res.NamespaceDeleted || res.Failure == "" || !reasonCharset.MatchString(res.Reason) {
			t.Fatalf("deleteNamespace with stopped rev_1 = %+v", res)
		}
		// nothing was deleted: the stopped revision and the agent are still known
		if st, raw := g.occ("describeAgentRuntime", map[string]any{"binding": map[string]any{"namespace": map[string]any{"id": "ns_a"},
			"agent": map[string]any{"id": "agent_1"}, "revision": map[string]any{"id": "rev_1"}}}, nil); st != 200 {
			t.Fatalf("rev_1 after a refused delete: %d %s", st, raw)
		}
		var ep *string
		g.occOK("getGatewayEndpoint", rev1, &ep)
		if ep == nil {
			t.Fatal("the agent's binding went with a refused delete")
		}
	})
	t.Run("delete the empty namespace", func(t *testing.T) {
		g.occOK("retireRevision", rev1, nil)
		for range 2 { // absent counts as deleted
			var res struct {
				NamespaceDeleted bool
				Failure          string
			}
			g.occOK("deleteNamespace", nsA, &res)
			if !res.NamespaceDeleted || res.Failure != "" {
				t.Fatalf("deleteNamespace of the empty namespace = %+v", res)
			}
		}
		if st, raw := g.occ("prepareRevision", occRevision("ns_a", "agent_1", "rev_3", nil), nil); st != 409 || !strings.Contains(raw, "NAMESPACE_NOT_PREPARED") {
			t.Fatalf("prepare in a deleted namespace = %d %s", st, raw)
		}
	})

	t.Run("broken lease CLI", func(t *testing.T) {
		var res struct {
			NamespaceReady  bool
			Failure, Reason string
		}
		g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_broken", "name": "team-broken"}}, &res)
		if res.NamespaceReady || res.Failure != "retryable" {
			t.Fatalf("ensureNamespace with a failing list = %+v", res)
		}
		if !reasonCharset.MatchString(res.Reason) || strings.Contains(res.Reason, "SECRET") {
			t.Fatalf("reason %q breaks the charset or carries provider output", res.Reason)
		}
	})
	t.Run("capacity exhaustion", func(t *testing.T) {
		g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_full", "name": "team-full"}}, nil)
		r := g.occPrepareUntil(occRevision("ns_full", "agent_f", "rev_f", nil), func(r occReadiness) bool {
			return r.PendingReason != "" || r.Ready || r.RuntimeFailure != nil
		})
		if r.Ready || r.RuntimeFailure != nil || r.PendingReason != "WORKLOAD_UNSCHEDULABLE" {
			t.Fatalf("prepareRevision without capacity = %+v", r)
		}
		if l := liveLeases(t, fullDir); len(l) != 0 {
			t.Fatalf("leases without capacity: %v", l)
		}
	})
	t.Run("bootstrap failure", func(t *testing.T) {
		g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_nobox", "name": "team-nobox"}}, nil)
		r := g.occPrepareUntil(occRevision("ns_nobox", "agent_n", "rev_n", nil), func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil })
		if f := r.RuntimeFailure; f == nil || f.Code != "UNAVAILABLE" || f.Component == "" || f.Check == "" || f.CheckedAt == "" {
			t.Fatalf("prepareRevision on a box that cannot bootstrap = %+v", r)
		}
		if _, err := time.Parse(time.RFC3339Nano, r.RuntimeFailure.CheckedAt); err != nil {
			t.Fatalf("checkedAt %q: %v", r.RuntimeFailure.CheckedAt, err)
		}
	})
	t.Run("hostile input", func(t *testing.T) {
		g.occOK("ensureNamespace", nsA, nil)
		cases := []struct {
			name, method string
			body         any
			status       int
			want         string
		}{
			{"bad revision id", "prepareRevision", occRevision("ns_a", "agent_1", "rev 1; rm -rf /", nil), 400, "revision.id"},
			{"revision without namespace", "prepareRevision", map[string]any{"revision": map[string]any{"id": "r", "agentId": "a"}}, 400, "revision.namespaceId"},
			{"profile not allowed", "prepareRevision", occRevision("ns_a", "agent_1", "rev_x", map[string]any{"profileId": "full"}), 409, "PROVISIONING_REJECTED"},
			{"profileId of the wrong type", "prepareRevision", occRevision("ns_a", "agent_1", "rev_x", map[string]any{"profileId": 7}), 400, "revision.configuration.profileId"},
			{"dedicated harness", "prepareRevision", map[string]any{"revision": map[string]any{"id": "rev_d", "namespaceId": "ns_a", "agentId": "agent_1",
				"harness": map[string]any{"mode": "dedicated"}}}, 400, "revision.harness.mode"},
			{"namespace never ensured", "prepareRevision", occRevision("ns_nowhere", "agent_1", "rev_y", nil), 409, "NAMESPACE_NOT_PREPARED"},
			{"agent of another namespace", "bindAgent", map[string]any{"namespace": map[string]any{"id": "ns_full"}, "agent": map[string]any{"id": "agent_f2"}}, 200, ""},
			{"oauth harness auth", "validateHarnessAuth", map[string]any{"harness": map[string]any{"mode": "embedded"}, "auth": map[string]any{"method": "oauth"}}, 400, "auth.method"},
			{"unknown method", "launchMissiles", map[string]any{}, 404, "UNKNOWN_METHOD"},
			{"array body", "stopRevision", []int{1}, 400, "body"},
		}
		for _, c := range cases {
			st, raw := g.occ(c.method, c.body, nil)
			if st != c.status || !strings.Contains(raw, c.want) {
				t.Errorf("%s: %s = %d %s; want %d naming %s", c.name, c.method, st, raw, c.status, c.want)
			}
		}
		if st, raw := g.occ("bindAgent", map[string]any{"namespace": map[string]any{"id": "ns_a"}, "agent": map[string]any{"id": "agent_f2"}}, nil); st != 409 || !strings.Contains(raw, "FOREIGN_NAMESPACE") {
			t.Errorf("binding namespace ns_full's agent in ns_a = %d %s", st, raw)
		}
		for _, m := range []string{"validateHarnessAuth", "validateConfiguration"} {
			body := map[string]any{"harness": map[string]any{"mode": "embedded"}, "auth": map[string]any{"method": "api_key"}, "configuration": map[string]any{"profileId": "occbox"}}
			if st, raw := g.occ(m, body, nil); st != 200 {
				t.Errorf("%s of a supported combination = %d %s", m, st, raw)
			}
		}
		var yes bool
		g.occOK("requiresStoppedPredecessors", occRevision("ns_a", "agent_1", "rev_z", map[string]any{"requiresStoppedPredecessors": true}), &yes)
		if !yes {
			t.Error("requiresStoppedPredecessors ignores the configuration")
		}
		g.occOK("requiresStoppedPredecessors", occRevision("ns_a", "agent_1", "rev_z", nil), &yes)
		if yes {
			t.Error("requiresStoppedPredecessors defaults to true")
		}
	})
	t.Run("token rotation", func(t *testing.T) {
		old, err := os.ReadFile(filepath.Join(g.dataDir, "occ.token"))
		if err != nil {
			t.Fatal(err)
		}
		printed, err := exec.Command(openclawBin, "occ", "token", "--data-dir", g.dataDir).Output()
		if err != nil || strings.TrimSpace(string(printed)) != strings.TrimSpace(string(old)) {
			t.Fatalf("occ token printed %q, %v; want the token in occ.token", printed, err)
		}
		operator, err := os.ReadFile(filepath.Join(g.dataDir, "gateway.token"))
		if err != nil || strings.TrimSpace(string(operator)) == strings.TrimSpace(string(old)) {
			t.Fatal("OCC's token is the operator's token")
		}
		if out, err := exec.Command(openclawBin, "occ", "token", "--rotate", "--data-dir", g.dataDir).CombinedOutput(); err != nil {
			t.Fatalf("occ token --rotate: %v %s", err, out)
		}
		status := func(tok string) int {
			req, _ := http.NewRequestWithContext(g.ctx(), http.MethodGet, "http://"+g.addr+"/occ/v1/compute", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if st := status(strings.TrimSpace(string(old))); st != 401 {
			t.Fatalf("the old OCC token after --rotate: %d; want 401 from the running gateway", st)
		}
		if st := status(strings.TrimSpace(string(operator))); st != 401 {
			t.Fatalf("the operator's token on /occ/v1: %d; want 401", st)
		}
		g.occOK("", nil, nil) // the new token, read from occ.token
	})
	g.stop()
}

// liveWorkerCredentials counts the environment's unrevoked worker credentials.
func liveWorkerCredentials(t *testing.T, g *gw, envID string) int {
	t.Helper()
	var n int
	if err := openDB(t, g).R.QueryRowContext(g.ctx(), `SELECT COUNT(*) FROM worker_credentials WHERE environment_id=? AND revoked_at=''`, envID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// openDB opens the running gateway's database (WAL: readers beside its writer).
func openDB(t *testing.T, g *gw) *store.DB {
	t.Helper()
	db, err := store.Open(g.ctx(), filepath.Join(g.dataDir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// stopLeaseDir stops every lease lease-dir still holds in dir (cleanup after a failure).
func stopLeaseDir(dir string) {
	list := exec.Command(leaseDirBin, "list", "--json")
	list.Env = append(os.Environ(), "LEASE_DIR="+dir)
	out, err := list.Output()
	var leases []struct{ ID, State string }
	if err != nil || json.Unmarshal(out, &leases) != nil {
		return
	}
	for _, l := range leases {
		if l.State != "released" {
			stop := exec.Command(leaseDirBin, "stop", l.ID)
			stop.Env = append(os.Environ(), "LEASE_DIR="+dir)
			_ = stop.Run()
		}
	}
}

// The gateway is SIGKILLed while a prepareRevision's lease is being made: OCC's repeat after the
// restart adopts that lease instead of making a second.
func TestOCCPrepareAdoptsLeaseAfterGatewayKill(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	cfg := "profiles:\n" + leaseDirProfile("slow", leaseDir, map[string]string{"LEASE_DIR_WARMUP_DELAY": "1500ms"}) + "occ:\n  defaultProfile: slow\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { stopLeaseDir(leaseDir) })
	g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_k", "name": "team-k"}}, nil)
	rev := occRevision("ns_k", "agent_k", "rev_k", nil)
	var r occReadiness
	g.occOK("prepareRevision", rev, &r)
	if r.Ready {
		t.Fatal("ready before the lease CLI answered")
	}
	for deadline := time.Now().Add(10 * time.Second); len(warmupCalls(t, leaseDir)) == 0; time.Sleep(10 * time.Millisecond) { // polling the CLI's log
		if time.Now().After(deadline) {
			t.Fatal("lease CLI never called")
		}
	}
	g.kill()
	g.start()
	r = g.occPrepareUntil(rev, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil })
	if !r.Ready {
		t.Fatalf("prepareRevision after the restart = %+v", r)
	}
	e := g.occEnv("ns_k", "agent_k", "rev_k")
	for _, c := range warmupCalls(t, leaseDir) {
		if !strings.Contains(c, e.LeaseID) {
			t.Fatalf("warmup call %q does not carry the revision's lease %s", c, e.LeaseID)
		}
	}
	if live := liveLeases(t, leaseDir); len(live) != 1 || live[0]["id"] != e.LeaseID {
		t.Fatalf("live leases %v; want exactly %s", live, e.LeaseID)
	}
	g.occOK("retireRevision", rev, nil)
	if live := liveLeases(t, leaseDir); len(live) != 0 {
		t.Fatalf("leases left after retire: %v", live)
	}
	g.stop()
}

// The same contract against real OpenSSH sshd in a network namespace: a revision becomes ready on
// a netns box, its diagnosis and its log come from that box, and retiring it revokes the worker's
// credentials and releases the lease.
func TestOCCComputeNetns(t *testing.T) {
	profiles, _ := netnsProfile(t)
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), fastWorkerConfig+profiles+"occ:\n  defaultProfile: netns\n")
	g.occOK("ensureNamespace", map[string]any{"namespace": map[string]any{"id": "ns_n", "name": "team-n"}}, nil)
	rev := occRevision("ns_n", "agent_n", "rev_n1", nil)
	r := g.occPrepareUntil(rev, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil })
	if !r.Ready {
		t.Fatalf("prepareRevision on a netns box = %+v", r)
	}
	g.occOK("activateRevision", rev, nil)
	e := g.occEnv("ns_n", "agent_n", "rev_n1")
	binding := map[string]any{"binding": map[string]any{"namespace": map[string]any{"id": "ns_n"}, "agent": map[string]any{"id": "agent_n"},
		"revision": map[string]any{"id": "rev_n1"}}, "request": map[string]any{"tailLines": 5}}
	var diag struct {
		Checks []struct{ Component, Check, State string }
	}
	g.occOK("diagnoseAgentDeployment", binding, &diag)
	for _, c := range diag.Checks {
		if c.State != "ok" {
			t.Errorf("check %s/%s = %s on a serving netns revision", c.Component, c.Check, c.State)
		}
	}
	var logs struct{ Lines []string }
	g.occOK("readAgentRuntimeLogs", binding, &logs)
	if len(logs.Lines) == 0 || len(logs.Lines) > 5 {
		t.Fatalf("worker log lines from the netns box: %q", logs.Lines)
	}
	raw, err := os.ReadFile(filepath.Join(e.WorkerHome, ".openclaw-worker/state", e.ID, "launch.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Credential string }
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	g.occOK("retireRevision", rev, nil)
	if n := liveWorkerCredentials(t, g, e.ID); n != 0 {
		t.Fatalf("%d worker credentials live after retire", n)
	}
	if _, err := hub.NewCredentials(openDB(t, g)).Verify(g.ctx(), d.Credential); !errors.Is(err, hub.ErrUnknownCredential) {
		t.Fatalf("the retired revision's credential: %v; want refused", err)
	}
	if v, err := g.client.Environment(g.ctx(), e.ID); err != nil || v.Environment.State != envs.Destroyed {
		t.Fatalf("the retired revision's environment: %v %s", err, v.Environment.State)
	}
	g.stop()
}
