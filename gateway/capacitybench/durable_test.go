package capacitybench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// fsyncRate is how many 4 KiB write+fdatasync rounds per second a file in dir sustains: the
// disk's bound on durable commits that each wait for their own sync.
func fsyncRate(t *testing.T, dir string, d time.Duration) float64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fsync.probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if _, err := f.WriteAt(buf, int64(n%256)*4096); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// durableRun commits with op from writers goroutines (one session each) for d and returns commits/s.
func durableRun(t *testing.T, st *sessions.Store, writers int, d time.Duration,
	op func(ctx context.Context, session string, epoch uint64, seq uint64, leaf *string) error) durable {
	t.Helper()
	ctx := context.Background()
	type ses struct {
		id    string
		epoch uint64
	}
	ss := make([]ses, writers)
	for i := range ss {
		s, err := st.Create(ctx, sessions.CreateParams{})
		if err != nil {
			t.Fatal(err)
		}
		epoch, err := st.Attach(ctx, s.ID, fmt.Sprintf("env-d%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = ses{s.ID, epoch}
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cpu0 := processCPU()
	start := time.Now()
	for _, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaf := ""
			for seq := uint64(1); dctx.Err() == nil; seq++ {
				if err := op(ctx, s.id, s.epoch, seq, &leaf); err != nil {
					t.Error(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	return durable{rate: float64(n.Load()) / elapsed.Seconds(), cpuPerOp: (processCPU() - cpu0) / time.Duration(max(n.Load(), 1))}
}

// durable is what one run of durableRun sustained.
type durable struct {
	rate     float64       // commits per second
	cpuPerOp time.Duration // CPU time of this process per commit
}

// processCPU is the user+system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDurableWrites is section 5: transcript commits and live events per second that the store
// sustains, one writer and many, against the fsync rate of the same disk measured in the same run.
func TestDurableWrites(t *testing.T) {
	needBench(t)
	dir := t.TempDir()
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close(ctx)
	var syncMode int
	var journal string
	_ = db.W.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode)
	_ = db.R.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&journal)
	const d = 4 * time.Second
	fs := fsyncRate(t, dir, d)
	msg, _ := json.Marshal(protocol.Message{Role: protocol.RoleAssistant, Timestamp: 1, StopReason: protocol.StopStop,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "a reply of a few words, as an assistant turn ends"}}})
	commit := func(ctx context.Context, session string, epoch, seq uint64, leaf *string) error {
		res, err := st.WorkerCommit(ctx, protocol.TranscriptCommitParams{Scope: protocol.Scope{SessionID: session, OwnerEpoch: epoch,
			RunID: "r", RunEpoch: 1, StreamKind: protocol.StreamTranscript, Seq: seq}, BaseLeafID: *leaf, Messages: []json.RawMessage{msg}})
		*leaf = res.NewLeafID
		return err
	}
	live := func(ctx context.Context, session string, epoch, seq uint64, _ *string) error {
		_, err := st.PublishLive(ctx, sessions.LiveParams{SessionID: session, OwnerEpoch: epoch, RunEpoch: 1, RunID: "r", Seq: seq,
			Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "token"}})
		return err
	}
	var rows []string
	row := func(what string, r durable) {
		rows = append(rows, fmt.Sprintf("%s\t%.0f\t%.2f×\t%s", what, r.rate, r.rate/fs, r.cpuPerOp.Round(time.Microsecond)))
	}
	rows = append(rows, fmt.Sprintf("fsync (4 KiB write + fdatasync, same disk)\t%.0f\t1.00×\t", fs))
	c1 := durableRun(t, st, 1, d, commit)
	row("transcript commits, 1 writer", c1)
	c16 := durableRun(t, st, 16, d, commit)
	row("transcript commits, 16 writers", c16)
	l1 := durableRun(t, st, 1, d, live)
	row("live events, 1 writer", l1)
	l16 := durableRun(t, st, 16, d, live)
	row("live events, 16 writers", l16)
	l64 := durableRun(t, st, 64, d, live)
	row("live events, 64 writers", l64)
	table(fmt.Sprintf("5. Durable writes (SQLite journal_mode=%s synchronous=%d: every commit waits for its WAL fsync; live events of concurrent sessions share one (group commit), transcript commits do not; %s)",
		journal, syncMode, machine()), "what\tper second\tvs fsync\tCPU per commit", rows)
	summarize("5 durable writes", fmt.Sprintf("%.0f transcript commits/s, %.0f live events/s (64 writers) vs %.0f fsync/s: %.2f×, %.2f×",
		c16.rate, l64.rate, fs, c16.rate/fs, l64.rate/fs), "measured; group commit where safe")
}
