package manifest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

// A box's manifest whose keys are JSON-escaped ("\u0070ath" is "path") is counted entry by entry
// all the same: 236 MiB of them are refused at the entry bound, having cost far less heap than
// the input's size. (Counting "path" in the raw bytes missed every entry and decoded the whole
// manifest: 2.8 GiB of heap.)
func TestDecodeRefusesEscapedKeysWithBoundedHeap(t *testing.T) {
	const size = 236 << 20
	sha := strings.Repeat("ab", 32)
	in := &synctest.LazyJSON{
		Prefix: `{"version":1,"entries":[`, Suffix: `]}`, Size: size,
		Entry: func(i int, b []byte) []byte {
			return fmt.Appendf(b, `{"\u0070ath":"src/pkg%05d/file%04d.go","\u0074ype":"file","mode":420,"size":%d,"mtime":1700000000000000000,"sha256":"%s"}`, i/1000, i%1000, 1000+i%5000, sha)
		},
	}
	var err error
	heap := synctest.Allocated(func() { _, err = Decode(in, Limits{}) })
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 200000 entries") {
		t.Fatalf("err %v, want ErrTooLarge past 200000 entries", err)
	}
	t.Logf("refused after reading %d MiB of %d MiB, %d MiB of heap allocated: %v", in.Sent()>>20, size>>20, heap>>20, err)
	// Twice that under the race detector, whose runtime allocates more for the same decoding
	// (81 MiB where 50 MiB without).
	if maxHeap := uint64(64 << 20 * (1 + raceEnabled)); heap > maxHeap {
		t.Fatalf("decoding the refused manifest allocated %d MiB, want < %d MiB", heap>>20, maxHeap>>20)
	}
	if in.Sent() > 64<<20 {
		t.Fatalf("read %d MiB of the manifest before refusing it, want at most the 64 MiB bound", in.Sent()>>20)
	}
}

// The version comes first and is checked before any entry is read: a manifest of another
// version is refused at once, whatever follows it.
func TestDecodeChecksTheVersionFirst(t *testing.T) {
	in := &synctest.LazyJSON{
		Prefix: `{"version":7,"entries":[`, Suffix: `]}`, Size: 200 << 20,
		Entry: func(i int, b []byte) []byte { return fmt.Appendf(b, `{"path":"d%08d","type":"dir","mode":493}`, i) },
	}
	_, err := Decode(in, Limits{})
	if err == nil || !strings.Contains(err.Error(), "version 7 not supported") {
		t.Fatalf("err %v, want version 7 refused", err)
	}
	if in.Sent() > 64<<10 {
		t.Fatalf("read %d bytes before refusing the version", in.Sent())
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
	in := &synctest.LazyJSON{
		Prefix: `{"version":1,"entries":[`, Suffix: `]}`, Size: 200 << 20,
		Entry: func(i int, b []byte) []byte { return fmt.Appendf(b, `{"path":"d%08d","type":"dir","mode":493}`, i) },
	}
	_, err := Decode(in, Limits{MaxBytes: 4 << 20, MaxEntries: 1 << 30})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 4194304 bytes") {
		t.Fatalf("err %v, want ErrTooLarge past 4 MiB", err)
	}
	if in.Sent() > 4<<20+64<<10 {
		t.Fatalf("read %d bytes, want no more than the 4 MiB bound and a read ahead", in.Sent())
	}
}
