package capacitybench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// The bench gateway is this test binary run with OPENCLAW_BENCH_GATEWAY=<dir>: the real hub, session
// store (SQLite in dir) and inference proxy in a process of its own, so that its CPU and RSS are the
// gateway's alone. It serves workers on dir/w.sock and reads commands, one a line, on stdin:
//
//	setup N   create environments up to N (a session attached to each, a credential); print a
//	          worker line for each new one
//	stats     print a stats line
//
// and prints, one JSON object a line: {"worker":…}, {"turn":env} once the turn of env's session
// is started on its admitted worker, {"stats":…}.

const (
	benchBundle = "bench0000000000000000000000000000000000000000000000000000000000"
	benchModel  = "bench/tokens"
	benchRun    = "run-1"
	// tokensPerSecond and tokensPerCall shape the scripted model's streams.
	tokensPerSecond = 50
	tokensPerCall   = 100
)

type workerLine struct {
	Env, Cred, Session string
	Epoch              uint64
}

type statsLine struct {
	CPUNs      int64            // user+system CPU of the gateway process so far
	RSSKiB     int64            // resident set now
	Workers    int              // admitted environments
	Inflight   int              // model calls in flight
	Rejections map[string]int64 // capacity refusals by reason
	Goroutines int
}

type out struct {
	Worker *workerLine `json:"worker,omitempty"`
	Turn   string      `json:"turn,omitempty"`
	Stats  *statsLine  `json:"stats,omitempty"`
}

// tokenModel streams tokensPerCall deltas at tokensPerSecond; each delta is the wall-clock time it
// was emitted (UnixNano), so the worker can tell how long the relay took.
type tokenModel struct{}

func (tokenModel) Resolve(ref string) (inference.Model, error) {
	if ref != benchModel {
		return inference.Model{}, fmt.Errorf("model %q is not in the catalog", ref)
	}
	return inference.Model{Ref: ref}, nil
}

func (tokenModel) Stream(ctx context.Context, _ string, _ protocol.Context, _ inference.Options, emit inference.Emit) (protocol.Message, error) {
	tick := time.NewTicker(time.Second / tokensPerSecond)
	defer tick.Stop()
	for range tokensPerCall {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return protocol.Message{}, ctx.Err()
		}
		if err := emit(protocol.StreamEvent{Type: "text_delta", Delta: strconv.FormatInt(time.Now().UnixNano(), 10)}); err != nil {
			return protocol.Message{}, err
		}
	}
	return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopStop,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "done"}}}, nil
}

// envProfile, set for the bench gateway, has it write a CPU profile of its whole life there.
const envProfile = "OPENCLAW_BENCH_GATEWAY_CPUPROFILE"

// envMaxInflight sets the bench gateway's capacity.maxInflightInference (section 1's what-if runs;
// unset: the default).
const envMaxInflight = "OPENCLAW_BENCH_MAX_INFLIGHT"

func runGateway(dir string) error {
	ctx := context.Background()
	if path := os.Getenv(envProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var (
		omu sync.Mutex
		enc = json.NewEncoder(os.Stdout)
	)
	emit := func(o out) {
		omu.Lock()
		defer omu.Unlock()
		_ = enc.Encode(o)
	}
	g, err := newBenchHub(ctx, dir, tokenModel{}, func(env string) { emit(out{Turn: env}) })
	if err != nil {
		return err
	}
	defer g.close(ctx)
	ln, err := net.Listen("unix", filepath.Join(dir, "w.sock"))
	if err != nil {
		return err
	}
	go func() { _ = g.srv.Serve(ln) }()
	created := 0
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "setup":
			n, _ := strconv.Atoi(arg)
			for ; created < n; created++ {
				w, err := g.addWorker(ctx, fmt.Sprintf("env-%04d", created))
				if err != nil {
					return err
				}
				emit(out{Worker: &w})
			}
		case "goroutines":
			// a stall seen by the bench (see watchStall): every goroutine's stack, to arg
			if err := writeGoroutines(arg); err != nil {
				return err
			}
		case "stats":
			s, err := gatewayStats(g.srv, g.reg)
			if err != nil {
				return err
			}
			emit(out{Stats: &s})
		}
	}
	return in.Err()
}

// benchHub is a bench gateway's hub: SQLite in a directory, the session store, the inference proxy
// serving models, and for each environment added a session attached to it whose turn is started
// as soon as its worker is admitted (onTurn is then called).
type benchHub struct {
	db    *store.DB
	st    *sessions.Store
	srv   *hub.Server
	reg   *prometheus.Registry
	mu    sync.Mutex
	byEnv map[string]workerLine
}

func newBenchHub(ctx context.Context, dir string, models hub.Models, onTurn func(env string)) (*benchHub, error) {
	db, err := store.Open(ctx, filepath.Join(dir, "gateway.db"))
	if err != nil {
		return nil, err
	}
	st, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		db.Close()
		return nil, err
	}
	g := &benchHub{db: db, st: st, reg: prometheus.NewRegistry(), byEnv: map[string]workerLine{}}
	var capacity hub.Capacity // the defaults, or OPENCLAW_BENCH_MAX_INFLIGHT's model calls in flight
	if n, err := strconv.Atoi(os.Getenv(envMaxInflight)); err == nil && n > 0 {
		capacity.MaxInflightInference = n
	}
	g.srv, err = hub.New(hub.Config{DB: db, Sessions: st, Models: models, Registerer: g.reg, Capacity: capacity, Runs: benchRuns{},
		ExpectedBundle: func(string) (string, bool) { return benchBundle, true },
		OnAdmit: func(env string) {
			g.mu.Lock()
			w, ok := g.byEnv[env]
			g.mu.Unlock()
			if !ok {
				return
			}
			go func() {
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if _, err := g.srv.Request(rctx, env, protocol.MethodTurnStart, protocol.TurnStartParams{SessionID: w.Session,
					OwnerEpoch: w.Epoch, RunEpoch: 1, RunID: benchRun, ModelRef: benchModel, Text: "go"}); err != nil {
					fmt.Fprintln(os.Stderr, "turn start", env, err)
					return
				}
				onTurn(env)
			}()
		}})
	if err != nil {
		db.Close()
		return nil, err
	}
	return g, nil
}

// benchRuns is the bench's record of running turns (hub.Runs): every session runs benchRun, the
// turn each worker is started with (gateway/turns keeps this record in the gateway).
type benchRuns struct{}

func (benchRuns) RunningTurn(context.Context, string) (string, uint64, bool, error) {
	return benchRun, 1, true, nil
}

// addWorker creates environment env's session and credential.
func (g *benchHub) addWorker(ctx context.Context, env string) (workerLine, error) {
	ses, err := g.st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		return workerLine{}, err
	}
	epoch, err := g.st.Attach(ctx, ses.ID, env)
	if err != nil {
		return workerLine{}, err
	}
	cred, err := g.srv.Credentials().Mint(ctx, env, benchBundle, 24*time.Hour, nil)
	if err != nil {
		return workerLine{}, err
	}
	w := workerLine{Env: env, Cred: cred, Session: ses.ID, Epoch: epoch}
	g.mu.Lock()
	g.byEnv[env] = w
	g.mu.Unlock()
	return w, nil
}

func (g *benchHub) close(ctx context.Context) {
	_ = g.srv.Close(ctx)
	_ = g.db.Close()
}

func gatewayStats(srv *hub.Server, reg *prometheus.Registry) (statsLine, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return statsLine{}, err
	}
	s := statsLine{CPUNs: ru.Utime.Nano() + ru.Stime.Nano(), Workers: srv.Workers(), Inflight: srv.InferenceInflight(),
		Rejections: map[string]int64{}, RSSKiB: rssKiB()}
	mfs, err := reg.Gather()
	if err != nil {
		return s, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "openclaw_capacity_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := int64(m.GetCounter().GetValue()); v > 0 {
				s.Rejections[m.GetLabel()[0].GetValue()] = v
			}
		}
	}
	s.Goroutines = runtime.NumGoroutine()
	return s, nil
}

// rssKiB reads this process's resident set from /proc.
func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// writeGoroutines writes every goroutine's stack of this process to path (pprof's debug=2 text).
func writeGoroutines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("goroutine").WriteTo(f, 2); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
