package stream

import (
	"fmt"
	"io"
	"io/fs"
	"sync/atomic"
	"time"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// DefaultProgressInterval is how often Remote.Progress is called during a transfer.
const DefaultProgressInterval = time.Second

// Progress is a snapshot of a transfer: files and content bytes sent so far out of the plan's.
type Progress struct {
	Files, TotalFiles int
	Bytes, TotalBytes int64
	Elapsed           time.Duration
	// Done is set on the last report, made once the transfer ended (successfully or not).
	Done bool
}

// Rate is the content rate so far, in bytes per second.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Bytes) / p.Elapsed.Seconds()
}

func (p Progress) String() string {
	return fmt.Sprintf("%d/%d files, %.1f/%.1f MB, %.1f MB/s", p.Files, p.TotalFiles,
		float64(p.Bytes)/1e6, float64(p.TotalBytes)/1e6, p.Rate()/1e6)
}

// ProgressPrinter returns a Progress callback that writes one line per report to w, for CLIs.
func ProgressPrinter(w io.Writer, prefix string) func(Progress) {
	return func(p Progress) { fmt.Fprintf(w, "%s%s\n", prefix, p) }
}

// counter is updated by the archive writer and read by the reporting goroutine.
type counter struct {
	files, bytes atomic.Int64
	// sent, when set, is told of every file sent: its path, stat (taken when it was opened), sha256
	// and when it was opened (for a hash cache).
	sent func(p string, fi fs.FileInfo, sum string, at time.Time)
	// compression encodes the archive's frames (CompressAuto when empty).
	compression Compression
}

func (c *counter) addFile()       { c.files.Add(1) }
func (c *counter) addBytes(n int) { c.bytes.Add(int64(n)) }

// countingWriter counts content bytes as they are copied into the archive.
type countingWriter struct {
	w io.Writer
	c *counter
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.c.addBytes(n)
	return n, err
}

// reportProgress calls fn on every tick with c's counts until stop is called, then once more
// with Done set. stop waits for the reporting goroutine, so fn is never called after it returns.
func reportProgress(fn func(Progress), every time.Duration, tick <-chan time.Time, plan Plan, c *counter) (stop func()) {
	if fn == nil {
		return func() {}
	}
	start := time.Now()
	// Totals are taken now: the writer fills the entries' hashes in while this runs.
	totalFiles, totalBytes := 0, plan.Bytes()
	for _, e := range plan.Entries {
		if e.Type != manifest.TypeDir {
			totalFiles++
		}
	}
	snap := func(done bool) Progress {
		return Progress{Files: int(c.files.Load()), TotalFiles: totalFiles, Bytes: c.bytes.Load(),
			TotalBytes: totalBytes, Elapsed: time.Since(start), Done: done}
	}
	var t *time.Ticker
	if tick == nil {
		if every <= 0 {
			every = DefaultProgressInterval
		}
		t = time.NewTicker(every)
		tick = t.C
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-quit:
				return
			case <-tick:
				fn(snap(false))
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
		if t != nil {
			t.Stop()
		}
		fn(snap(true))
	}
}
