package local

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// inProcessBox runs Serve in this process and returns its state once it is ready.
func inProcessBox(t *testing.T) (State, string) {
	t.Helper()
	st, dir, _ := stoppableBox(t)
	return st, dir
}

// stoppableBox is inProcessBox with a stop that returns once Serve has (stop runs at the end of
// the test too).
func stoppableBox(t *testing.T) (State, string, func()) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "box")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan State, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, BoxConfig{Dir: dir, LeaseID: "lb_test", Labels: map[string]string{"k": "v"},
			Ready: func(st State) { ready <- st }})
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(stop)
	select {
	case st := <-ready:
		return st, dir, stop
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	case <-testenv.Context(t, 20*time.Second).Done():
		t.Fatal("box not ready")
	}
	panic("unreachable")
}

func dialState(t *testing.T, st State) *ssh.Client {
	t.Helper()
	c, err := dialBox(t, st.Host, st.Port, st.User, st.ClientKeyPath, st.HostKey)
	if err != nil {
		t.Fatalf("dial box: %v", err)
	}
	return c
}

// newSession opens a session on c, closed when the test ends.
func newSession(t *testing.T, c *ssh.Client) *ssh.Session {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestBoxState(t *testing.T) {
	st, dir := inProcessBox(t)
	got, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.PID != os.Getpid() || got.Port != st.Port || got.LeaseID != "lb_test" || got.Labels["k"] != "v" || got.Host != "127.0.0.1" {
		t.Fatalf("state = %+v", got)
	}
	for _, p := range []string{statePath(dir), hostKeyPath(dir), clientKeyPath(dir)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", p, fi.Mode().Perm())
		}
	}
}

func TestBoxExecEnvironment(t *testing.T) {
	t.Setenv(canaryEnv, "leaked")
	st, dir := inProcessBox(t)
	c := dialState(t, st)

	out, _, err := run(t, c, `echo "$HOME"; pwd; env`)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != dir || lines[1] != dir {
		t.Fatalf("HOME, pwd = %q, %q; want %q", lines[0], lines[1], dir)
	}
	allowed := map[string]bool{"HOME": true, "PATH": true, "LANG": true, "USER": true, "SHELL": true,
		"PWD": true, "SHLVL": true, "OLDPWD": true, "_": true}
	env := map[string]string{}
	for _, l := range lines[2:] {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
		if !allowed[k] {
			t.Errorf("unexpected variable in box environment: %s", l)
		}
	}
	if env["PATH"] != "/usr/local/bin:/usr/bin:/bin" || env["LANG"] != "C.UTF-8" || env["SHELL"] != "/bin/sh" || env["USER"] != st.User {
		t.Errorf("environment = %v", env)
	}
	if strings.Contains(out, canaryEnv) {
		t.Errorf("test process variable leaked into the box: %s", out)
	}
}

func TestBoxEnvRequests(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	s := newSession(t, c)
	if err := s.Setenv("LC_ALL", "C"); err != nil {
		t.Errorf("LC_ALL refused: %v", err)
	}
	if err := s.Setenv("LD_PRELOAD", "/evil.so"); err == nil {
		t.Error("LD_PRELOAD accepted")
	}
	// Issue 22: the box serves terminals, so a sane pty-req is accepted.
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Errorf("pty-req refused: %v", err)
	}
	out, err := s.Output(`echo "$LC_ALL:${LD_PRELOAD-unset}"`)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "C:unset" {
		t.Errorf("got %q, want C:unset", got)
	}
}

func TestBoxExitStatusAndStdin(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)

	_, _, err := run(t, c, "echo oops >&2; exit 3")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("exit 3: err = %v", err)
	}
	_, _, err = run(t, c, "kill -TERM $$")
	if !errors.As(err, &ee) || ee.Signal() != "TERM" {
		t.Fatalf("kill -TERM $$: err = %v", err)
	}
	_, stderr, _ := run(t, c, "echo oops >&2")
	if stderr != "oops\n" {
		t.Errorf("stderr = %q", stderr)
	}

	s := newSession(t, c)
	s.Stdin = strings.NewReader("hello box")
	out, err := s.Output("tr a-z A-Z")
	if err != nil || string(out) != "HELLO BOX" {
		t.Fatalf("stdin round trip = %q, %v", out, err)
	}
}

// startSleep starts on s a command that runs a background sleep and waits for it, and returns the
// sleep's pid once it runs.
func startSleep(t *testing.T, s *ssh.Session) int {
	t.Helper()
	stdout, err := s.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(`sleep 60 & echo $!; wait`); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("no pid: %v", lines.Err())
	}
	pid, err := strconv.Atoi(strings.TrimSpace(lines.Text()))
	if err != nil {
		t.Fatalf("pid line %q: %v", lines.Text(), err)
	}
	if !testenv.Alive(pid) {
		t.Fatal("sleep is not running")
	}
	return pid
}

func TestBoxKillsAbandonedCommand(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	// The background sleep is in the command's process group and must die with it.
	pid := startSleep(t, s)
	s.Close()
	testenv.Eventually(t, "abandoned command to be killed", func() bool { return !testenv.Alive(pid) })
}

func TestBoxSFTP(t *testing.T) {
	st, dir := inProcessBox(t)
	c := dialState(t, st)
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := sc.MkdirAll("work/src"); err != nil {
		t.Fatal(err)
	}
	f, err := sc.Create("work/src/main.txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("synced\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, "work/src/main.txt"))
	if err != nil || string(onDisk) != "synced\n" {
		t.Fatalf("file in box dir = %q, %v", onDisk, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "from-box.txt"), []byte("box data"), 0o644); err != nil {
		t.Fatal(err)
	}
	rf, err := sc.Open("from-box.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	got, err := io.ReadAll(rf)
	if err != nil || string(got) != "box data" {
		t.Fatalf("read over sftp = %q, %v", got, err)
	}
	if wd, err := sc.Getwd(); err != nil || wd != dir {
		t.Errorf("sftp working directory = %q, %v; want %q", wd, err, dir)
	}
}

func TestBoxStreamLocalForward(t *testing.T) {
	st, dir := inProcessBox(t)
	c := dialState(t, st)
	sock := filepath.Join(dir, "gw.sock")

	// A stale socket from an earlier connection is replaced.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ln, err := c.ListenUnix("gw.sock")
	if err != nil {
		t.Fatalf("ListenUnix: %v", err)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, want socket 0600", fi.Mode())
	}

	local, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	remote, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()

	if _, err := local.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(remote, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("box→gateway = %q, %v", buf, err)
	}
	if _, err := remote.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(local, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("gateway→box = %q, %v", buf, err)
	}
	// Half-close from the box side reaches the gateway as EOF, and the other direction still works.
	if err := local.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(remote); err != nil || len(rest) != 0 {
		t.Fatalf("after half-close: %q, %v", rest, err)
	}
	if _, err := remote.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(local, buf); err != nil || string(buf) != "last" {
		t.Fatalf("after half-close gateway→box = %q, %v", buf, err)
	}

	// Cancel removes the socket.
	if err := ln.Close(); err != nil {
		t.Fatalf("cancel forward: %v", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket after cancel: %v", err)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("dial after cancel succeeded")
	}
}

func TestBoxForwardsEndWithConnection(t *testing.T) {
	st, dir := inProcessBox(t)
	c := dialState(t, st)
	if _, err := c.ListenUnix("worker.sock"); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "worker.sock")
	if _, err := os.Lstat(sock); err != nil {
		t.Fatal(err)
	}
	// A regular file is never unlinked for a forward.
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListenUnix("data"); err == nil {
		t.Error("forward over a regular file accepted")
	}
	c.Close()
	testenv.Eventually(t, "forward socket removed after disconnect", func() bool {
		_, err := os.Lstat(sock)
		return errors.Is(err, fs.ErrNotExist)
	})
	if b, err := os.ReadFile(filepath.Join(dir, "data")); err != nil || string(b) != "x" {
		t.Errorf("regular file touched: %q, %v", b, err)
	}
}

// A local box shares its host's /tmp: once it stops, an empty directory directly under /tmp that
// held a socket it forwarded (the gateway's /tmp/ocw-<hash> of a deep HOME) goes, as it would with
// the machine. A directory with anything else in it, or one elsewhere, stays.
func TestBoxRemovesItsEmptySocketDirsUnderTmpWhenItStops(t *testing.T) {
	st, dir, stop := stoppableBox(t)
	c := dialState(t, st)
	tmpDir := func() string {
		d, err := os.MkdirTemp("/tmp", "ocw-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	empty, used, deep := tmpDir(), tmpDir(), filepath.Join(dir, "deep")
	if err := os.WriteFile(filepath.Join(used, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{empty, used, deep} {
		if _, err := c.ListenUnix(filepath.Join(d, "gateway.sock")); err != nil {
			t.Fatalf("forward in %s: %v", d, err)
		}
	}
	c.Close()
	stop()
	if _, err := os.Lstat(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("empty socket dir %s after the box stopped: %v, want it gone", empty, err)
	}
	for _, d := range []string{used, deep} {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("socket dir %s after the box stopped: %v, want it kept", d, err)
		}
	}
}

func TestBoxGlobalRequests(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	ok, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
	if err != nil || ok {
		t.Errorf("keepalive: ok=%v err=%v; want a failure reply like OpenSSH", ok, err)
	}
	if _, err := c.Dial("tcp", "127.0.0.1:1"); err == nil {
		t.Error("direct-tcpip accepted")
	}
}

func TestBoxRejectsWrongKeyAndUser(t *testing.T) {
	st, _ := inProcessBox(t)
	_, other := tunneltest.Key(t)
	if _, err := dialWith(t, st.Host, st.Port, st.User, other, st.HostKey); err == nil {
		t.Error("login with an unauthorized key succeeded")
	}
	if _, err := dialBox(t, st.Host, st.Port, st.User+"x", st.ClientKeyPath, st.HostKey); err == nil {
		t.Error("login as another user succeeded")
	}
	// The client refuses a box whose host key does not match the pin.
	if _, err := dialBox(t, st.Host, st.Port, st.User, st.ClientKeyPath, authorizedKeyString(other.PublicKey())); err == nil {
		t.Error("login with a wrong host key pin succeeded")
	}
}

func TestBoxTerminal(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	s := newSession(t, c)
	if err := s.RequestPty("xterm-256color", 30, 100, ssh.TerminalModes{}); err != nil {
		t.Fatalf("pty-req: %v", err)
	}
	stdout, err := s.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(`tty; stty size; echo "TERM=$TERM pid=$$"; echo ready; read x; stty size; exit 7`); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("output ended: %v", lines.Err())
		}
		return strings.TrimRight(lines.Text(), "\r")
	}
	if tty := next(); !strings.HasPrefix(tty, "/dev/pts/") {
		t.Fatalf("tty = %q, want a /dev/pts name", tty)
	}
	if size := next(); size != "30 100" {
		t.Errorf("stty size = %q, want 30 100", size)
	}
	var pid int
	if line := next(); !strings.HasPrefix(line, "TERM=xterm-256color pid=") {
		t.Errorf("environment line = %q", line)
	} else if pid, err = strconv.Atoi(strings.TrimPrefix(line, "TERM=xterm-256color pid=")); err != nil {
		t.Fatal(err)
	}
	if r := next(); r != "ready" {
		t.Fatalf("got %q, want ready", r)
	}
	// A window-change with want-reply: once answered, the terminal has the new size.
	ok, err := s.SendRequest("window-change", true, ssh.Marshal(windowChange{Columns: 120, Rows: 40}))
	if err != nil || !ok {
		t.Fatalf("window-change = %v, %v", ok, err)
	}
	ok, err = s.SendRequest("window-change", true, ssh.Marshal(windowChange{Columns: 70000, Rows: 40}))
	if err != nil || ok {
		t.Errorf("window-change to 70000 columns = %v, %v; want refused", ok, err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if echo := next(); echo != "go" {
		t.Errorf("terminal echo = %q, want go", echo)
	}
	if size := next(); size != "40 120" {
		t.Errorf("stty size after window-change = %q, want 40 120", size)
	}
	var ee *ssh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 7 {
		t.Fatalf("exit: err = %v, want status 7", err)
	}
	if pid == 0 || testenv.Alive(pid) {
		t.Errorf("shell %d still running after its exit was reported", pid)
	}
}

func TestBoxTerminalShell(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	s := newSession(t, c)
	if err := s.RequestPty("vt100", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatalf("pty-req: %v", err)
	}
	var out bytes.Buffer
	s.Stdout = &out
	s.Stdin = strings.NewReader("echo \"in:$(tty)\"; exit 5\n")
	if err := s.Shell(); err != nil {
		t.Fatal(err)
	}
	var ee *ssh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 5 {
		t.Fatalf("shell exit: err = %v, want status 5", err)
	}
	if !strings.Contains(out.String(), "in:/dev/pts/") {
		t.Errorf("interactive shell output = %q, want it on a /dev/pts terminal", out.String())
	}
}

func TestBoxRefusesHostilePtyRequests(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	for _, tc := range []struct {
		name       string
		term       string
		cols, rows uint32
	}{
		{"shell metacharacters in term", "xterm;touch /tmp/x", 80, 24},
		{"newline in term", "xterm\nTERM=evil", 80, 24},
		{"escape in term", "xterm\x1b[2J", 80, 24},
		{"empty term", "", 80, 24},
		{"long term", strings.Repeat("x", 65), 80, 24},
		{"zero columns", "xterm", 0, 24},
		{"zero rows", "xterm", 80, 0},
		{"huge columns", "xterm", 10001, 24},
		{"huge rows", "xterm", 80, 1 << 31},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t, c)
			ok, err := s.SendRequest("pty-req", true, ssh.Marshal(ptyRequest{Term: tc.term, Columns: tc.cols, Rows: tc.rows}))
			if err != nil || ok {
				t.Fatalf("pty-req = %v, %v; want refused", ok, err)
			}
			// Refused means no terminal: the command runs on pipes.
			if out, err := s.Output("tty"); err == nil {
				t.Errorf("tty succeeded after a refused pty-req: %q", out)
			}
		})
	}
	t.Run("window-change without a terminal", func(t *testing.T) {
		s := newSession(t, c)
		stdin, err := s.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start("cat"); err != nil {
			t.Fatal(err)
		}
		ok, err := s.SendRequest("window-change", true, ssh.Marshal(windowChange{Columns: 80, Rows: 24}))
		if err != nil || ok {
			t.Errorf("window-change on a pipe session = %v, %v; want refused", ok, err)
		}
		stdin.Close()
		if err := s.Wait(); err != nil {
			t.Errorf("cat: %v", err)
		}
	})
}

func TestBoxTerminalAbandoned(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	openFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := openFDs()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	// The background sleep shares the terminal's session and must die when the client goes.
	pid := startSleep(t, s)
	if openFDs() <= before {
		t.Fatal("a terminal session holds no descriptor: the leak check below cannot fail")
	}
	s.Close()
	testenv.Eventually(t, "abandoned terminal command to be killed", func() bool { return !testenv.Alive(pid) })
	testenv.Eventually(t, "terminal descriptors to be closed", func() bool { return openFDs() <= before })
}

func TestBoxTerminalEndsWithShell(t *testing.T) {
	st, _ := inProcessBox(t)
	c := dialState(t, st)
	s := newSession(t, c)
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	stdout, err := s.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The background sleep inherits the ignored SIGHUP and holds the terminal after the shell exits.
	if err := s.Start(`trap '' HUP; sleep 60 & echo "bg=$!"; exit 3`); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("no pid: %v", lines.Err())
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(lines.Text(), "bg=")))
	if err != nil {
		t.Fatalf("pid line %q: %v", lines.Text(), err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err := <-done:
		var ee *ssh.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
			t.Fatalf("exit: err = %v, want status 3", err)
		}
	case <-testenv.Context(t, 20*time.Second).Done():
		t.Fatal("the session stayed open while a background process held its terminal")
	}
	if !testenv.Alive(pid) {
		t.Error("the background process did not outlive the session: the check above proved nothing")
	}
}
