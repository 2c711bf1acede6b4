package capacitybench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/openai"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/testrig/netnsbox"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// Section 2's provider: an OpenAI Chat Completions SSE server streaming relayTokens deltas at
// relayRate per second, each delta the wall-clock time it was written (UnixNano).
const (
	relayTokens = 200
	relayRate   = 100
	relayRounds = 5
)

// relayTask is section 2's box side: Worker's environment connection and session client over the
// forwarded socket Sock, then Rounds+1 calls through the gateway (the first one a warm-up) each
// followed by the same call straight to the provider at Direct (an OpenAI base URL).
type relayTask struct {
	Sock   string
	Worker workerLine
	Direct string
	Rounds int
}

// relayResult is each token's latency (ns) from the provider's write to the worker's callback.
type relayResult struct{ Tunnel, Direct []int64 }

func relayModel(baseURL string) inference.Model {
	return inference.Model{Ref: benchModel, Provider: "bench", ID: "tokens", API: inference.APIOpenAICompletions, BaseURL: baseURL}
}

var relayContext = protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Timestamp: 1,
	Content: []protocol.Content{{Type: protocol.ContentText, Text: "go"}}}}}

// tokenLatency records the latency of ev when it carries a provider timestamp.
func tokenLatency(into *[]int64, ev protocol.StreamEvent) {
	if ev.Type != "text_delta" {
		return
	}
	if ns, err := strconv.ParseInt(ev.Delta, 10, 64); err == nil {
		*into = append(*into, time.Now().UnixNano()-ns)
	}
}

func boxRelay(ctx context.Context, task relayTask) (relayResult, error) {
	var res relayResult
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := workerConfig(task.Sock, task.Worker)
	turn := make(chan struct{}, 1)
	cfg.Handler = func(_ context.Context, method string, _ json.RawMessage) (any, *protocol.Error) {
		if method == protocol.MethodTurnStart {
			select {
			case turn <- struct{}{}:
			default:
			}
		}
		return protocol.TurnStartResult{Accepted: true}, nil
	}
	runErr := make(chan error, 1)
	go func() { runErr <- remote.Run(ctx, cfg) }()
	select {
	case <-turn:
	case err := <-runErr:
		return res, fmt.Errorf("worker connection: %v", err)
	case <-ctx.Done():
		return res, fmt.Errorf("turn never started: %w", ctx.Err())
	}
	cfg.SessionID, cfg.OwnerEpoch = task.Worker.Session, task.Worker.Epoch
	client, err := remote.NewClient(remote.ClientConfig{Config: cfg, RunID: benchRun, RunEpoch: 1})
	if err != nil {
		return res, err
	}
	defer client.Close()
	direct := openai.NewCompletions()
	for r := range task.Rounds + 1 {
		var tun, dir []int64
		if _, err := client.Infer(ctx, fmt.Sprintf("relay-%d", r), benchModel, relayContext, protocol.InferenceOptions{},
			func(ev protocol.StreamEvent) error { tokenLatency(&tun, ev); return nil }); err != nil {
			return res, fmt.Errorf("through the gateway: %w", err)
		}
		if _, err := direct.Stream(ctx, inference.Call{Model: relayModel(task.Direct), Context: relayContext},
			func(ev protocol.StreamEvent) error { tokenLatency(&dir, ev); return nil }); err != nil {
			return res, fmt.Errorf("direct: %w", err)
		}
		if r > 0 {
			res.Tunnel, res.Direct = append(res.Tunnel, tun...), append(res.Direct, dir...)
		}
	}
	return res, nil
}

// relayModels is the gateway's catalog in section 2: benchModel is the OpenAI adapter on the SSE server.
type relayModels struct{ m inference.Model }

func (r relayModels) Resolve(ref string) (inference.Model, error) {
	if ref != benchModel {
		return inference.Model{}, fmt.Errorf("model %q is not in the catalog", ref)
	}
	return r.m, nil
}

func (r relayModels) Stream(ctx context.Context, _ string, cx protocol.Context, opts inference.Options, emit inference.Emit) (protocol.Message, error) {
	return openai.NewCompletions().Stream(ctx, inference.Call{Model: r.m, Context: cx, Options: opts}, emit)
}

// serveSSE streams relayTokens timestamped deltas for each chat completion.
func serveSSE(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	chunk := func(delta, finish string) {
		fmt.Fprintf(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"tokens","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, finish)
	}
	tick := time.NewTicker(time.Second / relayRate)
	defer tick.Stop()
	for range relayTokens {
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

// TestTokenRelayLatency is section 2: one worker on a netns sshd box, each provider SSE event to
// the worker's callback through the tunnel, the hub and the inference proxy, against the same
// worker process calling the same SSE server directly. The box reaches the server only because it
// listens on this machine's end of the box's veth, for this comparison; in production the box
// has no route to a provider.
func TestTokenRelayLatency(t *testing.T) {
	needBench(t)
	box := netnsbox.NetnsBox(t, "bench-relay")
	bin := boxBinary(t)
	c := netnsbox.Dial(t, box)
	ctx := testenv.Context(t, 5*time.Minute)

	ln, err := net.Listen("tcp", net.JoinHostPort(box.HostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(serveSSE)}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	base := "http://" + ln.Addr().String() + "/v1"

	g, err := newBenchHub(ctx, t.TempDir(), relayModels{relayModel(base)}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.close(context.Background()) })
	th := tunnel.NewMux(tunnel.Config{})
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = th.Close(cctx)
	})
	go func() { _ = g.srv.Serve(th.Listener()) }()
	const env = "env-relay"
	if err := th.Open(ctx, netnsbox.Target(box, env, "ocw/w.sock")); err != nil {
		t.Fatal(err)
	}
	w, err := g.addWorker(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	var res relayResult
	if err := onBox(c, bin, boxTask{Relay: &relayTask{Sock: filepath.Join(box.Home, "ocw/w.sock"), Worker: w, Direct: base, Rounds: relayRounds}}, &res); err != nil {
		t.Fatal(err)
	}
	ns := func(v []int64) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x)
		}
		return d
	}
	tun, dir := ns(res.Tunnel), ns(res.Direct)
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	rows := []string{
		fmt.Sprintf("through tunnel + proxy\t%d\t%v\t%v\t%v", len(tun), r(pct(tun, .5)), r(pct(tun, .9)), r(pct(tun, .99))),
		fmt.Sprintf("direct to the provider\t%d\t%v\t%v\t%v", len(dir), r(pct(dir, .5)), r(pct(dir, .9)), r(pct(dir, .99))),
		fmt.Sprintf("added by the gateway\t\t%+v\t%+v\t%+v", r(pct(tun, .5)-pct(dir, .5)), r(pct(tun, .9)-pct(dir, .9)), r(pct(tun, .99)-pct(dir, .99))),
	}
	table(fmt.Sprintf("2. Token relay latency (one worker on netns sshd box %s, provider SSE on %s, %d rounds × %d tokens at %d/s each way; %s)",
		box.Host, box.HostAddr, relayRounds, relayTokens, relayRate, load()), "path\ttokens\tp50\tp90\tp99", rows)
	summarize("2 token relay", fmt.Sprintf("added p50 %+v, p99 %+v (tunnel %v/%v vs direct %v/%v)", r(pct(tun, .5)-pct(dir, .5)), r(pct(tun, .99)-pct(dir, .99)),
		r(pct(tun, .5)), r(pct(tun, .99)), r(pct(dir, .5)), r(pct(dir, .99))), "+≤0.3 ms p50, +≤2 ms p99")
}
