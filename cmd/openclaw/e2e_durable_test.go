package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// durableConfig is fastWorkerConfig without relaunches: the tests kill the box's real worker and
// drive the protocol from the test process through the box's forwarded socket.
const durableConfig = `tunnel: {keepaliveInterval: 200ms, keepaliveTimeout: 1s, backoffMax: 500ms}
worker: {heartbeatTimeout: 1500ms, relaunchGrace: 1h, admitTimeout: 30s, requireKey: false}
`

// durable is a ready environment whose real worker was killed, with a session dispatched to it.
type durable struct {
	t       *testing.T
	g       *gw
	env     envs.Environment
	session string
	epoch   uint64
	desc    struct{ Credential, BundleHash string }
}

func newDurable(t *testing.T, g *gw, e envs.Environment) *durable {
	t.Helper()
	d := &durable{t: t, g: g, env: e}
	// the session goes onto the environment through dispatch while its real worker is admitted
	d.session = g.newSession(t.TempDir(), "")
	d.epoch = d.dispatch()
	pid := workerPID(t, e)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	raw, err := os.ReadFile(filepath.Join(e.WorkerHome, ".openclaw-worker/state", e.ID, "launch.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &d.desc); err != nil {
		t.Fatal(err)
	}
	return d
}

// newSession creates a session that is not on the environment.
func (d *durable) newSession() string {
	d.t.Helper()
	ses, err := d.g.client.CreateSession(d.g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: "durable"}})
	if err != nil {
		d.t.Fatal(err)
	}
	return ses.ID
}

// dispatch puts the session on the environment (a warm lease of its profile) and returns the
// owner epoch the worker holds it with.
func (d *durable) dispatch() uint64 {
	d.t.Helper()
	d.g.dispatchTo(d.session, d.env.ProfileID)
	p := d.g.mustRest(d.session, placement.Active).Placement
	if p.EnvironmentID != d.env.ID {
		d.t.Fatalf("session %s dispatched to %s, want the environment %s", d.session, p.EnvironmentID, d.env.ID)
	}
	return p.OwnerEpoch
}

// replaceOwner pulls the session back and dispatches it to the environment again: a newer owner
// epoch holds it. It returns that epoch.
func (d *durable) replaceOwner() uint64 {
	d.t.Helper()
	d.g.pullback(d.session)
	d.g.mustRest(d.session, placement.Local)
	return d.dispatch()
}

func (d *durable) config(epoch uint64) remote.Config {
	return remote.Config{SocketPath: d.env.WorkerSocket, EnvironmentID: d.env.ID, Credential: d.desc.Credential,
		BundleHash: d.desc.BundleHash, Tools: tools.Manifest(), SessionID: d.session, OwnerEpoch: epoch, Version: "e2e",
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, DialTimeout: 3 * time.Second}
}

// client is a worker client of the session at epoch. Its live events carry at most 16 bytes of
// merged deltas, so that the loads below stream hundreds of events across the faults.
func (d *durable) client(epoch uint64, outbox int) *remote.Client {
	d.t.Helper()
	c, err := remote.NewClient(remote.ClientConfig{Config: d.config(epoch), RunID: "run-e2e", OutboxLimit: outbox, LiveCoalesceBytes: 16})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = c.Close() })
	return c
}

// transcriptTexts returns the text of every transcript entry of a session, checking that they form
// one chain (each entry's parent is the previous entry).
func (d *durable) transcriptTexts(id string) []string {
	d.t.Helper()
	tr, err := d.g.client.Transcript(d.g.ctx(), id)
	if err != nil {
		d.t.Fatal(err)
	}
	var out []string
	parent := ""
	for i, e := range tr.Entries {
		if e.ParentID != parent {
			d.t.Fatalf("entry %d: parent %q, want %q (not one chain)", i, e.ParentID, parent)
		}
		parent = e.ID
		var m protocol.Message
		if err := json.Unmarshal(e.Content, &m); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, m.Text())
	}
	if tr.Session.LeafID != parent {
		d.t.Fatalf("leaf %q, want the last entry %q", tr.Session.LeafID, parent)
	}
	return out
}

// subscriber follows GET /sessions/:id/stream over WebSocket, reconnecting from its last cursor
// (also across gateway restarts: addr is read on every dial).
type subscriber struct {
	mu      sync.Mutex
	records []sessions.LiveRecord
	missed  uint64
	cancel  context.CancelFunc
	done    chan struct{}
}

func (d *durable) subscribe() *subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscriber{cancel: cancel, done: make(chan struct{})}
	tok, err := os.ReadFile(filepath.Join(d.g.dataDir, "gateway.token"))
	if err != nil {
		d.t.Fatal(err)
	}
	go func() {
		defer close(s.done)
		var cursor uint64
		for ctx.Err() == nil {
			s.mu.Lock()
			addr := d.g.addr
			s.mu.Unlock()
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			ws, _, err := websocket.Dial(dctx, fmt.Sprintf("ws://%s/api/v1/sessions/%s/stream?cursor=%d", addr, d.session, cursor),
				&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(tok))}}})
			dcancel()
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond): // redial pacing while the gateway restarts
				}
				continue
			}
			ws.SetReadLimit(1 << 20)
			for {
				var m sessions.StreamMessage
				if err := wsjson.Read(ctx, ws, &m); err != nil {
					break
				}
				s.mu.Lock()
				switch m.Type {
				case "gap":
					s.missed += m.Missed
				case "live":
					s.records = append(s.records, *m.LiveRecord)
					cursor = m.Cursor
				}
				s.mu.Unlock()
			}
			ws.CloseNow()
		}
	}()
	d.t.Cleanup(s.stop)
	return s
}

func (s *subscriber) stop() {
	s.cancel()
	<-s.done
}

// waitSeq waits until the subscriber has a record of seq (or saw a gap covering it).
func (s *subscriber) waitCount(t *testing.T, n int) []sessions.LiveRecord {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		got, missed := len(s.records), s.missed
		s.mu.Unlock()
		if uint64(got)+missed >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriber has %d records and %d missed, want %d", got, missed, n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	s.stop()
	return s.records
}

// lazySubscriber opens a stream WebSocket and never reads from it.
func (d *durable) lazySubscriber() {
	tok, _ := os.ReadFile(filepath.Join(d.g.dataDir, "gateway.token"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://%s/api/v1/sessions/%s/stream", d.g.addr, d.session),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(tok))}}})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { ws.CloseNow() })
}

// load runs a producer of live events and one of transcript commits until stop is closed and at
// least minEvents and minCommits were produced; it returns the last live seq, the number of deltas
// queued (d0, d1, …; the client merges consecutive ones into fewer events) and the committed texts.
func load(ctx context.Context, t *testing.T, c *remote.Client, stop <-chan struct{}, minEvents, minCommits int) (uint64, int, []string) {
	t.Helper()
	var wg sync.WaitGroup
	var texts []string
	var last uint64
	deltas := 0
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < minCommits || !stopped(); i++ {
			n := 1 + i%3
			var msgs []protocol.Message
			for j := range n {
				msgs = append(msgs, protocol.Message{Role: protocol.RoleUser, Timestamp: 1,
					Content: []protocol.Content{{Type: protocol.ContentText, Text: fmt.Sprintf("c%d-m%d", i, j)}}})
			}
			if _, err := c.Commit(ctx, msgs); err != nil {
				t.Errorf("commit %d: %v", i, err)
				return
			}
			for _, m := range msgs {
				texts = append(texts, m.Text())
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < minEvents || !stopped(); i++ {
			seq, err := c.Live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: fmt.Sprintf("d%d", i)})
			if err != nil {
				t.Errorf("live %d: %v", i, err)
				return
			}
			last = seq
			deltas++
		}
		if err := c.WaitLiveAcked(ctx, last); err != nil {
			t.Errorf("wait for ACK of %d: %v", last, err)
		}
	}()
	wg.Wait()
	return last, deltas, texts
}

// checkLive asserts that records are seqs 1..last of one run, each once, in order, and that
// their deltas, joined, are the deltas d0 … d(deltas-1) queued: every one once, in order.
func checkLive(t *testing.T, records []sessions.LiveRecord, last uint64, deltas int) {
	t.Helper()
	seen := map[uint64]bool{}
	var prev uint64
	var got, want strings.Builder
	for _, r := range records {
		if seen[r.Seq] {
			t.Fatalf("live seq %d delivered twice", r.Seq)
		}
		seen[r.Seq] = true
		if r.Seq != prev+1 {
			t.Fatalf("live seq %d after %d", r.Seq, prev)
		}
		got.WriteString(r.Event.Delta)
		prev = r.Seq
	}
	if uint64(len(records)) != last || prev != last {
		t.Fatalf("subscriber got %d records, last seq %d; want seqs 1..%d", len(records), prev, last)
	}
	for i := range deltas {
		fmt.Fprintf(&want, "d%d", i)
	}
	if got.String() != want.String() {
		t.Fatalf("the live events carry %d bytes of deltas, want %d: d0 … d%d, each once, in order", got.Len(), want.Len(), deltas-1)
	}
}

func checkTranscript(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("transcript has %d messages, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("transcript message %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// TestDurableNetnsLinkCuts: against real OpenSSH sshd in a network namespace, a worker streams
// thousands of live events and commits many transcript batches while the link is cut and restored
// three times; afterwards the transcript has every committed message once, in order, and a
// subscriber got every acknowledged live event once, in order, while another subscriber never read.
func TestDurableNetnsLinkCuts(t *testing.T) {
	g, e, state := netnsEnv(t, durableConfig)
	d := newDurable(t, g, e)
	sub := d.subscribe()
	d.lazySubscriber()
	c := d.client(d.epoch, 256)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := goLoad(ctx, t, c, stop, 3000, 60)
	link := func(dir string) {
		if out, err := exec.Command(leaseNetnsBin, "--state-dir", state, "link", "--id", e.LeaseID, dir).CombinedOutput(); err != nil {
			t.Fatalf("link %s: %v %s", dir, err, out)
		}
	}
	if err := c.WaitLiveAcked(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		before := c.Stats().Connects
		link("down")
		g.waitEnv(e.ID, func(e envs.Environment) bool { return e.TunnelStatus == "reconnecting" })
		link("up")
		waitUntil(t, 30*time.Second, func() string {
			return fmt.Sprintf("worker client did not reconnect after link up (stats %+v)", c.Stats())
		}, func() bool { return c.Stats().Connects != before })
	}
	close(stop)
	res := recvOrFail(t, done, 60*time.Second)
	if t.Failed() {
		return
	}
	if n := c.Stats().Connects; n < 4 {
		t.Fatalf("%d connections, want one per link cut plus the first", n)
	}
	checkTranscript(t, d.transcriptTexts(d.session), res.texts)
	records := sub.waitCount(t, int(res.last))
	if sub.missed != 0 {
		t.Fatalf("subscriber missed %d events although the gateway stayed up", sub.missed)
	}
	checkLive(t, records, res.last, res.deltas)
	t.Logf("%d live events, %d messages, client stats %+v", res.last, len(res.texts), c.Stats())
}

// loadResult is what a load ended with: the last live event's sequence, the deltas queued and the
// committed texts.
type loadResult struct {
	last   uint64
	deltas int
	texts  []string
}

// goLoad runs load on its own goroutine; its result arrives on the channel returned.
func goLoad(ctx context.Context, t *testing.T, c *remote.Client, stop <-chan struct{}, minEvents, minCommits int) <-chan loadResult {
	done := make(chan loadResult, 1)
	go func() {
		last, deltas, texts := load(ctx, t, c, stop, minEvents, minCommits)
		done <- loadResult{last, deltas, texts}
	}()
	return done
}

func recvOrFail[T any](t *testing.T, ch <-chan T, d time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %s", d)
	}
	panic("unreachable")
}

// TestDurableGatewayKilledLocalBox: the gateway is SIGKILLed mid-stream and restarted; the worker
// client reconnects through the re-opened tunnel, resumes from the persisted cursors, and nothing is
// lost or duplicated: the transcript has every message once, in order, and the subscriber, which
// reconnects from its last cursor, gets every acknowledged live event exactly once, in order, with
// no gap; so does a subscriber that starts after the restart (retained events are replayed from
// SQLite).
func TestDurableGatewayKilledLocalBox(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), durableConfig)
	e := g.waitReady(g.createEnv("local").ID)
	t.Cleanup(func() { _, _ = g.destroy(e.ID, false, 30*time.Second) })
	d := newDurable(t, g, e)
	sub := d.subscribe()
	c := d.client(d.epoch, 256)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := goLoad(ctx, t, c, stop, 1500, 40)
	waitUntil(t, 30*time.Second, func() string { return fmt.Sprintf("no progress before the kill: %+v", c.Stats()) },
		func() bool { return c.LiveAcked() >= 300 })
	g.kill()
	sub.mu.Lock() // the subscriber reads g.addr under its lock
	g.start()
	sub.mu.Unlock()
	waitUntil(t, 30*time.Second, func() string {
		return fmt.Sprintf("worker client did not resume after the gateway restart: %+v", c.Stats())
	}, func() bool { return c.Stats().Connects >= 2 })
	close(stop)
	res := recvOrFail(t, done, 60*time.Second)
	if t.Failed() {
		return
	}
	checkTranscript(t, d.transcriptTexts(d.session), res.texts)
	records := sub.waitCount(t, int(res.last))
	if sub.missed != 0 {
		t.Fatalf("subscriber was told it missed %d events across the crash; every acknowledged event must be replayed", sub.missed)
	}
	checkLive(t, records, res.last, res.deltas)
	// A subscriber that starts after the restart gets the whole stream, including what was
	// acknowledged before the crash (fewer events than sessions.DefaultRetention).
	if res.last >= sessions.DefaultRetention {
		t.Fatalf("%d live events exceed the retention of %d; the replay check needs fewer", res.last, sessions.DefaultRetention)
	}
	late := d.subscribe()
	records = late.waitCount(t, int(res.last))
	if late.missed != 0 {
		t.Fatalf("a subscriber from cursor 0 after the restart was told it missed %d events", late.missed)
	}
	checkLive(t, records, res.last, res.deltas)
	t.Logf("%d live events, %d messages, client stats %+v", res.last, len(res.texts), c.Stats())
}

// rawWorker is a hand-driven worker connection through the box's forwarded socket.
type rawWorker struct {
	t  *testing.T
	ws *websocket.Conn
	n  int
}

func (d *durable) rawWorker() *rawWorker {
	d.t.Helper()
	sock := d.env.WorkerSocket
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://worker/worker", &websocket.DialOptions{HTTPClient: client})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(protocol.DefaultFrameLimit)
	w := &rawWorker{t: d.t, ws: ws}
	adm := protocol.Admission{EnvironmentID: d.env.ID, Credential: d.desc.Credential, OwnerEpoch: 1,
		Handshake: protocol.Handshake{BundleHash: d.desc.BundleHash, Version: protocol.ProtocolVersion, ProtocolFeatures: protocol.Features,
			Tools: tools.Manifest()}}
	f := w.call(protocol.MethodConnect, protocol.ConnectParams{Role: protocol.RoleWorker, Admission: adm})
	if !f.OK {
		d.t.Fatalf("raw worker not admitted: %v", f.Error)
	}
	return w
}

func (w *rawWorker) call(method string, params any) protocol.Frame {
	w.t.Helper()
	w.n++
	id := fmt.Sprint(w.n)
	req, err := protocol.Request(id, method, params)
	if err != nil {
		w.t.Fatal(err)
	}
	b, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := w.ws.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatal(err)
	}
	for {
		_, raw, err := w.ws.Read(ctx)
		if err != nil {
			w.t.Fatalf("%s: %v", method, err)
		}
		f, err := protocol.Decode(raw, protocol.DefaultFrameLimit)
		if err != nil {
			w.t.Fatal(err)
		}
		if f.Type == protocol.TypeRes && f.ID == id {
			return f
		}
	}
}

// expect asserts that a call was refused with code.
func (w *rawWorker) expect(what string, code protocol.Code, method string, params any) {
	w.t.Helper()
	f := w.call(method, params)
	if f.OK || f.Error.Code != code {
		w.t.Errorf("%s: answer ok=%v %v, want %s", what, f.OK, f.Error, code)
	}
}

func commitParams(session string, epoch, seq uint64, msgs ...json.RawMessage) protocol.TranscriptCommitParams {
	return protocol.TranscriptCommitParams{Scope: protocol.Scope{SessionID: session, OwnerEpoch: epoch,
		StreamKind: protocol.StreamTranscript, RunEpoch: 1, Seq: seq, RunID: "r"}, Messages: msgs}
}

const okMessage = `{"role":"user","content":[{"type":"text","text":"hi"}],"timestamp":1}`

// TestDurableFencingAndHostileFramesLocalBox: through the real tunnel, a stale worker (older owner
// epoch) is refused on every frame after a newer owner is attached; a worker addressing another
// session, calling a method outside the allowlist, sending an oversized batch or entry ids of its
// own is refused with the matching code; nothing of it is written.
func TestDurableFencingAndHostileFramesLocalBox(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), durableConfig)
	e := g.waitReady(g.createEnv("local").ID)
	t.Cleanup(func() { _, _ = g.destroy(e.ID, false, 30*time.Second) })
	d := newDurable(t, g, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The first owner writes.
	a := d.client(d.epoch, 0)
	if _, err := a.Commit(ctx, []protocol.Message{{Role: protocol.RoleUser, Timestamp: 1,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "first owner"}}}}); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 5 {
		seq, err := a.Live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	if err := a.WaitLiveAcked(ctx, last); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	want := []string{"first owner"}

	// Hostile frames from an admitted worker.
	other := d.newSession()
	w := d.rawWorker()
	msg := json.RawMessage(okMessage)
	w.expect("another session's id", protocol.CodeSessionNotAttached, protocol.MethodTranscriptCommit, commitParams(other, 1, 1, msg))
	w.expect("another session's live stream", protocol.CodeSessionNotAttached, protocol.MethodLiveEvent, protocol.LiveEventParams{
		Scope: protocol.Scope{SessionID: other, OwnerEpoch: 1, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: 1},
		Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "x"}})
	w.expect("method outside the allowlist", protocol.CodeMethodNotAllowed, "worker.files.read", map[string]string{})
	w.expect("gateway method", protocol.CodeMethodNotAllowed, protocol.MethodShutdown, nil)
	big := make([]json.RawMessage, 65)
	for i := range big {
		big[i] = msg
	}
	w.expect("oversized batch", protocol.CodeInvalidBatch, protocol.MethodTranscriptCommit, commitParams(d.session, d.epoch, 10, big...))
	for _, k := range []string{"id", "parentId", "entryId", "sessionId"} {
		smuggled := json.RawMessage(`{"` + k + `":"ent_mine","role":"user","content":[{"type":"text","text":"x"}],"timestamp":1}`)
		w.expect("message with "+k, protocol.CodeInvalidBatch, protocol.MethodTranscriptCommit, commitParams(d.session, d.epoch, 11, smuggled))
	}
	w.expect("unknown params field", protocol.CodeInvalidBatch, protocol.MethodTranscriptCommit, map[string]any{
		"sessionId": d.session, "ownerEpoch": d.epoch, "streamKind": "transcript", "runEpoch": 1, "seq": 12, "runId": "r",
		"baseLeafId": "", "messages": []json.RawMessage{msg}, "entryIds": []string{"ent_mine"}})
	w.expect("live stream kind on a commit", protocol.CodeInvalidBatch, protocol.MethodTranscriptCommit, protocol.TranscriptCommitParams{
		Scope: protocol.Scope{SessionID: d.session, OwnerEpoch: d.epoch, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: 13}, Messages: []json.RawMessage{msg}})

	// A newer owner holds the session: the old epoch is refused on every frame, deterministically.
	stale := d.epoch
	newer := d.replaceOwner()
	if newer <= stale {
		t.Fatalf("a new dispatch did not advance the owner epoch: %d → %d", stale, newer)
	}
	for i := range 20 {
		w.expect(fmt.Sprintf("stale commit %d", i), protocol.CodeEpochMismatch, protocol.MethodTranscriptCommit,
			commitParams(d.session, stale, uint64(100+i), msg))
		w.expect(fmt.Sprintf("stale live event %d", i), protocol.CodeEpochMismatch, protocol.MethodLiveEvent, protocol.LiveEventParams{
			Scope: protocol.Scope{SessionID: d.session, OwnerEpoch: stale, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: uint64(6 + i)},
			Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "stale"}})
	}
	w.expect("stale resume", protocol.CodeEpochMismatch, protocol.MethodResume, protocol.ResumeParams{SessionID: d.session, OwnerEpoch: stale})
	checkTranscript(t, d.transcriptTexts(d.session), want)
	checkTranscript(t, d.transcriptTexts(other), nil)

	// The newer owner resumes at the gateway's cursors and writes.
	f := w.call(protocol.MethodResume, protocol.ResumeParams{SessionID: d.session, OwnerEpoch: newer})
	var r protocol.ResumeResult
	if !f.OK || protocol.DecodeParams(f.Payload, &r) != nil || r.OwnerEpoch != newer || r.LeafID == "" || r.LastCommitted.Seq != 0 {
		t.Fatalf("resume for the newer owner: %+v %s", f.Error, f.Payload)
	}
	w.ws.CloseNow()
	b := d.client(newer, 0)
	if _, err := b.Commit(ctx, []protocol.Message{{Role: protocol.RoleUser, Timestamp: 1,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "second owner"}}}}); err != nil {
		t.Fatal(err)
	}
	checkTranscript(t, d.transcriptTexts(d.session), append(want, "second owner"))
}
