package capacitybench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// childGateway is a bench gateway process (see gateway_test.go) and its output.
type childGateway struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	sock   string
	wmu    sync.Mutex
	turns  map[string]chan struct{} // env → closed when its turn started
	lines  chan out                 // worker and stats lines
	exited chan error
}

func startChild(t *testing.T, profile string) *childGateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "capbench")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = []string{envChild + "=" + dir}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envProfile+"=") && !strings.HasPrefix(kv, envChild+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if profile != "" {
		cmd.Env = append(cmd.Env, envProfile+"="+profile)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &childGateway{t: t, cmd: cmd, stdin: stdin, sock: filepath.Join(dir, "w.sock"), turns: map[string]chan struct{}{},
		lines: make(chan out, 1024), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var o out
			if json.Unmarshal(sc.Bytes(), &o) != nil {
				continue
			}
			if o.Turn != "" {
				g.started(o.Turn) // again after a worker reconnected: the turn is started once more
				continue
			}
			g.lines <- o
		}
		g.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-g.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-g.exited
		}
	})
	return g
}

func (g *childGateway) turn(env string) chan struct{} {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	ch := g.turns[env]
	if ch == nil {
		ch = make(chan struct{})
		g.turns[env] = ch
	}
	return ch
}

// started marks env's turn started (once; later starts after a reconnect change nothing).
func (g *childGateway) started(env string) {
	ch := g.turn(env)
	g.wmu.Lock()
	defer g.wmu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (g *childGateway) send(cmd string) {
	if _, err := fmt.Fprintln(g.stdin, cmd); err != nil {
		g.t.Fatal(err)
	}
}

func (g *childGateway) next() out {
	select {
	case o := <-g.lines:
		return o
	case err := <-g.exited:
		g.t.Fatalf("bench gateway exited: %v", err)
	case <-time.After(2 * time.Minute):
		g.t.Fatal("bench gateway silent for 2 minutes")
	}
	panic("unreachable")
}

func (g *childGateway) setup(n int, have int) []workerLine {
	g.send("setup " + strconv.Itoa(n))
	var ws []workerLine
	for len(ws) < n-have {
		if o := g.next(); o.Worker != nil {
			ws = append(ws, *o.Worker)
		}
	}
	return ws
}

func (g *childGateway) stats() statsLine {
	g.send("stats")
	for {
		if o := g.next(); o.Stats != nil {
			return *o.Stats
		}
	}
}

// benchWorker is one simulated worker: its environment connection (remote.Run: admission,
// heartbeats, the turn start) and the session client of its turn (inference, live events).
type benchWorker struct {
	line   workerLine
	client *remote.Client
	lat    []time.Duration // provider emit → event in the worker, each token
	seqs   []uint64        // the live event each token went into (ascending)
	calls  int
	errs   int
	tokens atomic.Int64 // len(lat), for watchStall
}

func workerConfig(sock string, w workerLine) remote.Config {
	return remote.Config{SocketPath: sock, EnvironmentID: w.Env, Credential: w.Cred, OwnerEpoch: 1,
		BundleHash: benchBundle, Version: "bench", BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second}
}

// envCoalesce sets the session clients' remote.ClientConfig.LiveCoalesceInflight for section 1
// ("off": LiveCoalesceBytes -1, every token its own live event); unset keeps the defaults.
const envCoalesce = "OPENCLAW_BENCH_COALESCE"

func coalesceConfig(c *remote.ClientConfig) {
	switch s := os.Getenv(envCoalesce); s {
	case "":
	case "off":
		c.LiveCoalesceBytes = -1
	default:
		if n, err := strconv.Atoi(s); err == nil {
			c.LiveCoalesceInflight = n
		}
	}
	if d, err := time.ParseDuration(os.Getenv(envCoalesceDelay)); err == nil {
		c.LiveCoalesceDelay = d
	}
}

// envCoalesceDelay sets the session clients' remote.ClientConfig.LiveCoalesceDelay for section 1 (a
// Go duration; "-1ns": never held for time); unset keeps the default.
const envCoalesceDelay = "OPENCLAW_BENCH_COALESCE_DELAY"

// startWorkers runs ws' environment connections until ctx ends and returns once each turn started.
func startWorkers(ctx context.Context, t *testing.T, g *childGateway, ws []workerLine, done *sync.WaitGroup) []*benchWorker {
	t.Helper()
	out := make([]*benchWorker, len(ws))
	for i, w := range ws {
		cfg := workerConfig(g.sock, w)
		cfg.Handler = func(context.Context, string, json.RawMessage) (any, *protocol.Error) {
			return protocol.TurnStartResult{Accepted: true}, nil
		}
		done.Add(1)
		go func() {
			defer done.Done()
			_ = remote.Run(ctx, cfg)
		}()
		out[i] = &benchWorker{line: w}
	}
	for _, w := range out {
		select {
		case <-g.turn(w.line.Env):
		case <-time.After(3 * time.Minute):
			t.Fatalf("turn of %s never started", w.line.Env)
		}
		cfg := workerConfig(g.sock, w.line)
		cfg.SessionID, cfg.OwnerEpoch = w.line.Session, w.line.Epoch
		ccfg := remote.ClientConfig{Config: cfg, RunID: benchRun, RunEpoch: 1}
		coalesceConfig(&ccfg)
		c, err := remote.NewClient(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		w.client = c
	}
	return out
}

// stream has every worker call the model back to back until ctx ends, sending each delta on as a
// live event (as the runner does), and recording each token's relay latency.
func stream(ctx context.Context, ws []*benchWorker) {
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				_, err := w.client.Infer(ctx, fmt.Sprintf("t%d-%d", i, k), benchModel, protocol.Context{Messages: []protocol.Message{{
					Role: protocol.RoleUser, Timestamp: 1, Content: []protocol.Content{{Type: protocol.ContentText, Text: "go"}}}}},
					protocol.InferenceOptions{}, func(ev protocol.StreamEvent) error {
						if ns, err := strconv.ParseInt(ev.Delta, 10, 64); err == nil {
							w.lat = append(w.lat, time.Since(time.Unix(0, ns)))
						}
						w.tokens.Add(1)
						seq, err := w.client.Live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: ev.Delta})
						if err == nil {
							w.seqs = append(w.seqs, seq)
						}
						return err
					})
				switch {
				case err == nil:
					w.calls++
				case ctx.Err() == nil:
					w.errs++
					var pe *protocol.Error
					if errors.As(err, &pe) && pe.RetryAfterMs > 0 {
						select {
						case <-time.After(time.Duration(pe.RetryAfterMs) * time.Millisecond):
						case <-ctx.Done():
						}
					}
				}
			}
		}()
	}
	wg.Wait()
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestWorkersHeld is section 1: N simulated workers, each over real WebSocket connections through
// the real hub (admission, heartbeats, durable live events) in a gateway process of its own, each
// streaming a 50 tokens/s scripted model through the inference proxy.
func TestWorkersHeld(t *testing.T) {
	needBench(t)
	ns := []int{50, 200, 500}
	if s := os.Getenv("OPENCLAW_BENCH_WORKERS"); s != "" {
		ns = nil
		for _, f := range strings.Split(s, ",") {
			if n, err := strconv.Atoi(f); err == nil {
				ns = append(ns, n)
			}
		}
	}
	window := 15 * time.Second
	var rows []string
	for _, n := range ns {
		profile := ""
		if n == ns[len(ns)-1] {
			profile = os.Getenv(envProfile) // make bench: the CPU profile of the largest run
		}
		g := startChild(t, profile)
		base := g.stats()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		ws := startWorkers(ctx, t, g, g.setup(n, 0), &wg)
		idle := g.stats()
		// idle RSS after the connections settled, then streaming
		sctx, stop := context.WithTimeout(ctx, window)
		var mid atomic.Pointer[statsLine]
		go func() {
			select {
			case <-time.After(window * 2 / 3):
				s := g.stats()
				mid.Store(&s)
			case <-sctx.Done():
			}
		}()
		start := time.Now()
		before := g.stats()
		stalls := make(chan int, 1)
		go func() { stalls <- watchStall(sctx, t, g, ws) }()
		stream(sctx, ws)
		stalled := <-stalls
		after := g.stats()
		wall := time.Since(start)
		stop()
		var lat []time.Duration
		var calls, errs int
		// Live events the gateway acknowledged (written durably), and the tokens they carry.
		var events, written uint64
		for _, w := range ws {
			lat = append(lat, w.lat...)
			calls += w.calls
			errs += w.errs
			acked := w.client.LiveAcked()
			events += acked
			n, _ := slices.BinarySearch(w.seqs, acked+1)
			written += uint64(n)
		}
		streamRSS := after.RSSKiB
		if m := mid.Load(); m != nil {
			streamRSS = max(streamRSS, m.RSSKiB)
		}
		rej := int64(0)
		for _, v := range after.Rejections {
			rej += v
		}
		cpu := float64(after.CPUNs-before.CPUNs) / float64(wall.Nanoseconds())
		tokensPerS := float64(len(lat)) / wall.Seconds()
		eventsPerS := float64(events) / wall.Seconds()
		rows = append(rows, fmt.Sprintf("%d\t%d\t%.2f\t%.0f\t%.0f\t%.0f\t%d\t%d\t%s\t%s\t%d\t%d\t%v", n, idle.Workers, cpu, tokensPerS, float64(written)/wall.Seconds(), eventsPerS,
			(idle.RSSKiB-base.RSSKiB)/int64(n), (streamRSS-base.RSSKiB)/int64(n), pct(lat, .5).Round(10*time.Microsecond),
			pct(lat, .99).Round(10*time.Microsecond), calls, errs, after.Rejections)+stallNote(stalled))
		if n == ns[len(ns)-1] {
			summarize("1 workers held", fmt.Sprintf("%d streaming workers held: %.2f cores, %.0f tokens/s in %.0f live events/s, p50/p99 relay %s/%s, idle %d KiB/worker, %d refusals",
				idle.Workers, cpu, tokensPerS, eventsPerS, pct(lat, .5).Round(10*time.Microsecond), pct(lat, .99).Round(10*time.Microsecond),
				(idle.RSSKiB-base.RSSKiB)/int64(n), rej), "500 held; ≤256 KiB/idle worker")
			// Where shedding starts: the workers of 10 more environments.
			extra := g.setup(n+10, n)
			for _, w := range extra {
				cfg := workerConfig(g.sock, w)
				cfg.Handler = func(context.Context, string, json.RawMessage) (any, *protocol.Error) {
					return protocol.TurnStartResult{Accepted: true}, nil
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					cctx, c := context.WithTimeout(ctx, 5*time.Second)
					defer c()
					_ = remote.Run(cctx, cfg)
				}()
			}
			deadline := time.Now().Add(10 * time.Second)
			var s statsLine
			for time.Now().Before(deadline) {
				if s = g.stats(); s.Rejections["max-workers"] >= int64(len(extra)) {
					break
				}
				time.Sleep(200 * time.Millisecond) // polling the other process's counters
			}
			rows = append(rows, fmt.Sprintf("+10\t%d\t\t\t\t\t\t\t\t\t\t\t%d workers refused at admission (max-workers)", s.Workers, s.Rejections["max-workers"]))
		}
		cancel()
		for _, w := range ws {
			_ = w.client.Close()
		}
		wg.Wait()
	}
	table(fmt.Sprintf("1. Workers held (gateway in its own process; %s streaming at %d tokens/s; %s, %d cores)", window, tokensPerSecond, machine(), runtime.NumCPU()),
		"N\tadmitted\tgateway CPU (cores)\ttokens/s relayed\ttokens/s written\tlive events/s written\tRSS/idle worker KiB\tRSS/streaming worker KiB\trelay p50\trelay p99\tcalls\tcall errors\trefusals", rows)
}

// envStallDir, when set, is where watchStall writes the goroutine dumps of both processes.
const envStallDir = "OPENCLAW_BENCH_STALL_DIR"

// watchStall samples the tokens ws received once a second until ctx ends and returns how many
// seconds relayed less than a quarter of what ws' models stream. At the first such second it logs
// how many workers received nothing in it and, with envStallDir set, writes the goroutine stacks
// of this process and of the bench gateway there.
func watchStall(ctx context.Context, t *testing.T, g *childGateway, ws []*benchWorker) int {
	expect := int64(len(ws)) * tokensPerSecond / 4
	last := make([]int64, len(ws))
	stalled := 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for s := 0; ; s++ {
		select {
		case <-ctx.Done():
			return stalled
		case <-tick.C:
		}
		var sum int64
		idle := 0
		for i, w := range ws {
			n := w.tokens.Load()
			sum += n - last[i]
			if n == last[i] {
				idle++
			}
			last[i] = n
		}
		if s < 2 || sum >= expect { // the first seconds start the calls
			continue
		}
		stalled++
		if stalled > 1 {
			continue
		}
		var st remote.ClientStats
		for _, w := range ws {
			cs := w.client.Stats()
			st.Connects += cs.Connects
			st.Resyncs += cs.Resyncs
			st.CapacityRetries += cs.CapacityRetries
		}
		t.Logf("N = %d stalled at %d s: %d tokens in 1 s (expected >= %d), %d workers received none; clients: %d connects, %d resyncs, %d capacity retries",
			len(ws), s+1, sum, expect, idle, st.Connects, st.Resyncs, st.CapacityRetries)
		if dir := os.Getenv(envStallDir); dir != "" {
			stamp := time.Now().UTC().Format("150405")
			g.send(fmt.Sprintf("goroutines %s", filepath.Join(dir, fmt.Sprintf("gateway-%d-%s.txt", len(ws), stamp))))
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("test-%d-%s.txt", len(ws), stamp)))
			if err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 2)
				f.Close()
			}
		}
	}
}

func stallNote(seconds int) string {
	if seconds == 0 {
		return ""
	}
	return fmt.Sprintf(" (stalled %d s)", seconds)
}
