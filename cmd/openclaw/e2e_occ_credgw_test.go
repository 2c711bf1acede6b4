package main_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// cgOK calls a credential-gateway method requiring a 200.
func (g *gw) cgOK(method string, in any, out any) {
	g.t.Helper()
	if st, raw := g.occSide("credential-gateway", method, in, out); st != 200 {
		g.t.Fatalf("credential-gateway %s = %d %s", method, st, raw)
	}
}

// The OCC credential gateway on a real gateway: a source registered for a namespace and attached
// to a revision is the key a worker turn of that revision's environment sends to the provider (a
// loopback server speaking the Anthropic wire format); the gateway has no Anthropic credential of
// its own, and the value is nowhere in clear (database, WAL, log). Withdrawn, the revision's next
// turn is refused before the provider sees it; the source is then removed, twice.
func TestOCCCredentialSourceReachesTheRevisionsModelCalls(t *testing.T) {
	root := t.TempDir()
	provider := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.AnthropicText(w, "all done")
	})
	cfg := fastWorkerConfig + "models:\n  default: anthropic/m\n  providers:\n    anthropic: {api: anthropic-messages, baseUrl: " +
		provider.URL + ", models: [{id: m}]}\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	key := "sk-ant-e2e-" + strings.Repeat("7c", 12)

	namespace := map[string]any{"id": "ns_c", "name": "team-c", "status": "ready"}
	g.occOK("ensureNamespace", map[string]any{"namespace": namespace}, nil)
	g.occOK("bindAgent", map[string]any{"namespace": namespace, "agent": map[string]any{"id": "agent_c"}}, nil)
	src := map[string]any{"id": "src_c", "type": "anthropic"}
	var st struct{ State string }
	g.cgOK("registerSource", map[string]any{"namespace": namespace, "source": src,
		"input": map[string]any{"type": "anthropic", "config": map[string]any{}, "secrets": map[string]any{"apiKey": key}}}, &st)
	if st.State != "ready" {
		t.Fatalf("registerSource = %+v", st)
	}
	rev := occRevision("ns_c", "agent_c", "rev_c", nil)
	revCtx := map[string]any{"namespace": namespace, "revision": rev["revision"], "sources": []any{src}}
	var atts []struct{ SourceID, Ref string }
	g.cgOK("attachForRevision", revCtx, &atts)
	if len(atts) != 1 || atts[0].SourceID != "src_c" || atts[0].Ref == "" {
		t.Fatalf("attachForRevision = %+v, want one ref for src_c", atts)
	}
	// Turns of the agent's session are not routed onto the revision's environment yet (docs/occ.md,
	// known gaps), so a session with a workspace is placed on it the one way the gateway has: the
	// dispatcher's reuse of a ready environment, before prepareRevision first sees the revision
	// ready (from then on the environment is attached to the agent and never reused).
	var first occReadiness
	g.occOK("prepareRevision", rev, &first)
	if first.Ready || first.RuntimeFailure != nil {
		t.Fatalf("the first prepareRevision = %+v, want it pending", first)
	}
	env := g.waitReady(g.occEnv("ns_c", "agent_c", "rev_c").ID)
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	ses := g.newSession(ws, "")
	g.dispatchTo(ses, "local")
	if p := g.mustRest(ses, placement.Active).Placement; p.EnvironmentID != env.ID {
		t.Fatalf("session placed on %s, want the revision's environment %s", p.EnvironmentID, env.ID)
	}
	if r := g.occPrepareUntil(rev, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil }); !r.Ready {
		t.Fatalf("prepareRevision = %+v", r)
	}
	g.occOK("activateRevision", rev, nil)
	g.runTurn(ses, "hello", "worker")
	reqs := provider.Requests()
	if len(reqs) != 1 || reqs[0].APIKey() != key {
		t.Fatalf("the provider saw %d requests (first key %q), want one with the revision's source", len(reqs), firstKey(reqs))
	}
	var sts []struct{ SourceID, State string }
	g.cgOK("attachmentStatus", revCtx, &sts)
	if len(sts) != 1 || sts[0].State != "ready" {
		t.Fatalf("attachmentStatus = %+v", sts)
	}
	for _, f := range []string{"gateway.db", "gateway.db-wal"} {
		if b, _ := os.ReadFile(filepath.Join(g.dataDir, f)); bytes.Contains(b, []byte(key)) {
			t.Fatalf("%s holds the source's value in clear", f)
		}
	}
	if strings.Contains(g.log.String(), key) {
		t.Fatal("the gateway log carries the source's value")
	}

	withdraw := map[string]any{"namespace": namespace, "revision": rev["revision"], "sources": []any{src}, "sourceId": "src_c",
		"sandbox": map[string]any{"namespaceName": "team-c", "resourceName": env.ID, "agentId": "agent_c", "revisionId": "rev_c"}}
	var w struct{ State string }
	g.cgOK("withdraw", withdraw, &w)
	if w.State != "revoked" {
		t.Fatalf("withdraw = %+v", w)
	}
	// the worker turn's checkpoint holds the session until it is done
	for deadline := time.Now().Add(40 * time.Second); g.placement(ses).Placement.TurnRunID != ""; time.Sleep(20 * time.Millisecond) { // polling the API
		if time.Now().After(deadline) {
			t.Fatalf("the session is still held after its turn:\n%s", g.placement(ses))
		}
	}
	refused, code, err := g.send(ses, "again")
	if err != nil {
		t.Fatalf("send after withdraw: %d %v", code, err)
	}
	if refused = waitTurn(t, g, refused.RunID); refused.Status == turns.TurnDone || !strings.Contains(refused.Error, "withdrawn") {
		t.Fatalf("turn after withdraw: %s (%s), want it refused naming the withdrawal", refused.Status, refused.Error)
	}
	if n := len(provider.Requests()); n != 1 {
		t.Fatalf("the provider saw %d requests after the withdrawal, want still 1", n)
	}

	sourceCtx := map[string]any{"namespace": namespace, "source": src}
	for range 2 {
		g.cgOK("removeSource", sourceCtx, nil)
	}
	g.cgOK("sourceStatus", sourceCtx, &st)
	if st.State != "absent" {
		t.Fatalf("sourceStatus after removal = %+v", st)
	}
	g.occOK("retireRevision", rev, nil)
}

func firstKey(reqs []inferencetest.Request) string {
	if len(reqs) == 0 {
		return ""
	}
	return reqs[0].APIKey()
}
