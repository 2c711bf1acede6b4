package capbuf

import (
	"strings"
	"testing"
)

func TestBufferKeepsTheFirstBytes(t *testing.T) {
	b := New(5)
	for _, s := range []string{"ab", "cd", "efgh", "ij"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if b.String() != "abcde" || !b.Truncated {
		t.Fatalf("kept %q, truncated %v; want \"abcde\", true", b.String(), b.Truncated)
	}
	small := New(10)
	_, _ = small.Write([]byte(strings.Repeat("x", 10)))
	if small.Truncated || small.Len() != 10 {
		t.Fatalf("a write that fits exactly: truncated %v, len %d", small.Truncated, small.Len())
	}
}

func TestTailKeepsTheLastBytes(t *testing.T) {
	tl := NewTail(5)
	for _, s := range []string{"ab", "cd", "efgh", "ij"} {
		if n, err := tl.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if string(tl.Bytes()) != "fghij" || tl.Dropped != 5 {
		t.Fatalf("kept %q, dropped %d; want \"fghij\", 5", tl.Bytes(), tl.Dropped)
	}
	big := NewTail(3)
	_, _ = big.Write([]byte("x"))
	_, _ = big.Write([]byte("abcdef"))
	if string(big.Bytes()) != "def" || big.Dropped != 4 {
		t.Fatalf("one write larger than the tail: kept %q, dropped %d", big.Bytes(), big.Dropped)
	}
}
