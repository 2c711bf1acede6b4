package synctest

import (
	"io"
	"runtime"
)

// LazyJSON is a JSON document generated as it is read, so that a test can feed hundreds of MiB
// of hostile input to a decoder without allocating them: Prefix, then the entries Entry(i, buf)
// appends for i = 0, 1, …, comma-separated, until Size bytes were read, then Suffix.
type LazyJSON struct {
	Prefix, Suffix string
	Entry          func(i int, b []byte) []byte
	Size           int64

	buf  []byte
	i    int
	sent int64
	done bool
}

// Sent is how many bytes were read.
func (l *LazyJSON) Sent() int64 { return l.sent }

func (l *LazyJSON) Read(p []byte) (int, error) {
	for len(l.buf) == 0 {
		switch {
		case l.done:
			return 0, io.EOF
		case l.i == 0 && l.sent == 0 && l.Prefix != "":
			l.buf = append(l.buf, l.Prefix...)
		case l.sent >= l.Size:
			l.buf, l.done = append(l.buf, l.Suffix...), true
		default:
			if l.i > 0 {
				l.buf = append(l.buf, ',')
			}
			l.buf = l.Entry(l.i, l.buf)
			l.i++
		}
	}
	n := copy(p, l.buf)
	l.buf = l.buf[:copy(l.buf, l.buf[n:])]
	l.sent += int64(n)
	return n, nil
}

// Allocated is how many bytes of heap f allocated (runtime.MemStats.TotalAlloc), garbage
// included: a bound on the heap it ever held.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
