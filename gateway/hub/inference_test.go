package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// proxyHarness is a hub with sessions and a catalog whose only model is served by a loopback
// OpenAI-compatible server, and a worker client of one attached session.
type proxyHarness struct {
	*harness
	st     *sessions.Store
	srv    *inferencetest.Server
	client *remote.Client
	cfg    remote.ClientConfig
}

func sseChunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
}

func newProxyHarness(t *testing.T, provider inferencetest.Handler) *proxyHarness {
	t.Helper()
	return newProxyHarnessWith(t, provider, nil)
}

// newProxyHarnessWith is newProxyHarness with mod applied to the hub's config.
func newProxyHarnessWith(t *testing.T, provider inferencetest.Handler, mod func(*hub.Config)) *proxyHarness {
	t.Helper()
	p := &proxyHarness{srv: inferencetest.NewServer(t, provider)}
	cat, err := inference.NewCatalog(inference.CatalogConfig{Default: "local/m1", Providers: map[string]inference.ProviderConfig{
		"local": {API: inference.APIOpenAICompletions, BaseURL: p.srv.URL, Models: []inference.ModelConfig{{ID: "m1", Cost: inference.Cost{Input: 1, Output: 2}}}},
	}}, nil, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	p.harness = newHarness(t, func(c *hub.Config) {
		p.st, err = sessions.New(sessions.Config{DB: c.DB})
		if err != nil {
			t.Fatal(err)
		}
		c.Sessions, c.Models = p.st, cat
		if mod != nil {
			mod(c)
		}
	})
	t.Cleanup(func() { _ = p.st.Close(context.Background()) })
	ctx := testContext(t)
	ses, err := p.st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	epoch, err := p.st.Attach(ctx, ses.ID, envA)
	if err != nil {
		t.Fatal(err)
	}
	cred := p.mint(envA, bundleA, time.Hour, nil)
	p.startTurn(envA, cred, ses.ID, epoch, "run-1")
	cfg := p.workerConfig(envA, cred, bundleA)
	cfg.SessionID, cfg.OwnerEpoch, cfg.DialTimeout = ses.ID, epoch, 2*time.Second
	p.cfg = remote.ClientConfig{Config: cfg, RunID: "run-1", RunEpoch: 1}
	p.client, err = remote.NewClient(p.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.client.Close() })
	return p
}

// startTurn runs the environment's worker (which accepts every turn) and has the gateway start turn
// runID of session on it, as placement does: only such a turn's calls are served.
func (h *harness) startTurn(env, cred, session string, ownerEpoch uint64, runID string) {
	h.t.Helper()
	ctx := testContext(h.t)
	wcfg := h.workerConfig(env, cred, bundleA)
	wcfg.Handler = func(context.Context, string, json.RawMessage) (any, *protocol.Error) {
		return protocol.TurnStartResult{Accepted: true}, nil
	}
	h.run(wcfg)
	if err := h.srv.WaitAdmitted(ctx, env); err != nil {
		h.t.Fatal(err)
	}
	h.runs.start(session, runID, 1) // admitted: the turn's row is written before the start is sent
	if _, err := h.srv.Request(ctx, env, protocol.MethodTurnStart, protocol.TurnStartParams{SessionID: session,
		OwnerEpoch: ownerEpoch, RunEpoch: 1, RunID: runID, ModelRef: "local/m1", Text: "go"}); err != nil {
		h.t.Fatal(err)
	}
}

func userContext(text string) protocol.Context {
	return protocol.Context{Messages: []protocol.Message{userMessage(text)}}
}

func (p *proxyHarness) startParams(turn, model string) map[string]any {
	return map[string]any{"sessionId": p.cfg.SessionID, "ownerEpoch": p.cfg.OwnerEpoch, "runEpoch": 1, "runId": "run-1",
		"turnId": turn, "modelRef": model, "context": userContext("hi"), "options": map[string]any{}}
}

// A worker that names a model outside the catalog, or adds a base URL, headers or a model object to
// its request, is refused, and nothing reaches the provider.
func TestInferenceRefusesUnapprovedRequests(t *testing.T) {
	p := newProxyHarness(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, sseChunk(`{"content":"should not happen"}`, "stop"), "data: [DONE]")
	})
	ctx := testContext(t)
	tooMany := p.startParams("t-many", "local/m1")
	msgs := make([]protocol.Message, protocol.MaxInferenceMessages+1)
	for i := range msgs {
		msgs[i] = userMessage("x")
	}
	tooMany["context"] = protocol.Context{Messages: msgs}
	for _, tc := range []struct {
		name   string
		mutate func(map[string]any)
		want   protocol.Code
	}{
		{"unapproved model", func(m map[string]any) { m["modelRef"] = "openai/gpt-5" }, protocol.CodeModelNotApproved},
		{"base url", func(m map[string]any) { m["baseUrl"] = p.srv.URL }, protocol.CodeInvalidContext},
		{"headers", func(m map[string]any) { m["headers"] = map[string]string{"Authorization": "Bearer x"} }, protocol.CodeInvalidContext},
		{"model object", func(m map[string]any) {
			m["model"] = map[string]any{"id": "m1", "baseUrl": p.srv.URL, "api": "openai-completions"}
		}, protocol.CodeInvalidContext},
		{"base url in options", func(m map[string]any) { m["options"] = map[string]any{"baseUrl": p.srv.URL} }, protocol.CodeInvalidContext},
		{"too many messages", func(m map[string]any) { m["context"] = tooMany["context"] }, protocol.CodeInvalidContext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := p.startParams("t-"+strings.ReplaceAll(tc.name, " ", "-"), "local/m1")
			tc.mutate(params)
			_, err := p.client.Call(ctx, protocol.MethodInferenceStart, params)
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != tc.want {
				t.Fatalf("start = %v, want %s", err, tc.want)
			}
		})
	}
	if n := len(p.srv.Requests()); n != 0 {
		t.Fatalf("the provider saw %d requests, want none", n)
	}
	// Audited in one row of the window, with the count.
	if rows := p.closedAuditRows("worker.inference.reject"); len(rows) != 1 || !strings.Contains(rows[0], "6 refused") {
		t.Fatalf("inference refusal audit rows = %q, want one counting 6", rows)
	}
}

// A call streams every event in order even when it is many times longer than the credit window
// (the worker's grants keep it going), and its terminal result is replayed, not re-requested, when
// the worker asks again after a reconnect.
func TestInferenceStreamsUnderCreditAndReplaysTerminal(t *testing.T) {
	const deltas = 3000 // ~ 200 bytes of frame each: several windows
	word := strings.Repeat("w", 40)
	p := newProxyHarness(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		events := []string{sseChunk(`{"role":"assistant","content":""}`, "")}
		for i := range deltas {
			events = append(events, sseChunk(fmt.Sprintf(`{"content":"%s%04d "}`, word, i), ""))
		}
		events = append(events, sseChunk(`{}`, "stop"), "data: [DONE]")
		inferencetest.SSE(w, events...)
	})
	ctx := testContext(t)
	var got []string
	msg, err := p.client.Infer(ctx, "call-1", "local/m1", userContext("go"), protocol.InferenceOptions{}, func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			got = append(got, ev.Delta)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != deltas || got[0] != word+"0000 " || got[deltas-1] != fmt.Sprintf("%s%04d ", word, deltas-1) {
		t.Fatalf("got %d deltas (first %q), want %d in order", len(got), got[0], deltas)
	}
	if msg.StopReason != protocol.StopStop || !strings.HasPrefix(msg.Text(), word+"0000 ") {
		t.Fatalf("final message: stop %q, text %.40q", msg.StopReason, msg.Text())
	}

	// The link drops; the worker asks again for the same call and gets the cached result.
	p.dropTunnel()
	p.listen()
	again, err := p.client.Infer(ctx, "call-1", "local/m1", userContext("go"), protocol.InferenceOptions{}, func(protocol.StreamEvent) error {
		t.Error("a replayed call streamed events")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if again.Text() != msg.Text() {
		t.Fatal("replayed message differs from the original")
	}
	if n := len(p.srv.Requests()); n != 1 {
		t.Fatalf("the provider saw %d requests, want 1 (the replay must not reach it)", n)
	}
	var outcome string
	var bytesOut int64
	if err := p.db.R.QueryRowContext(ctx, `SELECT outcome, bytes_out FROM inference_calls WHERE turn_id='call-1'`).Scan(&outcome, &bytesOut); err != nil {
		t.Fatal(err)
	}
	if outcome != "done" || bytesOut < int64(deltas*100) {
		t.Fatalf("accounting row: outcome %q, bytes out %d", outcome, bytesOut)
	}
	totals, err := p.srv2().InferenceTotals(ctx, envA)
	if err != nil || totals.Calls != 1 || totals.BytesOut != bytesOut {
		t.Fatalf("totals = %+v, %v", totals, err)
	}
}

func (p *proxyHarness) srv2() *hub.Server { return p.harness.srv }

// newHeldProxy is a proxy harness whose provider streams one text delta and then holds its
// request open; the channel is closed once the provider sees the request's connection close.
func newHeldProxy(t *testing.T) (*proxyHarness, <-chan struct{}) {
	t.Helper()
	closed := make(chan struct{})
	p := newProxyHarness(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		inferencetest.SSE(w, sseChunk(`{"role":"assistant","content":"Hel"}`, ""))
		<-r.Context().Done()
		close(closed)
	})
	return p, closed
}

// Cancelling a call while the provider streams closes the provider's HTTP request, and the call is
// recorded as aborted.
func TestInferenceCancelClosesProviderConnection(t *testing.T) {
	p, closed := newHeldProxy(t)
	ctx := testContext(t)
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err := p.client.Infer(callCtx, "call-1", "local/m1", userContext("go"), protocol.InferenceOptions{}, func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Infer = %v, want canceled", err)
	}
	recvChan(t, "the provider to see its connection close", closed)
	waitFor(t, "the call to be recorded as aborted", func() bool {
		var outcome string
		_ = p.db.R.QueryRowContext(ctx, `SELECT outcome FROM inference_calls WHERE turn_id='call-1'`).Scan(&outcome)
		return outcome == "aborted"
	})
}

// A stale owner cannot make calls.
func TestInferenceFencesStaleOwner(t *testing.T) {
	p := newProxyHarness(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, sseChunk(`{"content":"x"}`, "stop"), "data: [DONE]")
	})
	ctx := testContext(t)
	if _, err := p.st.Attach(ctx, p.cfg.SessionID, envA); err != nil {
		t.Fatal(err)
	}
	raw, err := p.client.Call(ctx, protocol.MethodInferenceStart, p.startParams("t1", "local/m1"))
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeEpochMismatch {
		t.Fatalf("start after the session was re-attached = %s, %v; want epoch-mismatch", raw, err)
	}
	if n := len(p.srv.Requests()); n != 0 {
		t.Fatalf("the provider saw %d requests", n)
	}
	_ = json.Valid
}

// A cancel frame naming the worker.inference.start request cancels that call: the provider's
// connection is closed.
func TestCancelFrameCancelsInferenceCall(t *testing.T) {
	p, closed := newHeldProxy(t)
	// This test speaks the protocol itself on the session's connection: the harness's client, which
	// connects for the same session in the background, would replace it.
	_ = p.client.Close()
	c := rawConn(t, p.harness)
	sendFrame(t, c, connectFrame(t, envA, p.cfg.Credential, bundleA, func(a *protocol.Admission) {
		a.SessionID, a.OwnerEpoch = p.cfg.SessionID, p.cfg.OwnerEpoch
	}))
	if f := recvFrame(t, c); f.Type != protocol.TypeRes || !f.OK {
		t.Fatalf("connect: %+v", f)
	}
	start, err := protocol.Request("s1", protocol.MethodInferenceStart, p.startParams("call-c", "local/m1"))
	if err != nil {
		t.Fatal(err)
	}
	sendFrame(t, c, start)
	for { // the call is accepted and streams its first event
		f := recvFrame(t, c)
		if f.Type == protocol.TypeRes && !f.OK {
			t.Fatalf("start refused: %+v", f.Error)
		}
		if f.Type == protocol.TypeEvent && strings.Contains(string(f.Payload), `"text_delta"`) {
			break // the provider is streaming: its request is in flight
		}
	}
	sendFrame(t, c, protocol.Frame{Type: protocol.TypeCancel, ID: "s1"})
	recvChan(t, "the provider to see its connection close", closed)
}

// boundCredential is a CallCredentials that binds key to envA's calls of local/m1, or refuses them
// with refuse once it is set.
type boundCredential struct {
	mu     sync.Mutex
	key    string
	refuse *protocol.Error
	asked  []string
}

func (b *boundCredential) CallCredential(_ context.Context, envID string, m inference.Model) (string, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, envID+" "+m.Ref)
	if b.refuse != nil {
		return "", false, b.refuse
	}
	return b.key, envID == envA && m.Ref == "local/m1", nil
}

// A call of an environment whose revision has a credential bound goes to the provider with that
// key (not the catalog's); once the binding refuses, the next call is refused before the provider
// sees anything, and the refusal is audited.
func TestInferenceUsesTheCallCredentialAndItsRefusal(t *testing.T) {
	bc := &boundCredential{key: "sk-bound-to-revision"}
	p := newProxyHarnessWith(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, sseChunk(`{"role":"assistant","content":"ok"}`, ""), sseChunk(`{}`, "stop"), "data: [DONE]")
	}, func(c *hub.Config) { c.CallCredentials = bc })
	ctx := testContext(t)
	if _, err := p.client.Infer(ctx, "call-1", "local/m1", userContext("go"), protocol.InferenceOptions{}, func(protocol.StreamEvent) error { return nil }); err != nil {
		t.Fatal(err)
	}
	reqs := p.srv.Requests()
	if len(reqs) != 1 || reqs[0].APIKey() != "sk-bound-to-revision" {
		t.Fatalf("provider requests %d, key %q; want one with the bound key", len(reqs), reqs[0].APIKey())
	}
	bc.mu.Lock()
	bc.refuse = protocol.Errorf(protocol.CodeCredentialUnavailable, "credential source s1 was withdrawn from revision r1")
	bc.mu.Unlock()
	_, err := p.client.Infer(ctx, "call-2", "local/m1", userContext("go"), protocol.InferenceOptions{}, func(protocol.StreamEvent) error { return nil })
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable || !strings.Contains(pe.Message, "withdrawn") {
		t.Fatalf("call after the refusal: %v, want credential-unavailable", err)
	}
	if n := len(p.srv.Requests()); n != 1 {
		t.Fatalf("the provider saw %d requests, want still 1", n)
	}
	var rows int
	if err := p.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM inference_calls WHERE turn_id='call-2'`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("a refused call left %d accounting rows (%v)", rows, err)
	}
	if rows := p.closedAuditRows("worker.inference.reject"); len(rows) != 1 || !strings.Contains(rows[0], "credential-unavailable") {
		t.Fatalf("refusal audit rows = %q", rows)
	}
	if strings.Join(bc.asked, ",") != envA+" local/m1,"+envA+" local/m1" {
		t.Fatalf("CallCredential asked for %q", bc.asked)
	}
}
