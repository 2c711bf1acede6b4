package remote

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestLogFileStaysBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "worker.log")
	l, err := OpenLogFile(p, 1000)
	if err != nil {
		t.Fatal(err)
	}
	line := bytes.Repeat([]byte("x"), 99)
	line = append(line, '\n')
	for i := 0; i < 100; i++ {
		if _, err := l.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	for _, f := range []string{p, p + ".1"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 1000 {
			t.Fatalf("%s is %d bytes, limit 1000", f, fi.Size())
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v", f, fi.Mode().Perm())
		}
	}
}
