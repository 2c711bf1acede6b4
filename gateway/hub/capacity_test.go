package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// metricValue is the value of the series name{labels} in reg (0 when absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

// A gateway at capacity.maxWorkers refuses the worker of one more environment at admission, with
// capacity-exceeded and a retry hint, and records nothing for it; the admitted worker keeps being
// served, and its own reconnection (a replacement, not a new worker) is admitted.
func TestCapacityMaxWorkersRefusedAtAdmission(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *hub.Config) {
		c.Capacity = hub.Capacity{MaxWorkers: 1}
		c.Registerer = reg
	})
	ctx := testContext(t)
	credA, credB := h.mint(envA, bundleA, time.Hour, nil), h.mint(envB, bundleB, time.Hour, nil)
	a := rawConn(t, h)
	sendFrame(t, a, connectFrame(t, envA, credA, bundleA))
	if f := recvFrame(t, a); !f.OK {
		t.Fatalf("first worker refused: %+v", f.Error)
	}
	audits := func() int {
		var n int
		if err := h.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit WHERE kind='worker.admit'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := audits()

	b := rawConn(t, h)
	sendFrame(t, b, connectFrame(t, envB, credB, bundleB))
	f := recvFrame(t, b)
	if f.OK || f.Error.Code != protocol.CodeCapacityExceeded || f.Error.RetryAfterMs <= 0 || !f.Error.Retryable ||
		!strings.Contains(f.Error.Message, "capacity.maxWorkers") {
		t.Fatalf("worker of a second environment answered %+v, want capacity-exceeded naming capacity.maxWorkers with retryAfterMs", f.Error)
	}
	if _, _, err := b.Read(ctx); err == nil {
		t.Fatal("the refused connection stayed open")
	}
	if h.srv.Admitted(envB) || audits() != before {
		t.Fatalf("the refused worker was admitted (%v) or recorded (%d admissions, want %d)", h.srv.Admitted(envB), audits(), before)
	}
	if sh := h.srv.Backpressure(envB).Shedding; sh == nil || sh.Reason != hub.ReasonWorkers {
		t.Fatalf("the refused environment shows shedding %+v, want %s", sh, hub.ReasonWorkers)
	}

	// The admitted worker is served as before.
	hb, _ := protocol.Request("h1", protocol.MethodHeartbeat, struct{}{})
	sendFrame(t, a, hb)
	if f := recvFrame(t, a); f.ID != "h1" || !f.OK {
		t.Fatalf("heartbeat of the admitted worker answered %+v", f)
	}
	if got := metricValue(t, reg, "openclaw_capacity_rejections_total", "reason", hub.ReasonWorkers); got != 1 {
		t.Fatalf("openclaw_capacity_rejections_total{reason=%q} = %v, want 1", hub.ReasonWorkers, got)
	}
	if got := metricValue(t, reg, "openclaw_workers_connected"); got != 1 {
		t.Fatalf("openclaw_workers_connected = %v, want 1", got)
	}
	// A reconnection of the admitted environment replaces its connection: admitted at the limit.
	a2 := rawConn(t, h)
	sendFrame(t, a2, connectFrame(t, envA, credA, bundleA))
	if f := recvFrame(t, a2); !f.OK {
		t.Fatalf("replacement connection of the admitted environment refused: %+v", f.Error)
	}
}

// Model calls beyond capacity.maxInflightInference (gateway) or its per-environment bound are
// answered capacity-exceeded with retryAfterMs before reaching the provider; the admitted call
// runs to its terminal result, and afterwards a new call is served.
func TestCapacityInflightInference(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cap    hub.Capacity
		reason string
		msg    string
	}{
		{"gateway", hub.Capacity{MaxInflightInference: 1, MaxInflightInferencePerEnv: 1}, hub.ReasonInferenceGateway, "capacity.maxInflightInference"},
		{"environment", hub.Capacity{MaxInflightInference: 4, MaxInflightInferencePerEnv: 1}, hub.ReasonInferenceEnvironment, "capacity.maxInflightInferencePerEnvironment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			x := newHostile(t, func(c *hub.Config) { c.Capacity, c.Registerer = tc.cap, reg })
			c, frames := x.firstCall()
			recvChan(t, "the first call to reach the provider", x.models.started)
			if got := metricValue(t, reg, "openclaw_inference_inflight"); got != 1 {
				t.Fatalf("openclaw_inference_inflight = %v, want 1", got)
			}
			sendRaw(t, c, x.inferenceFrame("second", "run-1", "t2", []byte("hi")))
			f := recvChan(t, "the second call's answer", frames)
			if f.ID != "second" || f.OK || f.Error.Code != protocol.CodeCapacityExceeded || f.Error.RetryAfterMs <= 0 ||
				!strings.Contains(f.Error.Message, tc.msg) {
				t.Fatalf("second call answered %+v, want capacity-exceeded naming %s", f, tc.msg)
			}
			if sh := x.srv.Backpressure(envA).Shedding; sh == nil || sh.Reason != tc.reason {
				t.Fatalf("shedding %+v, want %s", sh, tc.reason)
			}
			if got := metricValue(t, reg, "openclaw_capacity_rejections_total", "reason", tc.reason); got != 1 {
				t.Fatalf("rejections{reason=%s} = %v, want 1", tc.reason, got)
			}
			close(x.models.release)
			for {
				f := recvChan(t, "the first call's terminal", frames)
				if f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceTerminal {
					var term protocol.InferenceTerminal
					if err := json.Unmarshal(f.Payload, &term); err != nil || term.Done == nil || term.TurnID != "t1" {
						t.Fatalf("terminal of the admitted call %s (%v), want done for t1", f.Payload, err)
					}
					break
				}
			}
			sendRaw(t, c, x.inferenceFrame("third", "run-1", "t3", []byte("hi")))
			if f := recvChan(t, "the third call's answer", frames); f.ID != "third" || !f.OK {
				t.Fatalf("call after the first ended answered %+v", f)
			}
		})
	}
}

// A model call refused for the calls in flight is told to retry after about as long as calls last
// (a place frees only when one ends), not after the fixed RetryAfter: the first call held 3 s of
// the injected clock, so the refusal of the next call over the limit says 3,000 ms.
func TestCapacityInflightRetryAfterFollowsCallDuration(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	x := newHostile(t, func(c *hub.Config) {
		c.Clock, c.RetryAfter = clk, 200*time.Millisecond
		c.Capacity = hub.Capacity{MaxInflightInference: 1, MaxInflightInferencePerEnv: 1}
	})
	x.startTurn("run-1")
	c := x.sessionConn()
	frames := reader(t, c)
	terminal := func(turn string) {
		t.Helper()
		for {
			f := recvChan(t, "the terminal of "+turn, frames)
			if f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceTerminal {
				return
			}
		}
	}
	refusal := func(id, turn string) *protocol.Error {
		t.Helper()
		sendRaw(t, c, x.inferenceFrame(id, "run-1", turn, []byte("hi")))
		f := recvChan(t, "the answer of "+id, frames)
		if f.ID != id || f.OK || f.Error.Code != protocol.CodeCapacityExceeded {
			t.Fatalf("%s answered %+v, want capacity-exceeded", id, f)
		}
		return f.Error
	}
	admitted := func(id, turn string) {
		t.Helper()
		sendRaw(t, c, x.inferenceFrame(id, "run-1", turn, []byte("hi")))
		if f := recvChan(t, "the answer of "+id, frames); f.ID != id || !f.OK {
			t.Fatalf("%s answered %+v, want it admitted", id, f)
		}
		recvChan(t, id+" to reach the provider", x.models.started)
	}
	release := x.models.release
	admitted("first", "t1")
	if e := refusal("early", "t0"); e.RetryAfterMs != 200 {
		t.Fatalf("refusal before any call ended says retryAfterMs %d, want RetryAfter (200)", e.RetryAfterMs)
	}
	clk.Advance(3 * time.Second)
	release <- struct{}{}
	terminal("t1")
	admitted("second", "t2")
	if e := refusal("third", "t3"); e.RetryAfterMs != 3000 {
		t.Fatalf("refusal after a 3 s call says retryAfterMs %d, want 3000", e.RetryAfterMs)
	}
	close(release)
	terminal("t2")
}

// emittingModels streams n text deltas of size bytes each, then finishes.
type emittingModels struct {
	n, size int
}

func (m emittingModels) Resolve(ref string) (inference.Model, error) {
	if ref != "test/m" {
		return inference.Model{}, fmt.Errorf("model %q is not in the catalog", ref)
	}
	return inference.Model{Ref: ref}, nil
}

func (m emittingModels) Stream(ctx context.Context, _ string, _ protocol.Context, _ inference.Options, emit inference.Emit) (protocol.Message, error) {
	var text strings.Builder
	for i := range m.n {
		d := fmt.Sprintf("%04d%s", i, strings.Repeat("z", m.size-4))
		text.WriteString(d)
		if err := emit(protocol.StreamEvent{Type: "text_delta", Delta: d}); err != nil {
			return protocol.Message{}, err
		}
	}
	return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopStop,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: text.String()}}}, nil
}

// An environment relaying more than capacity.maxRelayBytesPerSecond has its call paced, not cut:
// every event arrives, in order, once the clock lets the rate through; a new call while it is over
// its rate is refused with capacity-exceeded and a retry hint, and the environment shows why.
func TestCapacityRelayRatePacesAndRefuses(t *testing.T) {
	const events, size, rate = 12, 200, 1500
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	x := newHostile(t, func(c *hub.Config) {
		c.Models, c.Clock, c.Registerer = emittingModels{n: events, size: size}, clk, reg
		c.Capacity = hub.Capacity{MaxRelayBytesPerSecond: rate}
	})
	ctx := testContext(t)
	c, frames := x.firstCall()
	// The refusal audit keeps one timer; the paced relay waits on a second.
	if err := clk.WaitTimers(ctx, 2); err != nil {
		t.Fatalf("the relay was never paced: %v", err)
	}
	if sh := x.srv.Backpressure(envA).Shedding; sh == nil || sh.Reason != hub.ReasonRelayRate {
		t.Fatalf("shedding while paced %+v, want %s", sh, hub.ReasonRelayRate)
	}
	sendRaw(t, c, x.inferenceFrame("second", "run-1", "t2", []byte("hi")))

	var deltas []string
	delta := func(f protocol.Frame) error {
		var p protocol.InferenceEventPayload
		if err := json.Unmarshal(f.Payload, &p); err != nil {
			return err
		}
		deltas = append(deltas, p.Event.Delta)
		return nil
	}
	var refused *protocol.Error
	for refused == nil {
		switch f := recvChan(t, "the second call's answer", frames); {
		case f.ID == "second" && f.OK:
			t.Fatal("a call started while the environment is over its relay rate was accepted")
		case f.ID == "second":
			refused = f.Error
		case f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceEvent:
			if err := delta(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	tctx, done := context.WithCancel(ctx)
	collected := make(chan error, 1)
	go func() {
		defer done()
		for f := range frames {
			switch {
			case f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceEvent:
				if err := delta(f); err != nil {
					collected <- err
					return
				}
			case f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceTerminal:
				collected <- nil
				return
			}
		}
		collected <- fmt.Errorf("connection closed before the terminal")
	}()
	for tctx.Err() == nil {
		if clk.WaitTimers(tctx, 2) == nil {
			clk.Advance(time.Second)
		}
	}
	if err := recvChan(t, "the paced call's end", collected); err != nil {
		t.Fatal(err)
	}
	if refused.Code != protocol.CodeCapacityExceeded || refused.RetryAfterMs <= 0 ||
		!strings.Contains(refused.Message, "capacity.maxRelayBytesPerSecond") {
		t.Fatalf("call started while over the relay rate answered %+v, want capacity-exceeded naming the limit", refused)
	}
	if len(deltas) != events {
		t.Fatalf("%d events relayed, want all %d", len(deltas), events)
	}
	for i, d := range deltas {
		if !strings.HasPrefix(d, fmt.Sprintf("%04d", i)) {
			t.Fatalf("event %d is %.8q: out of order", i, d)
		}
	}
	if got := metricValue(t, reg, "openclaw_relay_bytes_total"); got < events*size {
		t.Fatalf("openclaw_relay_bytes_total = %v, want at least %d", got, events*size)
	}
	if got := metricValue(t, reg, "openclaw_relay_latency_seconds"); got != events {
		t.Fatalf("openclaw_relay_latency_seconds counted %v events, want %d", got, events)
	}
}

// firstCall starts run-1's turn and sends its first inference call ("first", turn t1) on the
// session's connection, which the hub admits; it returns the connection and its frames.
func (x *hostile) firstCall() (*websocket.Conn, <-chan protocol.Frame) {
	x.t.Helper()
	x.startTurn("run-1")
	c := x.sessionConn()
	frames := reader(x.t, c)
	sendRaw(x.t, c, x.inferenceFrame("first", "run-1", "t1", []byte("hi")))
	if f := recvChan(x.t, "the first call's answer", frames); f.ID != "first" || !f.OK {
		x.t.Fatalf("first call answered %+v", f)
	}
	return c, frames
}

// A worker that starts a model call and never grants it credit (it stops reading its events) does
// not hold the call's slots and provider stream: after Limits.CreditStall without credit, on the
// hub's clock, the call ends with an error terminal that says why, and its slot is free again.
func TestACallWithoutCreditEndsAfterTheStall(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	x := newHostile(t, func(c *hub.Config) {
		// more bytes than the default window: the call waits for a grant that never comes
		c.Models, c.Clock = emittingModels{n: 4000, size: 200}, clk
		c.Limits = hub.Limits{ConnCalls: 1, CreditStall: 30 * time.Second}
	})
	ctx := testContext(t)
	c, frames := x.firstCall()
	// The refusal audit keeps one timer; the call waiting for credit arms the second.
	if err := clk.WaitTimers(ctx, 2); err != nil {
		t.Fatalf("the call never waited for credit: %v", err)
	}
	sendRaw(t, c, x.inferenceFrame("second", "run-1", "t2", []byte("hi")))
	if f := answerTo(t, frames, "second"); f.OK || f.Error.Code != protocol.CodeCapacityExceeded {
		t.Fatalf("a second call while the first holds the only slot: %+v", f)
	}
	clk.Advance(30 * time.Second)
	var term protocol.InferenceTerminal
	for {
		f := recvChan(t, "the stalled call's terminal", frames)
		if f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceTerminal {
			if err := json.Unmarshal(f.Payload, &term); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if term.TurnID != "t1" || term.Error == nil || term.Error.Reason != protocol.StopError || !strings.Contains(term.Error.ErrorMessage, "granted no credit for 30s") {
		t.Fatalf("terminal of the stalled call: %+v %+v", term, term.Error)
	}
	// the slot is free again
	sendRaw(t, c, x.inferenceFrame("third", "run-1", "t3", []byte("hi")))
	if f := answerTo(t, frames, "third"); !f.OK {
		t.Fatalf("a call after the stalled one ended: %+v", f.Error)
	}
}
