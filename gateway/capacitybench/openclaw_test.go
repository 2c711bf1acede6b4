package capacitybench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/testrig/netnsbox"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// The OpenClaw-protocol door (issue 34, section 4 "Speed"): the turns of section (a) stream
// doorTokens tokens at doorRate per second, doorRounds times after a warm-up; section (b) holds
// doorClients protocol clients, each following one of doorSessions sessions, while every session
// streams one turn of doorLoadTokens tokens at doorLoadRate per second.
const (
	doorTokens     = 200
	doorRate       = 100
	doorRounds     = 5
	doorClients    = 500
	doorSessions   = 20
	doorLoadTokens = 50
	doorLoadRate   = 50
	// doorDialers is how many clients connect at once in (b).
	doorDialers = 25
)

// doorAsk is the message of a turn: the model server streams what it names.
var doorAsk = regexp.MustCompile(`tokens (\d+) at (\d+)/s`)

func doorMessage(tokens, rate int) string { return fmt.Sprintf("tokens %d at %d/s", tokens, rate) }

// serveDoorSSE is an OpenAI Chat Completions SSE server: each call streams the tokens the newest
// user message asks for ("tokens N at R/s"), each token the wall-clock time it was written
// (UnixNano).
func serveDoorSSE(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	n, rate := 1, 1
	if ms := doorAsk.FindAllSubmatch(body, -1); len(ms) > 0 {
		n, _ = strconv.Atoi(string(ms[len(ms)-1][1]))
		rate, _ = strconv.Atoi(string(ms[len(ms)-1][2]))
	}
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	chunk := func(delta, finish string) {
		fmt.Fprintf(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"tokens","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, finish)
	}
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	for range n {
		select {
		case <-tick.C:
		case <-r.Context().Done():
			return
		}
		chunk(`{"content":"`+strconv.FormatInt(time.Now().UnixNano(), 10)+`"}`, "null")
		if fl != nil {
			fl.Flush()
		}
	}
	chunk(`{}`, `"stop"`)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// doorGateway is the built `openclaw gateway` running as a process of its own on loopback.
type doorGateway struct {
	addr, token string
	pid         int
	client      *api.Client
}

func startDoorGateway(ctx context.Context, t *testing.T, modelBase string) *doorGateway {
	t.Helper()
	bin := netnsbox.BuildBinary(t, "github.com/openclaw/cloudworkers/cmd/openclaw")
	root := t.TempDir()
	cfg := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`models:
  default: bench/tokens
  providers:
    bench: {api: openai-completions, baseUrl: %q, maxRetries: 0, models: [{id: tokens}]}
`, modelBase)), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	data := filepath.Join(root, "data")
	log := &testenv.Buffer{}
	cmd := exec.Command(bin, "gateway", "--data-dir", data, "--listen", addr, "--config", cfg, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gateway log:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling /readyz
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("gateway not ready: %v\n%s", err, log.String())
		}
	}
	tok, err := os.ReadFile(filepath.Join(data, "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	g := &doorGateway{addr: addr, token: strings.TrimSpace(string(tok)), pid: cmd.Process.Pid}
	g.client = api.NewClient(g.addr, g.token)
	return g
}

func (g *doorGateway) newSession(ctx context.Context, t *testing.T, title string) string {
	t.Helper()
	s, err := g.client.CreateSession(ctx, sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: title}})
	if err != nil {
		t.Fatal(err)
	}
	return s.ID
}

// procStat is process pid's resident set (KiB) and CPU time so far (all its threads).
func procStat(t *testing.T, pid int) (rssKiB int64, cpu time.Duration) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rssKiB, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		t.Fatal(err)
	}
	// after the command's closing parenthesis: field 3 is state; utime and stime are 14 and 15
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return rssKiB, time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

// ocFrame is what the bench reads of an OpenClaw protocol frame.
type ocFrame struct {
	Type, Event, ID string
	OK              *bool
	Error           *struct{ Code, Message string }
	Payload         struct {
		Nonce, State, DeltaText, SessionKey, RunID string
	}
}

// ocClient is a raw OpenClaw Gateway protocol v4 client (as gateway/openclaw's tests use).
type ocClient struct {
	ws    *websocket.Conn
	wmu   sync.Mutex
	next  atomic.Int64
	bytes atomic.Int64 // of the frames read
}

// errRefused is an upgrade the gateway answered with an HTTP status instead of a WebSocket.
type errRefused struct{ status int }

func (e errRefused) Error() string { return fmt.Sprintf("upgrade refused: HTTP %d", e.status) }

// dialDoor connects to the door at addr: the challenge, connect with the operator token, hello-ok.
func dialDoor(ctx context.Context, addr, token string) (*ocClient, error) {
	ws, resp, err := websocket.Dial(ctx, "ws://"+addr+"/", nil)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, errRefused{resp.StatusCode}
		}
		return nil, err
	}
	ws.SetReadLimit(16 << 20)
	c := &ocClient{ws: ws}
	f, _, err := c.read(ctx)
	if err != nil || f.Event != "connect.challenge" {
		ws.CloseNow()
		return nil, fmt.Errorf("want connect.challenge, got %+v (%v)", f, err)
	}
	_, err = c.call(ctx, "connect", map[string]any{"minProtocol": 4, "maxProtocol": 4, "role": "operator",
		"scopes": []string{"operator.read", "operator.write"}, "auth": map[string]any{"token": token},
		"client": map[string]any{"id": "bench", "version": "1", "platform": "linux", "mode": "cli"}})
	if err != nil {
		ws.CloseNow()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return c, nil
}

func (c *ocClient) read(ctx context.Context) (ocFrame, time.Time, error) {
	var f ocFrame
	_, b, err := c.ws.Read(ctx)
	at := time.Now()
	if err != nil {
		return f, at, err
	}
	c.bytes.Add(int64(len(b)))
	return f, at, json.Unmarshal(b, &f)
}

// send writes a request and returns its id (its answer is read by whoever reads the connection).
func (c *ocClient) send(ctx context.Context, method string, params any) (string, error) {
	id := "r" + strconv.FormatInt(c.next.Add(1), 10)
	b, err := json.Marshal(map[string]any{"type": "req", "id": id, "method": method, "params": params})
	if err != nil {
		return "", err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return id, c.ws.Write(ctx, websocket.MessageText, b)
}

// call sends a request and reads frames until its answer (only while nothing else reads).
func (c *ocClient) call(ctx context.Context, method string, params any) (ocFrame, error) {
	id, err := c.send(ctx, method, params)
	if err != nil {
		return ocFrame{}, err
	}
	for {
		f, _, err := c.read(ctx)
		if err != nil {
			return f, err
		}
		if f.Type != "res" || f.ID != id {
			continue
		}
		if f.OK == nil || !*f.OK {
			if f.Error != nil {
				return f, fmt.Errorf("%s: %s %s", method, f.Error.Code, f.Error.Message)
			}
			return f, fmt.Errorf("%s refused", method)
		}
		return f, nil
	}
}

func sessionKey(id string) string { return "agent:main:" + id }

// arrivals is when each token (its provider timestamp, UnixNano) reached one client.
type arrivals struct {
	mu sync.Mutex
	at map[int64]int64
}

func (a *arrivals) add(delta string, at time.Time) {
	ns, err := strconv.ParseInt(strings.TrimSpace(delta), 10, 64)
	if err != nil {
		return
	}
	a.mu.Lock()
	a.at[ns] = at.UnixNano()
	a.mu.Unlock()
}

// latencies are a's token latencies (arrival − provider write) of the tokens in keep.
func (a *arrivals) latencies(keep func(int64) bool) []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Duration
	for tok, at := range a.at {
		if keep(tok) {
			out = append(out, time.Duration(at-tok))
		}
	}
	return out
}

// TestOpenClawDoor measures the OpenClaw-protocol door of one real gateway (`openclaw gateway`,
// built, a process of its own on loopback; its turns run on the gateway against an OpenAI SSE
// server in this process): (a) the latency of a provider's token to the `chat` delta on a
// protocol client against the same token on our own /api/v1 session stream, same session, same
// turns; (b) doorClients protocol clients connected and following doorSessions sessions while a
// turn streams in each: who is admitted, who receives the whole reply, and the gateway's RSS per
// client.
func TestOpenClawDoor(t *testing.T) {
	needBench(t)
	ctx := testenv.Context(t, 5*time.Minute)
	started := time.Now()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(serveDoorSSE)}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	g := startDoorGateway(ctx, t, "http://"+ln.Addr().String()+"/v1")
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }

	// (a) Latency: one session, one protocol client following it (chat.send subscribes the
	// sender), one /api/v1 stream of it; each reads frames and stamps them before decoding.
	id := g.newSession(ctx, t, "door-latency")
	oc, err := dialDoor(ctx, g.addr, g.token)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.ws.CloseNow()
	if _, err := oc.call(ctx, "sessions.messages.subscribe", map[string]any{"key": sessionKey(id)}); err != nil {
		t.Fatal(err)
	}
	st, _, err := websocket.Dial(ctx, "ws://"+g.addr+"/api/v1/sessions/"+id+"/stream?cursor=0",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": []string{"Bearer " + g.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseNow()
	st.SetReadLimit(16 << 20)
	viaDoor, viaAPI := &arrivals{at: map[int64]int64{}}, &arrivals{at: map[int64]int64{}}
	doorEnd, apiEnd := make(chan string, 16), make(chan string, 16)
	doorRes := make(chan ocFrame, 16)
	go func() {
		for {
			f, at, err := oc.read(ctx)
			if err != nil {
				doorEnd <- "read: " + err.Error()
				return
			}
			switch {
			case f.Type == "event" && f.Event == "chat" && f.Payload.State == "delta":
				viaDoor.add(f.Payload.DeltaText, at)
			case f.Type == "event" && f.Event == "chat":
				doorEnd <- f.Payload.State
			case f.Type == "res":
				doorRes <- f
			}
		}
	}()
	go func() {
		for {
			_, b, err := st.Read(ctx)
			at := time.Now()
			if err != nil {
				apiEnd <- "read: " + err.Error()
				return
			}
			var m sessions.StreamMessage
			if err := json.Unmarshal(b, &m); err != nil || m.LiveRecord == nil {
				continue
			}
			switch m.Event.Type {
			case protocol.LiveTextDelta:
				viaAPI.add(m.Event.Delta, at)
			case protocol.LiveLifecycleEnd:
				apiEnd <- "final"
			case protocol.LiveLifecycleError:
				apiEnd <- "error: " + m.Event.Error
			}
		}
	}()
	var measuredFrom int64 // tokens of the warm-up round are left out
	for round := range doorRounds + 1 {
		if round == 1 {
			measuredFrom = time.Now().UnixNano()
		}
		// The turn before ends on the streams a moment before the session is free again.
		for try := 0; ; try++ {
			if _, err := oc.send(ctx, "chat.send", map[string]any{"sessionKey": sessionKey(id), "message": doorMessage(doorTokens, doorRate),
				"idempotencyKey": fmt.Sprintf("latency-%d", round)}); err != nil {
				t.Fatal(err)
			}
			var res ocFrame
			select {
			case res = <-doorRes:
			case s := <-doorEnd:
				t.Fatalf("round %d: the protocol client's connection ended: %s", round, s)
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: chat.send unanswered in 30s", round)
			}
			if res.OK != nil && *res.OK {
				break
			}
			if try == 100 || res.Error == nil || !strings.Contains(res.Error.Message, "in progress") {
				t.Fatalf("round %d: chat.send refused: %+v", round, res.Error)
			}
			time.Sleep(20 * time.Millisecond) // polling: nothing announces the session free
		}
		for _, end := range []chan string{doorEnd, apiEnd} {
			select {
			case s := <-end:
				if s != "final" {
					t.Fatalf("round %d ended %s", round, s)
				}
			case <-time.After(time.Minute):
				t.Fatalf("round %d: no end in a minute", round)
			}
		}
	}
	measured := func(tok int64) bool { return tok >= measuredFrom }
	door, apiLat := viaDoor.latencies(measured), viaAPI.latencies(measured)
	// Paired: the same token's arrival on the door minus on the /api/v1 stream.
	var paired []time.Duration
	viaDoor.mu.Lock()
	viaAPI.mu.Lock()
	for tok, at := range viaDoor.at {
		if a, ok := viaAPI.at[tok]; ok && measured(tok) {
			paired = append(paired, time.Duration(at-a))
		}
	}
	viaAPI.mu.Unlock()
	viaDoor.mu.Unlock()
	oc.ws.CloseNow()
	st.CloseNow()
	want := doorRounds * doorTokens
	table(fmt.Sprintf("6a. OpenClaw door latency (one gateway process on loopback, turns on the gateway, provider SSE in the bench, %d rounds × %d tokens at %d/s; %s)",
		doorRounds, doorTokens, doorRate, load()), "path\ttokens\tp50\tp90\tp99", []string{
		fmt.Sprintf("/api/v1 session stream\t%d/%d\t%v\t%v\t%v", len(apiLat), want, r(pct(apiLat, .5)), r(pct(apiLat, .9)), r(pct(apiLat, .99))),
		fmt.Sprintf("OpenClaw chat delta\t%d/%d\t%v\t%v\t%v", len(door), want, r(pct(door, .5)), r(pct(door, .9)), r(pct(door, .99))),
		fmt.Sprintf("added by the door\t\t%+v\t%+v\t%+v", r(pct(door, .5)-pct(apiLat, .5)), r(pct(door, .9)-pct(apiLat, .9)), r(pct(door, .99)-pct(apiLat, .99))),
		fmt.Sprintf("same token, door − API\t%d\t%+v\t%+v\t%+v", len(paired), r(pct(paired, .5)), r(pct(paired, .9)), r(pct(paired, .99))),
	})
	summarize("6a openclaw door latency", fmt.Sprintf("added p50 %+v, p99 %+v (door %v/%v vs /api/v1 %v/%v; same token p50 %+v, p99 %+v)",
		r(pct(door, .5)-pct(apiLat, .5)), r(pct(door, .99)-pct(apiLat, .99)), r(pct(door, .5)), r(pct(door, .99)), r(pct(apiLat, .5)), r(pct(apiLat, .99)),
		r(pct(paired, .5)), r(pct(paired, .99))), "+≤1 ms p50")

	// (b) on the same gateway: its door as configured (at most openclaw.DefaultMaxConnections).
	ids := make([]string, doorSessions)
	for i := range ids {
		ids[i] = g.newSession(ctx, t, fmt.Sprintf("door-load-%02d", i))
	}
	doorLoad(ctx, t, g.addr, g.token, g.pid, ids, true, "6b", "the gateway as built")

	// (b') what it would take with room for every client: the same door, session store and
	// turn service (turns on the gateway, same model server) in a process of their own, built
	// by the bench with MaxConnections = doorClients; nothing of gateway/openclaw is changed.
	w := startWhatIfDoor(ctx, t, "http://"+ln.Addr().String()+"/v1")
	doorLoad(ctx, t, w.Addr, w.Token, w.pid, w.IDs, false, "6c", fmt.Sprintf("what-if: the same door with MaxConnections %d in a bench process", doorClients))
	t.Logf("TestOpenClawDoor took %v", time.Since(started).Round(time.Millisecond))
}

// doorLoad connects doorClients protocol clients to the door at addr, client i following session
// ids[i mod len(ids)], then streams one turn in each session and prints who got what, and the RSS
// of the gateway process pid per client held. withAPI: the gateway serves /api/v1 too, and one
// session stream of each session measures the same tokens' latency there (the control).
func doorLoad(ctx context.Context, t *testing.T, addr, token string, pid int, ids []string, withAPI bool, section, what string) {
	t.Helper()
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	time.Sleep(time.Second)
	rssBase, _ := procStat(t, pid)
	type loadClient struct {
		c       *ocClient
		session int
		deltas  atomic.Int64
		final   atomic.Bool
		end     atomic.Pointer[string] // why its connection ended before the test closed it
		lat     arrivals
		before  int64 // bytes read before the turns
	}
	clients := make([]*loadClient, doorClients)
	var (
		mu      sync.Mutex
		refused = map[string]int{}
		wg      sync.WaitGroup
	)
	connectStart := time.Now()
	sem := make(chan struct{}, doorDialers)
	for i := range clients {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			c, err := dialDoor(dctx, addr, token)
			if err == nil {
				if _, err = c.call(dctx, "sessions.messages.subscribe", map[string]any{"key": sessionKey(ids[i%len(ids)])}); err != nil {
					c.ws.CloseNow()
				}
			}
			if err != nil {
				why := err.Error()
				var rf errRefused
				if errors.As(err, &rf) {
					why = rf.Error()
				}
				mu.Lock()
				refused[why]++
				mu.Unlock()
				return
			}
			clients[i] = &loadClient{c: c, session: i % len(ids), lat: arrivals{at: map[int64]int64{}}}
		}()
	}
	wg.Wait()
	connectTook := time.Since(connectStart)
	var held []*loadClient
	for _, c := range clients {
		if c != nil {
			held = append(held, c)
		}
	}
	var closing atomic.Bool
	var readers sync.WaitGroup
	for _, lc := range held {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				f, at, err := lc.c.read(ctx)
				if err != nil {
					if !closing.Load() {
						why := err.Error()
						if s := websocket.CloseStatus(err); s != -1 {
							why = fmt.Sprintf("closed %d", s)
						}
						lc.end.Store(&why)
					}
					return
				}
				if f.Type == "event" && f.Event == "chat" {
					switch f.Payload.State {
					case "delta":
						lc.deltas.Add(1)
						lc.lat.add(f.Payload.DeltaText, at)
					case "final":
						lc.final.Store(true)
					}
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	rssHeld, cpu0 := procStat(t, pid)
	for _, lc := range held {
		lc.before = lc.c.bytes.Load()
	}
	// The control: one /api/v1 stream of each session, reading the same tokens.
	var apiLat []*arrivals
	if withAPI {
		for _, id := range ids {
			st, _, err := websocket.Dial(ctx, "ws://"+addr+"/api/v1/sessions/"+id+"/stream?cursor=0",
				&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": []string{"Bearer " + token}}})
			if err != nil {
				t.Fatal(err)
			}
			defer st.CloseNow()
			st.SetReadLimit(16 << 20)
			a := &arrivals{at: map[int64]int64{}}
			apiLat = append(apiLat, a)
			go func() {
				for {
					_, b, err := st.Read(ctx)
					at := time.Now()
					if err != nil {
						return
					}
					var m sessions.StreamMessage
					if json.Unmarshal(b, &m) == nil && m.LiveRecord != nil && m.Event.Type == protocol.LiveTextDelta {
						a.add(m.Event.Delta, at)
					}
				}
			}()
		}
	}
	// One turn per session, sent by the first client held that follows it.
	streamStart := time.Now()
	selfCPU0 := sideCPU(t, 0)
	sent := map[int]bool{}
	for _, lc := range held {
		if sent[lc.session] {
			continue
		}
		sent[lc.session] = true
		if _, err := lc.c.send(ctx, "chat.send", map[string]any{"sessionKey": sessionKey(ids[lc.session]), "message": doorMessage(doorLoadTokens, doorLoadRate),
			"idempotencyKey": fmt.Sprintf("load-%d", lc.session)}); err != nil {
			t.Fatal(err)
		}
	}
	var rssPeak int64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) { // sampling the gateway's RSS
		rss, _ := procStat(t, pid)
		rssPeak = max(rssPeak, rss)
		done := true
		for _, lc := range held {
			if !lc.final.Load() && lc.end.Load() == nil {
				done = false
				break
			}
		}
		if done {
			break
		}
	}
	streamTook := time.Since(streamStart)
	_, cpu1 := procStat(t, pid)
	selfCPU := sideCPU(t, 0) - selfCPU0
	var streamed int64 // bytes the clients read while the turns streamed
	for _, lc := range held {
		streamed += lc.c.bytes.Load() - lc.before
	}
	var (
		deltas, whole, cut int64
		cuts               = map[string]int{}
		lat                []time.Duration
	)
	for _, lc := range held {
		n := lc.deltas.Load()
		deltas += n
		if n == doorLoadTokens && lc.final.Load() {
			whole++
		}
		if e := lc.end.Load(); e != nil {
			cut++
			cuts[*e]++
		}
		lat = append(lat, lc.lat.latencies(func(int64) bool { return true })...)
	}
	closing.Store(true)
	for _, lc := range held {
		lc.c.ws.CloseNow()
	}
	readers.Wait()
	refusedNote := "none"
	if len(refused) > 0 {
		var parts []string
		for _, why := range slices.Sorted(maps.Keys(refused)) {
			parts = append(parts, fmt.Sprintf("%d × %s", refused[why], why))
		}
		refusedNote = strings.Join(parts, ", ")
	}
	cutNote := "none"
	if len(cuts) > 0 {
		var parts []string
		for _, why := range slices.Sorted(maps.Keys(cuts)) {
			parts = append(parts, fmt.Sprintf("%d × %s", cuts[why], why))
		}
		cutNote = strings.Join(parts, ", ")
	}
	perClient := func(rss int64) string {
		if len(held) == 0 {
			return "-"
		}
		return fmt.Sprintf("%d KiB", (rss-rssBase)/int64(len(held)))
	}
	title := fmt.Sprintf("%s. OpenClaw door, %s: %d protocol clients on %d sessions, one turn of %d tokens at %d/s in each (%s)",
		section, what, doorClients, len(ids), doorLoadTokens, doorLoadRate, load())
	rows := []string{
		fmt.Sprintf("clients connected and subscribed\t%d of %d (in %v; refused: %s)", len(held), doorClients, connectTook.Round(time.Millisecond), refusedNote),
		fmt.Sprintf("gateway RSS\t%d MiB before, %d MiB held idle, %d MiB peak streaming", rssBase>>10, rssHeld>>10, rssPeak>>10),
		fmt.Sprintf("gateway RSS per client\t%s held idle, %s peak streaming", perClient(rssHeld), perClient(rssPeak)),
		fmt.Sprintf("chat deltas received\t%d of %d (%d clients × %d)", deltas, int64(len(held))*doorLoadTokens, len(held), doorLoadTokens),
		fmt.Sprintf("clients with the whole reply (every delta and final)\t%d of %d", whole, len(held)),
		fmt.Sprintf("clients cut\t%d (%s)", cut, cutNote),
		fmt.Sprintf("bytes read per client for the reply\t%d KiB (%d B per chat delta with its agent event: each carries the text so far)",
			streamed/max(int64(len(held)), 1)>>10, streamed/max(deltas, 1)),
		fmt.Sprintf("streaming\t%v wall, %.2f gateway cores, %.2f cores of the bench's clients", streamTook.Round(time.Millisecond),
			(cpu1-cpu0).Seconds()/streamTook.Seconds(), selfCPU.Seconds()/streamTook.Seconds()),
		fmt.Sprintf("token → chat delta under load\tp50 %v, p90 %v, p99 %v", r(pct(lat, .5)), r(pct(lat, .9)), r(pct(lat, .99))),
	}
	if withAPI {
		var al []time.Duration
		for _, a := range apiLat {
			al = append(al, a.latencies(func(int64) bool { return true })...)
		}
		rows = append(rows, fmt.Sprintf("the same tokens on /api/v1 (%d streams)\tp50 %v, p90 %v, p99 %v (%d tokens)", len(apiLat), r(pct(al, .5)), r(pct(al, .9)), r(pct(al, .99)), len(al)))
	}
	table(title, "figure\tvalue", rows)
	summarize(section+" openclaw door clients ("+what+")", fmt.Sprintf("%d of %d connected (refused: %s); %s gateway RSS per held client (%s streaming); %d of %d with the whole reply, %d of %d deltas, %d cut",
		len(held), doorClients, refusedNote, perClient(rssHeld), perClient(rssPeak), whole, len(held), deltas, int64(len(held))*doorLoadTokens, cut),
		fmt.Sprintf("%d clients held, all served", doorClients))
}
