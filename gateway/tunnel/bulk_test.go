package tunnel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"testing"
)

// TestHubForwardsBulk moves a stream larger than the channel's window both ways through a real
// tunnel, read in small pieces on the hub side (as net/http reads), and checks every byte.
func TestHubForwardsBulk(t *testing.T) {
	b := startBox(t)
	h, _ := testHub(t, nil)
	ctx := testContext(t)
	if err := h.Open(ctx, b.target("env-a", "")); err != nil {
		t.Fatalf("open: %v", err)
	}
	w := dialSocket(t, b.socket(testSocket))
	c := acceptOne(t, h)
	// A read that waits for bytes that never come ends with the test's context.
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		w.Close()
	})
	defer stop()
	defer c.Close()

	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	want := sha256.Sum256(data)
	smallReads := func(r io.Reader) ([32]byte, error) {
		hsh := sha256.New()
		buf := make([]byte, 4096)
		for n := 0; n < len(data); {
			k, err := r.Read(buf)
			hsh.Write(buf[:k])
			n += k
			if err != nil {
				return [32]byte{}, err
			}
		}
		return [32]byte(hsh.Sum(nil)), nil
	}

	// move writes data to w while r is read in small pieces; the bytes read must be those written.
	move := func(what string, w io.Writer, r io.Reader) {
		t.Helper()
		werr := make(chan error, 1)
		go func() {
			_, err := io.Copy(w, bytes.NewReader(data))
			werr <- err
		}()
		got, err := smallReads(r)
		if err != nil {
			t.Fatalf("%s: read: %v", what, err)
		}
		if err := <-werr; err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		if got != want {
			t.Fatalf("%s: the bytes read differ from those written", what)
		}
	}
	move("box → hub", w, c)
	move("hub → box", c, w)
}
