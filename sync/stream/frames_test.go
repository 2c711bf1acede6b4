package stream

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
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

// diskBoundWriter stands for a receiver whose disk is the limit: it takes rate bytes of the
// decoded stream per second, however compressed the frames are (one frame per Write).
type diskBoundWriter struct {
	bytes.Buffer
	rate float64
	dec  *zstd.Decoder
}

func (w *diskBoundWriter) Write(p []byte) (int, error) {
	out, err := w.dec.DecodeAll(p, nil)
	if err != nil {
		return 0, err
	}
	time.Sleep(time.Duration(float64(len(out)) / w.rate * float64(time.Second)))
	return w.Buffer.Write(p)
}

// TestFrameWriterStoresForABusyReceiver: auto mode tries compression when the connection is slow,
// sees that it does not go faster (the receiver, not the link, is the limit) and goes back to
// stored frames.
func TestFrameWriterStoresForABusyReceiver(t *testing.T) {
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	data := []byte(strings.Repeat("a compressible line of source code, repeated\n", 700_000)) // ~31 MB
	w := &diskBoundWriter{rate: CompressBelow * 0.8, dec: dec}
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
	compressed := 0
	for _, s := range st {
		if !s {
			compressed++
		}
	}
	if compressed == 0 || !st[len(st)-1] || !st[len(st)-2] {
		t.Fatalf("frames stored: %v; want a probe of compressed frames, then stored ones again", st)
	}
}
