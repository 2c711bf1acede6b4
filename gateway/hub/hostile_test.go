package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// countingModels is a provider that counts the calls it is asked to make and holds each until
// released, so a test sees how many calls are in flight at once.
type countingModels struct {
	calls   atomic.Int64
	started chan string // the turn id of each call, as it reaches the provider
	release chan struct{}
}

func newCountingModels() *countingModels {
	return &countingModels{started: make(chan string, 1024), release: make(chan struct{})}
}

func (m *countingModels) Resolve(ref string) (inference.Model, error) {
	if ref != "test/m" {
		return inference.Model{}, fmt.Errorf("model %q is not in the catalog", ref)
	}
	return inference.Model{Ref: ref}, nil
}

func (m *countingModels) Stream(ctx context.Context, _ string, _ protocol.Context, _ inference.Options, _ inference.Emit) (protocol.Message, error) {
	m.calls.Add(1)
	m.started <- "call"
	select {
	case <-m.release:
	case <-ctx.Done():
		return protocol.Message{}, ctx.Err()
	}
	return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopStop,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "ok"}}}, nil
}

// blockingTool is a gateway tool whose calls wait until released.
type blockingTool struct {
	running atomic.Int64
	entered chan struct{}
	release chan struct{}
}

func (b *blockingTool) Name() string { return "slow_search" }
func (b *blockingTool) Schema() protocol.Tool {
	return protocol.Tool{Name: "slow_search", Parameters: json.RawMessage(`{"type":"object"}`)}
}
func (b *blockingTool) Run(ctx context.Context, _ json.RawMessage) (tools.Result, error) {
	b.running.Add(1)
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return tools.Result{Content: []protocol.Content{{Type: protocol.ContentText, Text: "found"}}}, nil
}

// blockingContext serves worker.transcript.context from the store, after the test releases it.
type blockingContext struct {
	*sessions.Store
	entered chan struct{}
	release chan struct{}
}

func (b blockingContext) WorkerContext(ctx context.Context, p protocol.TranscriptContextParams) (protocol.TranscriptContextResult, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return b.Store.WorkerContext(ctx, p)
}

// hostile is a hub with sessions, the counting provider and the blocking tool, an attached session
// and a raw environment connection that answers the gateway's worker.turn.start.
type hostile struct {
	*harness
	st      *sessions.Store
	models  *countingModels
	tool    *blockingTool
	ctxs    blockingContext
	cred    string
	session string
	epoch   uint64
	env     *websocket.Conn
}

func newHostile(t *testing.T, mod func(*hub.Config)) *hostile {
	t.Helper()
	x := &hostile{models: newCountingModels(),
		tool: &blockingTool{entered: make(chan struct{}, 64), release: make(chan struct{})}}
	x.harness = newHarness(t, func(c *hub.Config) {
		st, err := sessions.New(sessions.Config{DB: c.DB})
		if err != nil {
			t.Fatal(err)
		}
		x.st = st
		x.ctxs = blockingContext{Store: st, entered: make(chan struct{}, 64), release: make(chan struct{})}
		c.Sessions, c.Models, c.GatewayTools = x.ctxs, x.models, []tools.Tool{x.tool}
		c.HeartbeatTimeout = time.Minute
		if mod != nil {
			mod(c)
		}
	})
	t.Cleanup(func() { _ = x.st.Close(context.Background()) })
	t.Cleanup(func() { // let held calls end before the server closes
		for _, ch := range []chan struct{}{x.models.release, x.tool.release, x.ctxs.release} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	})
	ctx := testContext(t)
	ses, err := x.st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	x.session = ses.ID
	if x.epoch, err = x.st.Attach(ctx, ses.ID, envA); err != nil {
		t.Fatal(err)
	}
	x.cred = x.mint(envA, bundleA, time.Hour, nil)
	x.env = x.admitRaw(connectFrame(t, envA, x.cred, bundleA))
	if err := x.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	return x
}

// admitRaw opens a raw connection and has it admitted with connect.
func (x *hostile) admitRaw(connect protocol.Frame) *websocket.Conn {
	x.t.Helper()
	c := rawConn(x.t, x.harness)
	c.SetReadLimit(64 << 20)
	sendFrame(x.t, c, connect)
	if f := recvFrame(x.t, c); !f.OK {
		x.t.Fatalf("connect refused: %+v", f.Error)
	}
	return c
}

// sessionConn opens a raw connection admitted for the test's session.
func (x *hostile) sessionConn() *websocket.Conn {
	x.t.Helper()
	return x.admitRaw(connectFrame(x.t, envA, x.cred, bundleA, func(a *protocol.Admission) {
		a.SessionID, a.OwnerEpoch = x.session, x.epoch
	}))
}

// startTurn has the gateway start run runID of the session, answered on the raw environment connection.
func (x *hostile) startTurn(runID string) {
	x.t.Helper()
	ctx := testContext(x.t)
	errc := make(chan error, 1)
	x.runs.start(x.session, runID, 1) // admitted: the turn's row is written before the start is sent
	go func() {
		_, err := x.srv.Request(ctx, envA, protocol.MethodTurnStart, protocol.TurnStartParams{SessionID: x.session,
			OwnerEpoch: x.epoch, RunEpoch: 1, RunID: runID, ModelRef: "test/m", Text: "go"})
		errc <- err
	}()
	f := recvFrame(x.t, x.env)
	if f.Type != protocol.TypeReq || f.Method != protocol.MethodTurnStart {
		x.t.Fatalf("environment connection got %+v, want worker.turn.start", f)
	}
	res, _ := protocol.Response(f.ID, protocol.TurnStartResult{Accepted: true})
	sendFrame(x.t, x.env, res)
	if err := recvChan(x.t, "the turn start", errc); err != nil {
		x.t.Fatal(err)
	}
}

// inferenceFrame is a worker.inference.start of the session with a user message of textLen bytes.
func (x *hostile) inferenceFrame(id, runID, turnID string, text []byte) []byte {
	head := fmt.Sprintf(`{"type":"req","id":%q,"method":"worker.inference.start","params":{"sessionId":%q,"ownerEpoch":%d,`+
		`"runEpoch":1,"runId":%q,"turnId":%q,"modelRef":"test/m","options":{},`+
		`"context":{"messages":[{"role":"user","timestamp":1,"content":[{"type":"text","text":"`,
		id, x.session, x.epoch, runID, turnID)
	tail := `"}]}]}}}`
	b := make([]byte, 0, len(head)+len(text)+len(tail))
	return append(append(append(b, head...), text...), tail...)
}

// answerTo skips frames until the answer to request id.
func answerTo(t *testing.T, frames <-chan protocol.Frame, id string) protocol.Frame {
	t.Helper()
	for {
		if f := recvChan(t, "the answer to "+id, frames); f.ID == id {
			return f
		}
	}
}

// reader collects every frame a raw connection receives, until it closes.
func reader(t *testing.T, c *websocket.Conn) <-chan protocol.Frame {
	t.Helper()
	out := make(chan protocol.Frame, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			f, err := protocol.Decode(b, protocol.DefaultFrameLimit)
			if err != nil {
				t.Errorf("gateway sent an invalid frame: %v", err)
				return
			}
			out <- f
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return out
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// 40 inference calls of 12 MiB context each on one connection: only the connection's cap (4 calls,
// 64 MiB) reach the provider; the others are answered capacity-exceeded with retryAfterMs, and the
// gateway's heap grows by far less than the 480 MiB the worker sent.
func TestHostileInferenceFloodIsCapped(t *testing.T) {
	const calls, size, heapBound = 40, 12 << 20, 200 << 20
	x := newHostile(t, nil)
	x.startTurn("run-1")
	c := x.sessionConn()
	frames := reader(t, c)
	text := []byte(strings.Repeat("x", size))
	before := heapInUse()

	for i := range calls {
		sendRaw(t, c, x.inferenceFrame("i"+strconv.Itoa(i), "run-1", "t"+strconv.Itoa(i), text))
	}
	var accepted, refused int
	for accepted+refused < calls {
		f := recvChan(t, "answers to the starts", frames)
		switch {
		case f.Type == protocol.TypeRes && f.OK:
			accepted++
		case f.Type == protocol.TypeRes && f.Error.Code == protocol.CodeCapacityExceeded:
			if f.Error.RetryAfterMs <= 0 || !f.Error.Retryable {
				t.Fatalf("capacity-exceeded without a retry hint: %+v", f.Error)
			}
			refused++
		case f.Type == protocol.TypeRes:
			t.Fatalf("start refused with %+v", f.Error)
		}
	}
	for range hub.DefaultConnCalls {
		recvChan(t, "a call to reach the provider", x.models.started)
	}
	growth := int64(heapInUse()) - int64(before)
	t.Logf("%d calls of %d MiB: %d accepted, %d refused; heap growth with the accepted ones in flight: %d MiB",
		calls, size>>20, accepted, refused, growth>>20)
	if accepted != hub.DefaultConnCalls || refused != calls-hub.DefaultConnCalls {
		t.Fatalf("%d accepted, %d refused; want %d accepted", accepted, refused, hub.DefaultConnCalls)
	}
	if growth > heapBound {
		t.Fatalf("heap grew by %d MiB with %d calls in flight, want < %d MiB", growth>>20, accepted, heapBound>>20)
	}
	close(x.models.release)
	for terminals := 0; terminals < accepted; {
		if f := recvChan(t, "terminal events", frames); f.Type == protocol.TypeEvent && f.Event == protocol.MethodInferenceTerminal {
			terminals++
		}
	}
	if n := x.models.calls.Load(); n != hub.DefaultConnCalls {
		t.Fatalf("the provider saw %d calls, want %d", n, hub.DefaultConnCalls)
	}
	// The budget is free again: a call after the others ended is served.
	sendRaw(t, c, x.inferenceFrame("again", "run-1", "t-again", []byte("hi")))
	if f := answerTo(t, frames, "again"); !f.OK {
		t.Fatalf("call after the flood refused: %+v", f.Error)
	}
}

// The bytes in flight are capped per connection, and calls and bytes per environment, over all its
// connections.
func TestHostileInflightBytesAndEnvironmentCaps(t *testing.T) {
	t.Run("bytes per connection", func(t *testing.T) {
		x := newHostile(t, func(c *hub.Config) {
			c.Limits = hub.Limits{ConnCalls: 16, ConnBytes: 30 << 20, EnvCalls: 16, EnvBytes: 30 << 20}
		})
		x.startTurn("run-1")
		c := x.sessionConn()
		frames := reader(t, c)
		text := []byte(strings.Repeat("y", 12<<20))
		for i := range 3 {
			sendRaw(t, c, x.inferenceFrame("b"+strconv.Itoa(i), "run-1", "b"+strconv.Itoa(i), text))
		}
		got := map[string]*protocol.Error{}
		for len(got) < 3 {
			if f := recvChan(t, "answers", frames); f.Type == protocol.TypeRes {
				got[f.ID] = f.Error
			}
		}
		if got["b0"] != nil || got["b1"] != nil || got["b2"] == nil || got["b2"].Code != protocol.CodeCapacityExceeded ||
			!strings.Contains(got["b2"].Message, "bytes in flight") {
			t.Fatalf("answers %+v; want the third 12 MiB call refused for bytes in flight", got)
		}
	})
	t.Run("calls per environment", func(t *testing.T) {
		x := newHostile(t, func(c *hub.Config) { c.Limits = hub.Limits{ConnCalls: 2, EnvCalls: 3} })
		x.startTurn("run-1")
		a, b := x.sessionConn(), x.env // two connections of the environment
		fa, fb := reader(t, a), reader(t, b)
		for i := range 2 {
			sendRaw(t, a, x.inferenceFrame("a"+strconv.Itoa(i), "run-1", "a"+strconv.Itoa(i), []byte("hi")))
		}
		for range 2 {
			if f := recvChan(t, "answers on the first connection", fa); !f.OK {
				t.Fatalf("first connection refused: %+v", f.Error)
			}
		}
		for i := range 2 {
			sendRaw(t, b, x.inferenceFrame("b"+strconv.Itoa(i), "run-1", "b"+strconv.Itoa(i), []byte("hi")))
		}
		var refusedB *protocol.Error
		for n := 0; n < 2; {
			if f := recvChan(t, "answers on the second connection", fb); f.Type == protocol.TypeRes {
				n++
				if !f.OK {
					refusedB = f.Error
				}
			}
		}
		if refusedB == nil || refusedB.Code != protocol.CodeCapacityExceeded || !strings.Contains(refusedB.Message, "environment") {
			t.Fatalf("fourth call of the environment answered %+v, want capacity-exceeded for the environment", refusedB)
		}
		for range 3 {
			recvChan(t, "a call to reach the provider", x.models.started)
		}
		if n, r := x.models.calls.Load(), x.srv.Backpressure(envA).Rejected; n != 3 || r != 1 {
			t.Fatalf("the provider saw %d calls (want 3), %d capacity rejections counted (want 1)", n, r)
		}
	})
}

// worker.tool.call and worker.transcript.context start goroutines too: they share the cap.
func TestHostileToolAndContextCallsAreCapped(t *testing.T) {
	x := newHostile(t, nil)
	x.startTurn("run-1")
	c := x.sessionConn()
	frames := reader(t, c)
	tool := func(id string) protocol.Frame {
		f, _ := protocol.Request(id, protocol.MethodToolCall, protocol.ToolCallParams{SessionID: x.session, OwnerEpoch: x.epoch,
			RunID: "run-1", ToolCallID: id, Name: "slow_search", Arguments: json.RawMessage(`{}`)})
		return f
	}
	for i := range 12 {
		sendFrame(t, c, tool("tool"+strconv.Itoa(i)))
	}
	cx, _ := protocol.Request("cx", protocol.MethodTranscriptContext, protocol.TranscriptContextParams{SessionID: x.session, OwnerEpoch: x.epoch})
	sendFrame(t, c, cx)
	refused := 0
	var cxErr *protocol.Error
	for refused < 12+1-hub.DefaultConnCalls {
		f := recvChan(t, "refusals", frames)
		if f.Type != protocol.TypeRes || f.OK {
			t.Fatalf("unexpected answer %+v while every slot is held", f)
		}
		if f.Error.Code != protocol.CodeCapacityExceeded {
			t.Fatalf("%s refused with %+v, want capacity-exceeded", f.ID, f.Error)
		}
		if f.ID == "cx" {
			cxErr = f.Error
		}
		refused++
	}
	for range hub.DefaultConnCalls {
		recvChan(t, "a tool call to run", x.tool.entered)
	}
	if n := x.tool.running.Load(); n != hub.DefaultConnCalls || cxErr == nil {
		t.Fatalf("%d tool calls ran (want %d), context refused: %v", n, hub.DefaultConnCalls, cxErr)
	}
	close(x.tool.release)
	for n := 0; n < hub.DefaultConnCalls; {
		if f := recvChan(t, "tool results", frames); f.Type == protocol.TypeRes && f.OK {
			n++
		}
	}
	close(x.ctxs.release)
	sendFrame(t, c, cx)
	if f := recvChan(t, "the context", frames); !f.OK {
		t.Fatalf("context after the tools ended: %+v", f.Error)
	}
}

// A tool call or spawn whose ids are over their bounds is refused invalid-frame before it runs,
// and writes no audit row: a worker cannot fill the audit table with megabytes of tool call id.
func TestHostileToolCallIDsAreBounded(t *testing.T) {
	var spawned atomic.Int64
	x := newHostile(t, func(c *hub.Config) {
		c.Spawn = func(context.Context, tools.Call, json.RawMessage) (protocol.ToolCallResult, *protocol.Error) {
			spawned.Add(1)
			return protocol.ToolCallResult{}, nil
		}
	})
	x.startTurn("run-1")
	c := x.sessionConn()
	frames := reader(t, c)
	long := strings.Repeat("i", 1<<20)
	tool, _ := protocol.Request("t1", protocol.MethodToolCall, protocol.ToolCallParams{SessionID: x.session, OwnerEpoch: x.epoch,
		RunID: "run-1", ToolCallID: long, Name: "slow_search", Arguments: json.RawMessage(`{}`)})
	spawn, _ := protocol.Request("s1", protocol.MethodSessionsSpawn, protocol.SessionsSpawnParams{SessionID: x.session, OwnerEpoch: x.epoch,
		RunID: "run-1", ToolCallID: long, Arguments: json.RawMessage(`{}`)})
	for _, f := range []protocol.Frame{tool, spawn} {
		sendFrame(t, c, f)
		res := recvChan(t, "the refusal", frames)
		if res.OK || res.Error == nil || res.Error.Code != protocol.CodeInvalidFrame {
			t.Fatalf("%s with a 1 MiB tool call id: %+v, want invalid-frame", f.Method, res.Error)
		}
	}
	if n, m := x.tool.running.Load(), spawned.Load(); n != 0 || m != 0 {
		t.Fatalf("%d tool calls and %d spawns ran", n, m)
	}
	var longest int
	if err := x.db.R.QueryRowContext(testContext(t), `SELECT COALESCE(MAX(LENGTH(detail)), 0) FROM audit`).Scan(&longest); err != nil {
		t.Fatal(err)
	}
	if longest > 1024 {
		t.Fatalf("an audit row of %d bytes", longest)
	}
}

// Calls must name the run of a turn the gateway started for the session and that still runs;
// anything else is unknown-run, reaches no provider or tool, and is audited in one row.
func TestHostileCallsOutsideStartedTurns(t *testing.T) {
	x := newHostile(t, nil)
	c := x.sessionConn()
	frames := reader(t, c)
	expectRefused := func(what string, f []byte, id string) {
		t.Helper()
		sendRaw(t, c, f)
		for {
			a := recvChan(t, what, frames)
			if a.ID != id {
				continue
			}
			if a.OK || a.Error.Code != protocol.CodeUnknownRun {
				t.Fatalf("%s: answer %+v, want unknown-run", what, a.Error)
			}
			return
		}
	}
	const flood = 50
	for i := range flood {
		id := "n" + strconv.Itoa(i)
		expectRefused("a call before any turn", x.inferenceFrame(id, "run-1", id, []byte("hi")), id)
	}
	x.startTurn("run-1")
	expectRefused("a call naming another run", x.inferenceFrame("other", "run-2", "other", []byte("hi")), "other")
	tool, _ := protocol.Request("tool", protocol.MethodToolCall, protocol.ToolCallParams{SessionID: x.session, OwnerEpoch: x.epoch,
		RunID: "run-9", ToolCallID: "tool", Name: "slow_search", Arguments: json.RawMessage(`{}`)})
	tb, _ := json.Marshal(tool)
	expectRefused("a tool call naming another run", tb, "tool")
	x.runs.end(x.session)
	expectRefused("a call of a turn that ended", x.inferenceFrame("late", "run-1", "late", []byte("hi")), "late")
	if n, m := x.models.calls.Load(), x.tool.running.Load(); n != 0 || m != 0 {
		t.Fatalf("the provider saw %d calls and the tool %d, want none", n, m)
	}
	rows := x.closedAuditRows("worker.inference.reject")
	if len(rows) != 1 || !strings.Contains(rows[0], fmt.Sprintf("%d refused", flood+3)) || !strings.Contains(rows[0], "unknown-run: ×") {
		t.Fatalf("audit rows %q, want one counting %d unknown-run refusals", rows, flood+3)
	}
}

// Credential refresh is rate limited per environment; the credentials it hands out stay valid until
// one of them is used, which revokes the ones it replaced.
func TestHostileCredentialRefresh(t *testing.T) {
	x := newHostile(t, nil)
	ctx := testContext(t)
	refresh := func(c *websocket.Conn, id string) protocol.Frame {
		t.Helper()
		req, _ := protocol.Request(id, protocol.MethodCredentialRefresh, nil)
		sendFrame(t, c, req)
		return recvFrame(t, c)
	}
	var issued []string
	var limited int
	for i := range 1000 {
		f := refresh(x.env, "r"+strconv.Itoa(i))
		if f.OK {
			var rr protocol.CredentialRefreshResult
			if err := protocol.DecodeParams(f.Payload, &rr); err != nil {
				t.Fatal(err)
			}
			issued = append(issued, rr.Credential)
			continue
		}
		if f.Error.Code != protocol.CodeCapacityExceeded || f.Error.RetryAfterMs <= 0 {
			t.Fatalf("refresh %d refused with %+v, want capacity-exceeded with retryAfterMs", i, f.Error)
		}
		limited++
	}
	if len(issued) != hub.DefaultRefreshBurst || limited != 1000-hub.DefaultRefreshBurst {
		t.Fatalf("%d refreshes granted, %d limited; want %d granted", len(issued), limited, hub.DefaultRefreshBurst)
	}
	x.offset.Add(int64(hub.DefaultRefreshInterval))
	if f := refresh(x.env, "later"); !f.OK {
		t.Fatalf("refresh one interval later: %+v", f.Error)
	} else {
		var rr protocol.CredentialRefreshResult
		_ = protocol.DecodeParams(f.Payload, &rr)
		issued = append(issued, rr.Credential)
	}
	live := func() int {
		var n int
		if err := x.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM worker_credentials WHERE revoked_at = ''`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := live(); n != 1+len(issued) {
		t.Fatalf("%d live credentials, want %d (the original and each refresh, none used yet)", n, 1+len(issued))
	}
	// Until the new credential is used, the old one still admits (a refresh answer lost in transit).
	x.admitRaw(connectFrame(t, envA, x.cred, bundleA))
	newest := issued[len(issued)-1]
	x.admitRaw(connectFrame(t, envA, newest, bundleA))
	if n := live(); n != 1 {
		t.Fatalf("%d live credentials after the newest was used, want 1", n)
	}
	for _, old := range append([]string{x.cred}, issued[:len(issued)-1]...) {
		if _, err := x.creds.Verify(ctx, old); !errors.Is(err, hub.ErrUnknownCredential) {
			t.Fatalf("a replaced credential still verifies: %v", err)
		}
	}
	c := rawConn(t, x.harness)
	sendFrame(t, c, connectFrame(t, envA, x.cred, bundleA))
	if f := recvFrame(t, c); f.OK || f.Error.Code != protocol.CodeUnauthorized {
		t.Fatalf("admission with a replaced credential: %+v, want unauthorized", f)
	}
	h := x.closedAuditRows("worker.credential.revoke")
	if len(h) != 1 || !strings.Contains(h[0], fmt.Sprintf("%d credentials replaced by", len(issued))) {
		t.Fatalf("revocation audit %q", h)
	}
}

// 500 garbage connections cost one audit row (with their count) per window, not one each.
func TestHostileRejectedConnectionsAuditedInAggregate(t *testing.T) {
	const n = 500
	h := newHarness(t, nil)
	start := time.Now()
	for range n {
		c := rawConn(t, h)
		sendRaw(t, c, []byte("hello"))
		if f := recvFrame(t, c); f.OK || f.Error.Code != protocol.CodeInvalidFrame {
			t.Fatalf("garbage answered %+v", f)
		}
		c.CloseNow()
	}
	windows := 1 + int(time.Since(start)/hub.DefaultRejectAuditWindow)
	rows := h.closedAuditRows("worker.reject")
	total := 0
	for _, r := range rows {
		var k int
		if _, err := fmt.Sscanf(strings.TrimSpace(r), "%d refused", &k); err != nil {
			t.Fatalf("audit row %q does not start with its count", r)
		}
		total += k
	}
	if len(rows) > windows || total != n {
		t.Fatalf("%d audit rows counting %d rejections, want at most %d rows counting %d", len(rows), total, windows, n)
	}
}

// Connections that are not admitted are capped per tunnel and closed after AdmissionTimeout, even
// when they never send an HTTP request.
func TestHostilePreAdmissionConnections(t *testing.T) {
	h := newHarness(t, func(c *hub.Config) { c.AdmissionTimeout = 300 * time.Millisecond })
	var idle []net.Conn
	for range hub.DefaultPreAdmission {
		c, err := net.Dial("unix", h.sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		idle = append(idle, c)
	}
	// While they hold every slot, a further connection is closed before it is served.
	ctx := testContext(t)
	waitFor(t, "a connection over the cap to be refused", func() bool {
		_, _, err := websocket.Dial(ctx, "ws://worker/worker", &websocket.DialOptions{HTTPClient: unixClient(h.sock)})
		return err != nil
	})
	// The idle ones are closed by the admission deadline (well before the 10s HTTP header timeout).
	for i, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("idle connection %d: read = %v, want it closed by the gateway", i, err)
		}
	}
	// The slots are free again: a worker is admitted.
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect after the idle ones were closed: %+v", f.Error)
	}
	rows := h.closedAuditRows("worker.reject")
	if len(rows) != 1 || !strings.Contains(rows[0], "capacity-exceeded: ×") {
		t.Fatalf("audit rows %q, want the refused connections counted", rows)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// taggedListener marks every connection as coming through env's tunnel, like tunnel.Mux does.
type taggedListener struct {
	net.Listener
	env string
}

type taggedConn struct {
	net.Conn
	env string
}

func (c taggedConn) TunnelEnvironment() string { return c.env }

func (l taggedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return taggedConn{c, l.env}, nil
}

var _ hub.TunnelConn = taggedConn{}

// A credential is admitted only on its own environment's tunnel, and a claimed session only if it
// is attached to the environment with that owner epoch.
func TestHostileAdmissionBinding(t *testing.T) {
	x := newHostile(t, nil)
	ctx := testContext(t)
	sockB := filepath.Join(filepath.Dir(x.sock), "b.sock")
	ln, err := net.Listen("unix", sockB)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = x.srv.Serve(taggedListener{ln, envB})
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	other, err := x.st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.st.Attach(ctx, other.ID, envB); err != nil {
		t.Fatal(err)
	}
	withSession := func(id string, epoch uint64) func(*protocol.Admission) {
		return func(a *protocol.Admission) { a.SessionID, a.OwnerEpoch = id, epoch }
	}
	for _, tc := range []struct {
		name string
		sock string
		mod  func(*protocol.Admission)
		want protocol.Code
	}{
		{"envA credential on envB's tunnel", sockB, nil, protocol.CodeWrongEnvironment},
		{"session of another environment", x.sock, withSession(other.ID, 1), protocol.CodeSessionNotAttached},
		{"unknown session", x.sock, withSession("ses_nope", 1), protocol.CodeSessionNotAttached},
		{"stale owner epoch", x.sock, withSession(x.session, x.epoch+1), protocol.CodeEpochMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := websocket.Dial(ctx, "ws://worker/worker", &websocket.DialOptions{HTTPClient: unixClient(tc.sock)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			var mods []func(*protocol.Admission)
			if tc.mod != nil {
				mods = append(mods, tc.mod)
			}
			sendFrame(t, c, connectFrame(t, envA, x.cred, bundleA, mods...))
			if f := recvFrame(t, c); f.OK || f.Error.Code != tc.want {
				t.Fatalf("connect answered %+v, want %s", f, tc.want)
			}
			if !tc.want.PermanentAdmission() {
				t.Fatalf("%s is not a permanent admission error: the worker would retry it forever", tc.want)
			}
		})
	}
	// The right session and epoch are admitted.
	x.sessionConn()
}

// A run that a live move stops gets run-yield for its next model call, which reaches no provider;
// its tool calls still run (they end the step it is in), and another run of the session is not
// stopped by it.
func TestAYieldingRunsModelCallStopsThere(t *testing.T) {
	x := newHostile(t, nil)
	c := x.sessionConn()
	frames := reader(t, c)
	answer := func(what string, f []byte, id string) protocol.Frame {
		t.Helper()
		sendRaw(t, c, f)
		for {
			if a := recvChan(t, what, frames); a.ID == id {
				return a
			}
		}
	}
	x.startTurn("run-1")
	x.runs.yield(x.session, "run-1")
	if a := answer("the yielding run's call", x.inferenceFrame("y1", "run-1", "y1", []byte("hi")), "y1"); a.OK || a.Error == nil || a.Error.Code != protocol.CodeRunYield || a.Error.Retryable {
		t.Fatalf("a model call of a yielding run: %+v, want run-yield, not retryable", a.Error)
	}
	if n := x.models.calls.Load(); n != 0 {
		t.Fatalf("the provider saw %d calls of a yielding run", n)
	}
	x.runs.end(x.session)
	x.startTurn("run-2")
	if a := answer("another run's call", x.inferenceFrame("y2", "run-2", "y2", []byte("hi")), "y2"); a.Error != nil && a.Error.Code == protocol.CodeRunYield {
		t.Fatalf("the next run's call was stopped by the earlier run's yield: %+v", a.Error)
	}
}
