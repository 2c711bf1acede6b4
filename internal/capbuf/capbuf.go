// Package capbuf is a buffer that keeps the first bytes written to it and counts the rest away,
// for output of commands that are not trusted to bound it.
package capbuf

import "bytes"

// Buffer keeps the first Max bytes written to it; later bytes are dropped (Truncated says so)
// and every Write reports success, so a writer is never blocked or failed by the cap.
type Buffer struct {
	bytes.Buffer
	Max       int
	Truncated bool
}

// New returns a Buffer that keeps max bytes.
func New(max int) *Buffer { return &Buffer{Max: max} }

func (b *Buffer) Write(p []byte) (int, error) {
	room := b.Max - b.Len()
	if room < len(p) {
		b.Truncated = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// Tail keeps the last Max bytes written to it (an output tail); earlier bytes are dropped and
// counted in Dropped. Every Write reports success.
type Tail struct {
	Max     int
	Dropped int64
	buf     []byte
}

// NewTail returns a Tail that keeps max bytes.
func NewTail(max int) *Tail { return &Tail{Max: max} }

func (t *Tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.Max {
		t.Dropped += int64(len(t.buf) + len(p) - t.Max)
		t.buf = append(t.buf[:0], p[len(p)-t.Max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.Max; over > 0 {
		t.Dropped += int64(over)
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// Bytes returns the kept tail.
func (t *Tail) Bytes() []byte { return t.buf }
