package manifest

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// lazyEntries is a JSON document of about size bytes generated as it is read, so that a test
// can feed hundreds of MiB to a decoder without allocating them: prefix, then entries made by
// entry(i, buf) (appending to buf), comma-separated, then suffix.
type lazyEntries struct {
	prefix, suffix string
	entry          func(i int, b []byte) []byte
	size           int64

	buf  []byte
	i    int
	sent int64
	done bool
}

func (l *lazyEntries) Read(p []byte) (int, error) {
	for len(l.buf) == 0 {
		switch {
		case l.done:
			return 0, io.EOF
		case l.i == 0 && l.sent == 0:
			l.buf = append(l.buf, l.prefix...)
		case l.sent >= l.size:
			l.buf, l.done = append(l.buf, l.suffix...), true
		default:
			if l.i > 0 {
				l.buf = append(l.buf, ',')
			}
			l.buf = l.entry(l.i, l.buf)
			l.i++
		}
	}
	n := copy(p, l.buf)
	l.buf = l.buf[:copy(l.buf, l.buf[n:])]
	l.sent += int64(n)
	return n, nil
}

// allocated is how many bytes of heap f allocated (runtime.MemStats.TotalAlloc), garbage
// included: a bound on the heap it ever held.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A box's manifest whose keys are JSON-escaped ("\u0070ath" is "path") is counted entry by entry
// all the same: 236 MiB of them are refused at the entry bound, having cost far less heap than
// the input's size. (Counting "path" in the raw bytes missed every entry and decoded the whole
// manifest: 2.8 GiB of heap.)
func TestDecodeRefusesEscapedKeysWithBoundedHeap(t *testing.T) {
	const size = 236 << 20
	sha := strings.Repeat("ab", 32)
	in := &lazyEntries{
		prefix: `{"version":1,"entries":[`, suffix: `]}`, size: size,
		entry: func(i int, b []byte) []byte {
			return fmt.Appendf(b, `{"\u0070ath":"src/pkg%05d/file%04d.go","\u0074ype":"file","mode":420,"size":%d,"mtime":1700000000000000000,"sha256":"%s"}`, i/1000, i%1000, 1000+i%5000, sha)
		},
	}
	var err error
	heap := allocated(func() { _, err = Decode(in, Limits{}) })
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 200000 entries") {
		t.Fatalf("err %v, want ErrTooLarge past 200000 entries", err)
	}
	t.Logf("refused after reading %d MiB of %d MiB, %d MiB of heap allocated: %v", in.sent>>20, size>>20, heap>>20, err)
	// Twice that under the race detector, whose runtime allocates more for the same decoding
	// (81 MiB where 50 MiB without).
	if maxHeap := uint64(64 << 20 * (1 + raceEnabled)); heap > maxHeap {
		t.Fatalf("decoding the refused manifest allocated %d MiB, want < %d MiB", heap>>20, maxHeap>>20)
	}
	if in.sent > 64<<20 {
		t.Fatalf("read %d MiB of the manifest before refusing it, want at most the 64 MiB bound", in.sent>>20)
	}
}

// The version comes first and is checked before any entry is read: a manifest of another
// version is refused at once, whatever follows it.
func TestDecodeChecksTheVersionFirst(t *testing.T) {
	in := &lazyEntries{
		prefix: `{"version":7,"entries":[`, suffix: `]}`, size: 200 << 20,
		entry: func(i int, b []byte) []byte { return fmt.Appendf(b, `{"path":"d%08d","type":"dir","mode":493}`, i) },
	}
	_, err := Decode(in, Limits{})
	if err == nil || !strings.Contains(err.Error(), "version 7 not supported") {
		t.Fatalf("err %v, want version 7 refused", err)
	}
	if in.sent > 64<<10 {
		t.Fatalf("read %d bytes before refusing the version", in.sent)
	}
	for name, doc := range map[string]string{
		"version last":     `{"entries":[],"version":1}`,
		"no version":       `{}`,
		"repeated version": `{"version":1,"version":1,"entries":[]}`,
		"repeated entries": `{"version":1,"entries":[],"entries":[]}`,
		"not an object":    `[1]`,
		"entries object":   `{"version":1,"entries":{}}`,
	} {
		if _, err := Decode(strings.NewReader(doc), Limits{}); err == nil {
			t.Errorf("%s: %s accepted", name, doc)
		}
	}
}

// Past the byte bound a manifest is refused as soon as the bound is read, even when its entry
// bound is far away.
func TestDecodeRefusesPastTheByteBound(t *testing.T) {
	in := &lazyEntries{
		prefix: `{"version":1,"entries":[`, suffix: `]}`, size: 200 << 20,
		entry: func(i int, b []byte) []byte { return fmt.Appendf(b, `{"path":"d%08d","type":"dir","mode":493}`, i) },
	}
	_, err := Decode(in, Limits{MaxBytes: 4 << 20, MaxEntries: 1 << 30})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 4194304 bytes") {
		t.Fatalf("err %v, want ErrTooLarge past 4 MiB", err)
	}
	if in.sent > 4<<20+64<<10 {
		t.Fatalf("read %d bytes, want no more than the 4 MiB bound and a read ahead", in.sent)
	}
}
