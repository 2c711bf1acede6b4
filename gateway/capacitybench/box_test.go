package capacitybench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// The box side of sections 2 and 3 is this test binary, copied where the box user can run it and
// started over SSH with OPENCLAW_BENCH_BOX=<task JSON>: it runs the task and prints one JSON
// result line.
const envBoxTask = "OPENCLAW_BENCH_BOX"

// boxTask is what the box side does: Relay (section 2) or Bulk (section 3).
type boxTask struct {
	Relay *relayTask `json:",omitempty"`
	Bulk  *bulkTask  `json:",omitempty"`
}

func runBoxTask(spec string) error {
	var task boxTask
	if err := json.Unmarshal([]byte(spec), &task); err != nil {
		return fmt.Errorf("%s: %w", envBoxTask, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var res any
	var err error
	switch {
	case task.Relay != nil:
		res, err = boxRelay(ctx, *task.Relay)
	case task.Bulk != nil:
		res, err = boxBulk(ctx, *task.Bulk)
	default:
		return fmt.Errorf("%s: no task", envBoxTask)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// boxBinary copies this test binary where a box user can execute it (0755 in a 0711 directory).
func boxBinary(t *testing.T) string {
	t.Helper()
	src, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(testenv.PublicDir(t, "ocw-bench-bin"), "bench.test")
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, in); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// onBox runs the box side of task on the box c is logged in to and decodes its result into res.
func onBox(c *ssh.Client, bin string, task boxTask, res any) error {
	spec, err := json.Marshal(task)
	if err != nil {
		return err
	}
	s, err := c.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	var stdout, stderr bytes.Buffer
	s.Stdout, s.Stderr = &stdout, &stderr
	// JSON has no single quotes: the spec goes through the box shell unchanged.
	if err := s.Run(envBoxTask + "='" + string(spec) + "' " + bin); err != nil {
		return fmt.Errorf("box side: %v\n%s", err, strings.TrimSpace(stderr.String()))
	}
	return json.Unmarshal(stdout.Bytes(), res)
}

// bulkTask moves Bytes through the unix socket Sock, Reps times, one connection each: Up writes
// them (box → gateway), else it reads them (gateway → box). Each connection starts with a
// header: 1 for up or 0 for down, then the size (8 bytes, big endian); an upload ends when the
// gateway side answers one byte after the last one.
type bulkTask struct {
	Sock  string
	Up    bool
	Bytes int64
	Reps  int
}

// bulkResult is how long each repetition took, from connect to the last byte.
type bulkResult struct{ Ns []int64 }

func boxBulk(ctx context.Context, task bulkTask) (bulkResult, error) {
	var res bulkResult
	buf := payload()
	for range task.Reps {
		start := time.Now()
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", task.Sock)
		if err != nil {
			return res, err
		}
		if err := bulkTransfer(c, task.Up, task.Bytes, buf); err != nil {
			c.Close()
			return res, err
		}
		res.Ns = append(res.Ns, time.Since(start).Nanoseconds())
		c.Close()
	}
	return res, nil
}

// bulkTransfer is the box side of one connection.
func bulkTransfer(c net.Conn, up bool, n int64, buf []byte) error {
	var hdr [9]byte
	if up {
		hdr[0] = 1
	}
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return err
	}
	if !up {
		got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, n), make([]byte, len(buf)))
		if err == nil && got != n {
			err = fmt.Errorf("read %d of %d bytes", got, n)
		}
		return err
	}
	if err := writeN(c, n, buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, hdr[:1])
	return err
}

// serveBulk is the gateway side of one bulk connection.
func serveBulk(c net.Conn) error {
	defer c.Close()
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	n := int64(binary.BigEndian.Uint64(hdr[1:]))
	buf := payload()
	if hdr[0] == 0 {
		return writeN(c, n, buf)
	}
	got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, n), buf)
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("read %d of %d bytes", got, n)
	}
	_, err = c.Write(hdr[:1])
	return err
}

func writeN(w io.Writer, n int64, buf []byte) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// payload is 256 KiB of incompressible bytes (a fixed xorshift sequence), the same on both sides.
func payload() []byte {
	b := make([]byte, 256<<10)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
}
