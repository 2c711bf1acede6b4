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
	// CompressAuto stores chunks while the link takes them faster than CompressBelow and
	// compresses them while it is slower: on a fast link (same datacenter, LAN, loopback)
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
	// measureEvery is the wire bytes over which CompressAuto measures the link.
	measureEvery = 2 << 20
)

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
	closed bool
	jobs   chan *frameJob
	sem    chan struct{}
	done   chan struct{}

	mu   sync.Mutex
	err  error
	wire int64         // bytes written to w in the current measurement window
	took time.Duration // time spent in w.Write for them
	slow bool          // the last full window was under CompressBelow
}

type frameJob struct {
	out   []byte
	ready chan struct{}
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

// flush hands the current chunk to the writing goroutine, compressed or stored.
func (f *frameWriter) flush() {
	data := f.buf
	f.buf = nil
	job := &frameJob{ready: make(chan struct{})}
	out := (*framePool.Get().(*[]byte))[:0]
	if f.compress() {
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
	return f.slow
}

// writeLoop writes the frames in order and measures the link: after every 2 MiB written, the
// rate at which Write took them (time blocked included, time waiting for frames not) decides
// whether CompressAuto compresses the next chunks.
func (f *frameWriter) writeLoop() {
	defer close(f.done)
	for job := range f.jobs {
		<-job.ready
		if f.failed() != nil {
			continue // drained, not written
		}
		start := time.Now()
		_, err := f.w.Write(job.out)
		took := time.Since(start)
		framePool.Put(&job.out)
		f.mu.Lock()
		if err != nil {
			f.err = err
			f.mu.Unlock()
			continue
		}
		f.wire += int64(len(job.out))
		f.took += took
		if f.wire >= measureEvery {
			f.slow = float64(f.wire)/f.took.Seconds() < CompressBelow
			f.wire, f.took = 0, 0
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
