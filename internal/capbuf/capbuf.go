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
