package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

// frames splits a stream of zstd frames and reports, for each, whether it is stored (its blocks
// are raw).
func frames(t *testing.T, b []byte) (stored []bool) {
	t.Helper()
	for len(b) > 0 {
		var h zstd.Header
		if err := h.Decode(b); err != nil {
			t.Fatalf("frame header: %v", err)
		}
		n, err := frameLen(b)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, !h.FirstBlock.Compressed)
		b = b[n:]
	}
	return stored
}

// frameLen walks a frame's block headers (no checksum: our frames and EncodeAll's differ only
// there, so the content checksum flag is read from the descriptor).
func frameLen(b []byte) (int, error) {
	fhd := b[4]
	n := 5
	if fhd&0x20 == 0 {
		n++ // window descriptor
	}
	n += []int{0, 1, 2, 4}[fhd&3]
	fcs := []int{0, 2, 4, 8}[fhd>>6]
	if fhd>>6 == 0 && fhd&0x20 != 0 {
		fcs = 1
	}
	n += fcs
	for {
		if n+3 > len(b) {
			return 0, errors.New("short frame")
		}
		h := uint32(b[n]) | uint32(b[n+1])<<8 | uint32(b[n+2])<<16
		size := int(h >> 3)
		if (h>>1)&3 == 1 { // RLE: one byte
			size = 1
		}
		n += 3 + size
		if h&1 == 1 {
			break
		}
	}
	if fhd&4 != 0 {
		n += 4
	}
	return n, nil
}

func decodeAll(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return out
}

func TestFrameWriterModes(t *testing.T) {
	data := []byte(strings.Repeat("package main\n\nfunc main() { println(\"hello\") }\n", 80_000)) // ~3.8 MB, compressible
	for _, tc := range []struct {
		mode       Compression
		wantStored bool
	}{{CompressNone, true}, {CompressZstd, false}, {CompressAuto, true}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			var out bytes.Buffer
			fw, err := newFrameWriter(&out, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			for p := data; len(p) > 0; p = p[min(len(p), 70_000):] {
				if _, err := fw.Write(p[:min(len(p), 70_000)]); err != nil {
					t.Fatal(err)
				}
			}
			if err := fw.Close(); err != nil {
				t.Fatal(err)
			}
			if got := decodeAll(t, out.Bytes()); !bytes.Equal(got, data) {
				t.Fatalf("decoded %d bytes, want the %d written", len(got), len(data))
			}
			st := frames(t, out.Bytes())
			if len(st) != (len(data)+chunkSize-1)/chunkSize {
				t.Fatalf("%d frames for %d bytes", len(st), len(data))
			}
			for i, s := range st {
				if s != tc.wantStored {
					t.Fatalf("frame %d stored=%v, want %v (to a fast writer)", i, s, tc.wantStored)
				}
			}
		})
	}
}

// slowWriter takes bytes at about rate bytes per second.
type slowWriter struct {
	bytes.Buffer
	rate float64
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Duration(float64(len(p)) / w.rate * float64(time.Second)))
	return w.Buffer.Write(p)
}

// TestFrameWriterCompressesForASlowLink: auto mode stores the first chunks, measures the link, and
// compresses once it is slower than CompressBelow.
func TestFrameWriterCompressesForASlowLink(t *testing.T) {
	data := []byte(strings.Repeat("a compressible line of source code, repeated\n", 250_000)) // ~11 MB
	w := &slowWriter{rate: CompressBelow / 4}
	fw, err := newFrameWriter(w, CompressAuto)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
	if got := decodeAll(t, w.Bytes()); !bytes.Equal(got, data) {
		t.Fatal("decoded data differs")
	}
	st := frames(t, w.Bytes())
	if !st[0] || st[len(st)-1] {
		t.Fatalf("frames stored: %v; want the first stored (nothing measured yet) and the last compressed", st)
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("link lost")
	}
	w.after--
	return len(p), nil
}

func TestFrameWriterReportsWriteErrors(t *testing.T) {
	fw, err := newFrameWriter(&failingWriter{after: 1}, CompressNone)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, chunkSize)
	var werr error
	for i := 0; i < 50 && werr == nil; i++ {
		_, werr = fw.Write(chunk)
	}
	if cerr := fw.Close(); cerr == nil || !strings.Contains(cerr.Error(), "link lost") {
		t.Fatalf("Close = %v, want the write error", cerr)
	}
	if werr == nil || !strings.Contains(werr.Error(), "link lost") {
		t.Fatalf("Write kept accepting data after the link failed (last error %v)", werr)
	}
	if _, err := ParseCompression("gzip"); err == nil {
		t.Fatal("ParseCompression accepted gzip")
	}
}

// TestAdaptChoosesByThroughput drives CompressAuto's decisions with modelled times per frame (wall
// clocks under test load are too noisy to tell equal rates apart): a slow link, where compressed
// frames go out four times faster, keeps compressing; a busy receiver, where they take as long as
// stored ones, and a slow compressor, where they take longer, go back to stored after one probe and
// probe again only every probeEvery; a fast connection never compresses.
func TestAdaptChoosesByThroughput(t *testing.T) {
	const chunk = int64(chunkSize)
	secs := func(rate float64) time.Duration { return time.Duration(float64(chunk) / rate * float64(time.Second)) }
	// run feeds adapt frames decided a few chunks ahead of their measurement, as in the writer;
	// stored and compressed give each frame's wall time.
	run := func(stored, compressed time.Duration, chunks int) []bool {
		var a adapt
		var modes, pending []bool
		for i := 0; i < chunks; i++ {
			pending = append(pending, a.compress)
			if len(pending) > queued {
				c := pending[0]
				pending = pending[1:]
				took := stored
				if c {
					took = compressed
				}
				a.wrote(c, chunk, took)
				modes = append(modes, c)
			}
		}
		return modes
	}
	count := func(ms []bool) (c int) {
		for _, m := range ms {
			if m {
				c++
			}
		}
		return c
	}
	// a 10 MB/s link: compressed frames carry the tar 4× faster
	link := run(secs(10e6), secs(40e6), 400)
	if c := count(link[len(link)/2:]); c < len(link)/2*8/10 {
		t.Errorf("slow link: %d of the last %d frames compressed, want most", c, len(link)/2)
	}
	// a receiver taking 10 MB/s however the frames are encoded
	busy := run(secs(10e6), secs(10e6), 400)
	if c := count(busy); c == 0 || c > len(busy)/5 {
		t.Errorf("busy receiver: %d of %d frames compressed, want a few probes only", c, len(busy))
	}
	// a 20 MB/s link, but a compressor that manages 8 MB/s of tar (a busy CPU)
	slowCPU := run(secs(20e6), secs(8e6), 400)
	if c := count(slowCPU); c == 0 || c > len(slowCPU)/5 {
		t.Errorf("slow compressor: %d of %d frames compressed, want a few probes only", c, len(slowCPU))
	}
	// a fast connection (200 MB/s): never compressed
	if c := count(run(secs(200e6), secs(100e6), 100)); c != 0 {
		t.Errorf("fast connection: %d frames compressed", c)
	}
	// a fast connection whose first frame waited 300 ms for the box's command to start: that wait
	// is not the link's, and no compressed frame is tried for it
	var a adapt
	a.wrote(false, chunk, 300*time.Millisecond)
	for range 2 * measureEvery / chunk {
		a.wrote(false, chunk, secs(200e6))
	}
	if a.compress || a.rate[0] < 100e6 {
		t.Errorf("slow start on a fast connection: compress %v, measured %.0f MB/s stored", a.compress, a.rate[0]/1e6)
	}
}

// slowStart is a fast writer whose second write (an archive's first frame of files, after the
// plan's) takes 1.5 s, as the first files' reads and the box's start do. Time is its own: each
// reading of the link's clock moves it 1 ms, that write 1.5 s more, so the sender's speed on a
// loaded machine (under the race detector it once read as a slow link) plays no part.
type slowStart struct {
	bytes.Buffer
	writes int
	mu     sync.Mutex
	now    time.Time
}

func (w *slowStart) Write(p []byte) (int, error) {
	if w.writes++; w.writes == 2 {
		w.mu.Lock()
		w.now = w.now.Add(1500 * time.Millisecond)
		w.mu.Unlock()
	}
	return w.Buffer.Write(p)
}

func (w *slowStart) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.now = w.now.Add(time.Millisecond)
	return w.now
}

// TestArchiveStartIsNotMeasured: the plan goes in a frame of its own, and neither it nor the first
// frame of files (which holds the start) is taken for the link's speed: a slow start on a fast
// link leaves every frame stored. Counting the first files' frame, 4 MiB in over the start read as
// a link under the threshold (4 MB/s here: a start of 1.5 s reads as 2.8 MB/s) and switched to
// compression. The link's clock is the writer's own (slowStart).
func TestArchiveStartIsNotMeasured(t *testing.T) {
	defer func(v float64) { compressBelow = v }(compressBelow)
	compressBelow = 4 << 20
	w := &slowStart{now: time.Unix(0, 0)}
	defer func(f func() time.Time) { frameNow = f }(frameNow)
	frameNow = w.clock
	src := t.TempDir()
	files := map[string]string{}
	for i := range 12 {
		files[fmt.Sprintf("f%02d", i)] = strings.Repeat(fmt.Sprintf("line %d of a compressible file\n", i), 1<<15)
	}
	synctest.Write(t, src, files)
	m := build(t, src)
	if _, err := Write(synctest.Context(t), w, src, PlanFor(nil, m)); err != nil {
		t.Fatal(err)
	}
	st := frames(t, w.Bytes())
	if len(st) < 8 || slices.Contains(st, false) {
		t.Fatalf("frames stored: %v; want all stored", st)
	}
}
