package stream

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The box's commands give sshd's pipes 1 MiB instead of 64 KiB; anything that is not a pipe is
// left as it is.
func TestGrowPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	growPipe(r)
	after, err := unix.FcntlInt(w.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after != 1<<20 || before >= after {
		t.Fatalf("pipe capacity %d, then %d after growPipe: want 1 MiB", before, after)
	}
	// The pipe still carries data both ways of its new room.
	msg := make([]byte, 512<<10)
	if n, err := w.Write(msg); err != nil || n != len(msg) {
		t.Fatalf("write %d bytes into the grown pipe without a reader: %d, %v", len(msg), n, err)
	}

	// A pipe already larger than 1 MiB keeps its size.
	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	defer w2.Close()
	if _, err := unix.FcntlInt(r2.Fd(), unix.F_SETPIPE_SZ, 4<<20); err == nil {
		growPipe(r2)
		if n, _ := unix.FcntlInt(r2.Fd(), unix.F_GETPIPE_SZ, 0); n != 4<<20 {
			t.Fatalf("a 4 MiB pipe has %d bytes after growPipe: want it left alone", n)
		}
	}

	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	growPipe(f) // not a pipe: nothing happens, nothing fails
	growPipe(nil)
	if _, err := f.WriteString("still a file"); err != nil {
		t.Fatal(err)
	}
}
