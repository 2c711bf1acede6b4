package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Compression selects how an archive's zstd frames are encoded. An archive is a sequence of
// zstd frames, each holding up to chunkSize bytes of the tar stream, either compressed or stored
// (raw blocks): any zstd decoder reads it, and Apply reads every kind the same way.
type Compression string

const (
	// CompressAuto stores chunks while the connection takes them faster than CompressBelow; below
	// that it tries compressed chunks and keeps them only while they go through faster (the link
	// is the limit, not the receiver's disk). On a fast link (same datacenter, LAN, loopback)
	// compressing only costs CPU on both ends; on a slow one it divides the bytes to send by
	// about four for source trees.
	CompressAuto Compression = "auto"
	// CompressZstd compresses every chunk (zstd's fastest level, chunks in parallel).
	CompressZstd Compression = "zstd"
	// CompressNone stores every chunk.
	CompressNone Compression = "none"
)

// ParseCompression checks a compression name ("" is CompressAuto).
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case "":
		return CompressAuto, nil
	case CompressAuto, CompressZstd, CompressNone:
		return c, nil
	}
	return "", fmt.Errorf("compression %q: want auto, zstd or none", s)
}

const (
	// chunkSize is the tar bytes per frame.
	chunkSize = 1 << 20
	// CompressBelow is the link throughput (bytes on the wire per second, while the sender
	// waits for the link) under which CompressAuto compresses: about 200 Mbit/s. zstd's fastest
	// level compresses source trees at roughly 150 MB/s per core here, so above that rate the
	// link is not what limits the transfer.
	CompressBelow = 25 << 20
	// rawBlock is zstd's largest block.
	rawBlock = 128 << 10
	// queued bounds the frames waiting to be written (memory: queued × chunkSize).
	queued = 4
	// measureEvery is the tar bytes over which CompressAuto measures the link.
	measureEvery = 4 << 20
)

// compressBelow is CompressBelow, lowered by a test that must not depend on how fast this
// machine's sender is (under the race detector, on a loaded machine, it can fall under 25 MB/s).
var compressBelow float64 = CompressBelow

// Chunk and frame buffers are reused: an archive of a large tree goes through thousands.
var (
	chunkPool = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize); return &b }}
	framePool = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize+chunkSize/rawBlock*3+16); return &b }}
)

var encoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
})

// frameWriter cuts what is written to it into chunks and writes each as one zstd frame, in order,
// from a goroutine of its own, so that compression (several chunks at once) overlaps the link.
type frameWriter struct {
	w      io.Writer
	mode   Compression
	enc    *zstd.Encoder
	buf    []byte
	head   bool // from beginHead to flushHead: frames of the plan
	closed bool
	jobs   chan *frameJob
	sem    chan struct{}
	done   chan struct{}

	mu  sync.Mutex
	err error
	ad  adapt // CompressAuto's choice
}

// adapt decides, for CompressAuto, whether the next chunks are compressed. It measures the rate at
// which the tar stream goes out (tar bytes per second of wall time, frame after frame) with stored
// frames and, when that is slow, with compressed ones, and keeps the faster: compressing pays when
// the link limits the transfer (the same tar goes through in a quarter of the bytes), not when the
// receiver does (it must still write every byte) nor when the sender's CPU does (compressing is
// then the slower way).
type adapt struct {
	compress   bool
	rate       [2]float64 // tar bytes/s measured stored [0] and compressed [1]; 0 unknown
	skip       int        // frames still to skip after a switch (the link holds earlier frames)
	in         int64      // tar bytes in the current measurement
	took       time.Duration
	sinceProbe int64 // tar bytes since the other mode was last measured
	started    bool  // the first frame was written (it is not measured)
}

const (
	// probeEvery: after this much tar in one mode, the other is measured again (conditions change).
	probeEvery = 64 << 20
	// switchSkip frames after a switch are not measured: the connection's window still holds
	// frames of the other mode.
	switchSkip = 2
)

// wrote records that a frame of tar bytes in was written in took, and decides what comes next.
func (a *adapt) wrote(compressed bool, in int64, took time.Duration) {
	if !a.started {
		// The first frame's time includes the start: the box's command starting, the first files
		// read. It says nothing of the link.
		a.started = true
		return
	}
	if compressed != a.compress {
		return // decided before the last switch
	}
	if a.skip > 0 {
		a.skip--
		return
	}
	a.in += in
	a.took += took
	a.sinceProbe += in
	if a.in < measureEvery {
		return
	}
	m := 0
	if a.compress {
		m = 1
	}
	a.rate[m] = float64(a.in) / max(a.took.Seconds(), 1e-9)
	a.in, a.took = 0, 0
	stored, zstd := a.rate[0], a.rate[1]
	switch {
	case !a.compress && stored < compressBelow && (zstd == 0 || a.sinceProbe >= probeEvery):
		a.set(true) // the link may be slow: see what compression does
	case !a.compress && zstd > 1.2*stored && stored < compressBelow:
		a.set(true)
	case a.compress && zstd <= 1.2*stored:
		a.set(false) // compression did not speed it up: the link is not the limit
	case a.compress && a.sinceProbe >= probeEvery:
		a.set(false) // measure stored frames again
	}
}

func (a *adapt) set(compress bool) {
	a.compress, a.skip, a.sinceProbe, a.in, a.took = compress, switchSkip, 0, 0, 0
}

type frameJob struct {
	out        []byte
	in         int64 // tar bytes in the frame
	compressed bool
	head       bool // the archive's plan: not measured (adapt starts with the frame after it)
	ready      chan struct{}
}

func newFrameWriter(w io.Writer, mode Compression) (*frameWriter, error) {
	if mode == "" {
		mode = CompressAuto
	}
	if _, err := ParseCompression(string(mode)); err != nil {
		return nil, err
	}
	enc, err := encoder()
	if err != nil {
		return nil, err
	}
	f := &frameWriter{w: w, mode: mode, enc: enc, jobs: make(chan *frameJob, queued),
		sem: make(chan struct{}, runtime.GOMAXPROCS(0)), done: make(chan struct{})}
	go f.writeLoop()
	return f, nil
}

func (f *frameWriter) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *frameWriter) Write(p []byte) (int, error) {
	if err := f.failed(); err != nil {
		return 0, err
	}
	n := len(p)
	for len(p) > 0 {
		if f.buf == nil {
			f.buf = (*chunkPool.Get().(*[]byte))[:0]
		}
		k := min(len(p), chunkSize-len(f.buf))
		f.buf = append(f.buf, p[:k]...)
		p = p[k:]
		if len(f.buf) == chunkSize {
			f.flush()
		}
	}
	return n, nil
}

// beginHead starts the archive's head (its plan): frames written until flushHead are not measured
// by the adaptive compression, so that the first frame it sees (not measured either: it holds the
// start) is the first of files.
func (f *frameWriter) beginHead() { f.head = true }

// flushHead sends what was written since beginHead in frames of their own.
func (f *frameWriter) flushHead() {
	if len(f.buf) > 0 {
		f.flush()
	}
	f.head = false
}

// flush hands the current chunk to the writing goroutine, compressed or stored.
func (f *frameWriter) flush() {
	data := f.buf
	f.buf = nil
	job := &frameJob{ready: make(chan struct{}), in: int64(len(data)), compressed: f.compress(), head: f.head}
	out := (*framePool.Get().(*[]byte))[:0]
	if job.compressed {
		f.sem <- struct{}{}
		go func() {
			job.out = f.enc.EncodeAll(data, out)
			chunkPool.Put(&data)
			<-f.sem
			close(job.ready)
		}()
	} else {
		job.out = storedFrame(out, data)
		chunkPool.Put(&data)
		close(job.ready)
	}
	f.jobs <- job
}

func (f *frameWriter) compress() bool {
	switch f.mode {
	case CompressZstd:
		return true
	case CompressNone:
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ad.compress
}

// frameNow is the time of the link's measurement (a test steps it instead of loading the machine).
var frameNow = time.Now

// writeLoop writes the frames in order and measures the link for CompressAuto (adapt).
func (f *frameWriter) writeLoop() {
	defer close(f.done)
	last := frameNow()
	for job := range f.jobs {
		<-job.ready
		if f.failed() != nil {
			continue // drained, not written
		}
		_, err := f.w.Write(job.out)
		// Wall time from the previous frame's end: waiting for this frame (a slow compressor, a
		// slow reader of the tree) counts as much as waiting for the connection.
		now := frameNow()
		took := now.Sub(last)
		last = now
		framePool.Put(&job.out)
		f.mu.Lock()
		if err != nil {
			f.err = err
			f.mu.Unlock()
			continue
		}
		if !job.head {
			f.ad.wrote(job.compressed, job.in, took)
		}
		f.mu.Unlock()
	}
}

// Close writes the last chunk and waits until every frame is written.
func (f *frameWriter) Close() error {
	if f.closed {
		return f.failed()
	}
	f.closed = true
	if len(f.buf) > 0 {
		f.flush()
	}
	close(f.jobs)
	<-f.done
	return f.failed()
}

// abort stops the writing goroutine without writing what is left.
func (f *frameWriter) abort() {
	if f.closed {
		return
	}
	f.closed = true
	f.mu.Lock()
	if f.err == nil {
		f.err = errors.New("archive aborted")
	}
	f.mu.Unlock()
	f.buf = nil
	close(f.jobs)
	<-f.done
}

// storedFrame appends data to out as one zstd frame of raw blocks: magic, a single-segment frame header with
// the 4-byte content size, blocks of at most 128 KiB, no checksum (every file is checked against
// its sha256 anyway).
func storedFrame(out, data []byte) []byte {
	out = binary.LittleEndian.AppendUint32(out, 0xFD2FB528)
	out = append(out, 0xA0) // Frame_Content_Size_flag 2 (4 bytes), Single_Segment_flag
	out = binary.LittleEndian.AppendUint32(out, uint32(len(data)))
	for {
		n := min(len(data), rawBlock)
		h := uint32(n) << 3 // Block_Type 0: Raw_Block
		if n == len(data) {
			h |= 1 // Last_Block
		}
		out = append(out, byte(h), byte(h>>8), byte(h>>16))
		out = append(out, data[:n]...)
		data = data[n:]
		if len(data) == 0 {
			return out
		}
	}
}
