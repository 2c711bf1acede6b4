package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"golang.org/x/sys/unix"

	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// boxCmd is the CLI against g with the global flags first, so that nothing is appended after an
// exec's "--".
func boxCmd(g *gw, args ...string) *exec.Cmd {
	return exec.Command(openclawBin, append([]string{"--gateway", g.addr, "--data-dir", g.dataDir}, args...)...)
}

// runBoxCLI runs the CLI with stdin and returns stdout, stderr and the exit code.
func runBoxCLI(t *testing.T, g *gw, in string, args ...string) (string, string, int) {
	t.Helper()
	cmd := boxCmd(g, args...)
	var out, errb strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(in), &out, &errb
	err := cmd.Run()
	code := exitCode(err)
	if code == -1 {
		t.Fatalf("openclaw %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// startBoxCLI starts the CLI and returns once a line containing want is on its stdout; the
// returned channel delivers the exit and the full stderr.
func startBoxCLI(t *testing.T, g *gw, want string, args ...string) (lines <-chan string, done <-chan boxExit) {
	t.Helper()
	lines, done, _ = startBoxCLIProcess(t, g, want, args...)
	return lines, done
}

// startBoxCLIProcess is startBoxCLI that also returns the running command.
func startBoxCLIProcess(t *testing.T, g *gw, want string, args ...string) (<-chan string, <-chan boxExit, *exec.Cmd) {
	t.Helper()
	cmd := boxCmd(g, args...)
	pr, pw := io.Pipe()
	var errb strings.Builder
	cmd.Stdout, cmd.Stderr = pw, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ch := make(chan string, 1000)
	d := make(chan boxExit, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		d <- boxExit{exitCode(err), errb.String()}
	}()
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		found := false
		for sc.Scan() {
			if !found && strings.Contains(sc.Text(), want) {
				found = true
				close(seen)
			}
			select {
			case ch <- sc.Text():
			default:
			}
		}
		close(ch)
	}()
	select {
	case <-seen:
	case ex := <-d:
		t.Fatalf("openclaw %v ended (%d) before printing %q: %s", args, ex.code, want, ex.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("openclaw %v: no %q within 30s", args, want)
	}
	return ch, d, cmd
}

type boxExit struct {
	code   int
	stderr string
}

func waitBoxExit(t *testing.T, d <-chan boxExit) boxExit {
	t.Helper()
	select {
	case ex := <-d:
		return ex
	case <-time.After(30 * time.Second):
		t.Fatal("the CLI did not end within 30s")
		return boxExit{}
	}
}

// heartbeats counts the renew (heartbeat) calls lease-dir logged.
func heartbeats(t *testing.T, leaseDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(leaseDir, "calls.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), `"command":"heartbeat"`)
}

// TestBoxAccess drives env exec, ssh (without a terminal), logs and extend through a real gateway
// on real local boxes, hostile cases included.
func TestBoxAccess(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	leased := leaseDirProfile("leased", leaseDir, nil)
	noRenew := strings.Replace(leaseDirProfile("norenew", leaseDir, nil), "      renew:", "      #renew:", 1)
	refusing := leaseDirProfile("refusing", leaseDir, map[string]string{"LEASE_DIR_HEARTBEAT_FAIL": "quota exhausted"})
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+"boxAccess: {maxFrameBytes: 4096, sessionsPerEnvironment: 2}\nprofiles:\n"+leased+noRenew+refusing)
	t.Cleanup(func() { destroyAll(g) })
	e := g.waitReady(g.createEnv("local").ID)

	t.Run("exec", func(t *testing.T) {
		out, errOut, code := runBoxCLI(t, g, "", "env", "exec", e.ID, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if code != 7 || out != "out\n" || errOut != "err\n" {
			t.Errorf("exit 7 with separate streams: code %d stdout %q stderr %q", code, out, errOut)
		}
		out, errOut, code = runBoxCLI(t, g, "", "env", "exec", e.ID, "--", "printf", "%s|", "a b", "c'd", "$HOME")
		if code != 0 || out != "a b|c'd|$HOME|" {
			t.Errorf("argv not passed as it is: code %d stdout %q stderr %q", code, out, errOut)
		}
		out, _, code = runBoxCLI(t, g, "line one\nline two\n", "env", "exec", e.ID, "--", "wc", "-l")
		if code != 0 || strings.TrimSpace(out) != "2" {
			t.Errorf("stdin not passed: code %d stdout %q", code, out)
		}
		_, errOut, code = runBoxCLI(t, g, "", "env", "exec", e.ID, "--", "sh", "-c", "kill -TERM $$")
		if code != 128+15 || !strings.Contains(errOut, "killed by signal TERM") {
			t.Errorf("signal: code %d stderr %q", code, errOut)
		}
		_, errOut, code = runBoxCLI(t, g, "", "env", "exec", e.ID, "uname")
		if code != 1 || !strings.Contains(errOut, "the command after --") {
			t.Errorf("exec without --: code %d stderr %q", code, errOut)
		}
		rows := must(g.client.Audit(g.ctx(), e.ID))(t)
		var audited []string
		for _, r := range rows {
			if r.Kind == "box.exec" {
				audited = append(audited, r.Detail)
			}
		}
		joined := strings.Join(audited, "\n")
		if len(audited) != 4 || !strings.Contains(joined, `exec 'printf' '%s|' 'a b' 'c'\''d' '$HOME'`) || strings.Contains(joined, "line one") {
			t.Errorf("audit of execs (want 4 commands, no input or output): %q", audited)
		}
	})

	t.Run("exec-interrupt", func(t *testing.T) {
		// the first Ctrl-C is sent to the command as INT; its own handling decides the exit
		out, done, cmd := startBoxCLIProcess(t, g, "ready", "env", "exec", e.ID, "--", "sh", "-c", `trap 'echo got-int; exit 9' INT; echo ready; while :; do sleep 1; done`)
		_ = cmd.Process.Signal(os.Interrupt)
		waitLine(t, out, "got-int")
		if ex := waitBoxExit(t, done); ex.code != 9 || !strings.Contains(ex.stderr, "sent INT to the command") {
			t.Errorf("exec after Ctrl-C: %+v", ex)
		}
	})

	t.Run("ssh-without-terminal", func(t *testing.T) {
		out, errOut, code := runBoxCLI(t, g, "echo via-ssh \"$0\"\necho to-err >&2\nexit 3\n", "env", "ssh", e.ID)
		if code != 3 || out != "via-ssh /bin/sh\n" || errOut != "to-err\n" {
			t.Errorf("shell on stdin: code %d stdout %q stderr %q", code, out, errOut)
		}
		var kinds []string
		for _, r := range must(g.client.Audit(g.ctx(), e.ID))(t) {
			if r.Kind == "box.ssh" {
				kinds = append(kinds, r.Detail)
			}
		}
		if len(kinds) != 1 || kinds[0] != "shell without a terminal" {
			t.Errorf("audit of the shell: %q", kinds)
		}
	})

	t.Run("ssh-terminal", func(t *testing.T) {
		// the local box serves terminals like OpenSSH (TestBoxAccessTerminalOnOpenSSH)
		interactiveShell(t, g, e.ID)
	})

	t.Run("logs", func(t *testing.T) {
		logPath := filepath.Join(e.WorkerHome, ".openclaw-worker/state", e.ID, "worker.log")
		appendLines := func(lines ...string) {
			f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, l := range lines {
				fmt.Fprintln(f, l)
			}
		}
		var markers []string
		for i := 1; i <= 10; i++ {
			markers = append(markers, "marker-"+strconv.Itoa(i))
		}
		appendLines(markers...)
		out, errOut, code := runBoxCLI(t, g, "", "env", "logs", e.ID, "--tail", "3")
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if code != 0 || len(lines) != 3 || !strings.Contains(out, "marker-10") || strings.Contains(out, "marker-7") {
			t.Errorf("logs --tail 3: code %d stdout %q stderr %q", code, out, errOut)
		}
		if out, _, code := runBoxCLI(t, g, "", "env", "logs", e.ID); code != 0 || !strings.Contains(out, "marker-1\n") {
			t.Errorf("logs: code %d, no marker-1 in %q", code, out)
		}
		if _, errOut, code := runBoxCLI(t, g, "", "env", "logs", e.ID, "--tail", "20000"); code != 1 || !strings.Contains(errOut, "--tail must be from 0 to 10000") {
			t.Errorf("--tail 20000: code %d stderr %q", code, errOut)
		}
		got, done, cmd := startBoxCLIProcess(t, g, "marker-10", "env", "logs", e.ID, "-f", "--tail", "20")
		appendLines("followed-line")
		waitLine(t, got, "followed-line")
		select {
		case ex := <-done:
			t.Fatalf("logs -f ended by itself: %+v", ex)
		default:
		}
		// Ctrl-C ends a follow cleanly
		_ = cmd.Process.Signal(os.Interrupt)
		if ex := waitBoxExit(t, done); ex.code != 0 {
			t.Errorf("logs -f after Ctrl-C: %+v", ex)
		}
	})

	t.Run("extend", func(t *testing.T) {
		le := g.waitReady(g.createEnv("leased").ID)
		before := heartbeats(t, leaseDir)
		out, errOut, code := runBoxCLI(t, g, "", "env", "extend", le.ID, "--ttl", "48h", "-o", "json")
		if code != 0 {
			t.Fatalf("extend: %d %s", code, errOut)
		}
		var got envs.Environment
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("extend -o json: %v %s", err, out)
		}
		if heartbeats(t, leaseDir) != before+1 {
			t.Errorf("the provider's renew ran %d times, want once", heartbeats(t, leaseDir)-before)
		}
		if !got.TTLDeadline.After(le.CreatedAt.Add(47*time.Hour)) || got.TTLDeadline.After(time.Now().Add(48*time.Hour+time.Minute)) {
			t.Errorf("ttl deadline %s, want about now+48h (created %s)", got.TTLDeadline, le.CreatedAt)
		}
		show, _, _ := runBoxCLI(t, g, "", "env", "show", le.ID)
		if !strings.Contains(show, "ttl deadline") || !strings.Contains(show, got.TTLDeadline.Local().Format(time.RFC3339)) || !strings.Contains(show, "expires") {
			t.Errorf("env show lacks the new deadline %s:\n%s", got.TTLDeadline.Local().Format(time.RFC3339), show)
		}
		if n := g.countNotes(le.ID, "lease extended by 48h0m0s"); n != 1 {
			t.Errorf("%d notes of the extension, want 1", n)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--ttl", "-5m"}, "--ttl must be a positive duration"},
			{[]string{"--ttl", "1000h"}, "boxAccess.maxExtend"},
			{[]string{"--ttl", "soon"}, "invalid argument"},
		} {
			_, errOut, code := runBoxCLI(t, g, "", append([]string{"env", "extend", le.ID}, c.args...)...)
			if code != 1 || !strings.Contains(errOut, c.want) {
				t.Errorf("extend %v: code %d stderr %q, want %q", c.args, code, errOut, c.want)
			}
		}
		if heartbeats(t, leaseDir) != before+1 {
			t.Errorf("a refused extension called the provider")
		}
		after := must(g.client.Environment(g.ctx(), le.ID))(t)
		if !after.TTLDeadline.Equal(got.TTLDeadline) {
			t.Errorf("a refused extension moved the deadline: %s → %s", got.TTLDeadline, after.TTLDeadline)
		}

		nr := g.waitReady(g.createEnv("norenew").ID)
		_, errOut, code = runBoxCLI(t, g, "", "env", "extend", nr.ID, "--ttl", "1h")
		if code != 1 || !strings.Contains(errOut, "conflict") || !strings.Contains(errOut, "has no renew operation") {
			t.Errorf("extend without renew: code %d stderr %q", code, errOut)
		}
		rf := g.waitReady(g.createEnv("refusing").ID)
		was := must(g.client.Environment(g.ctx(), rf.ID))(t)
		_, errOut, code = runBoxCLI(t, g, "", "env", "extend", rf.ID, "--ttl", "1h")
		if code != 1 || !strings.Contains(errOut, "refused to renew") || !strings.Contains(errOut, "quota exhausted") {
			t.Errorf("extend refused by the provider: code %d stderr %q", code, errOut)
		}
		if now := must(g.client.Environment(g.ctx(), rf.ID))(t); !now.TTLDeadline.Equal(was.TTLDeadline) || !now.Lease.ExpiresAt.Equal(was.Lease.ExpiresAt) {
			t.Errorf("a refused renewal changed the environment: %s/%s → %s/%s", was.TTLDeadline, was.Lease.ExpiresAt, now.TTLDeadline, now.Lease.ExpiresAt)
		}
	})

	t.Run("hostile", func(t *testing.T) {
		for _, args := range [][]string{
			{"env", "exec", "env_nope", "--", "true"}, {"env", "ssh", "env_nope"}, {"env", "logs", "env_nope"}, {"env", "extend", "env_nope", "--ttl", "1h"},
		} {
			if _, errOut, code := runBoxCLI(t, g, "", args...); code != 1 || !strings.Contains(errOut, "not-found") {
				t.Errorf("%v: code %d stderr %q", args, code, errOut)
			}
		}
		// the operator token is required
		req, _ := http.NewRequestWithContext(g.ctx(), http.MethodGet, "http://"+g.addr+"/api/v1/environments/"+e.ID+"/exec", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("exec without the token: %v %v", err, resp)
		} else {
			resp.Body.Close()
		}
		// a flooding box: every frame is at most boxAccess.maxFrameBytes, and all of it arrives
		ctx := testenv.Context(t, 30*time.Second)
		ws, _, err := websocket.Dial(ctx, "ws://"+g.addr+"/api/v1/environments/"+e.ID+"/exec", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": []string{"Bearer " + g.client.Token}}})
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		ws.SetReadLimit(1 << 20)
		if err := wsjson.Write(ctx, ws, boxaccess.Start{Command: []string{"head", "-c", "1000000", "/dev/zero"}}); err != nil {
			t.Fatal(err)
		}
		total, biggest := 0, 0
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("flood: %v after %d bytes", err, total)
			}
			if typ == websocket.MessageText {
				if !strings.Contains(string(b), `"exit":{"code":0}`) {
					t.Errorf("flood exit: %s", b)
				}
				break
			}
			total += len(b) - 1
			biggest = max(biggest, len(b))
		}
		if total != 1000000 || biggest > 4096 {
			t.Errorf("flood: %d bytes, biggest frame %d (maxFrameBytes 4096)", total, biggest)
		}
		// a bad start message is refused before anything runs on the box
		ws2, _, err := websocket.Dial(ctx, "ws://"+g.addr+"/api/v1/environments/"+e.ID+"/exec", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": []string{"Bearer " + g.client.Token}}})
		if err != nil {
			t.Fatal(err)
		}
		defer ws2.CloseNow()
		if err := wsjson.Write(ctx, ws2, boxaccess.Start{TTY: true, Term: "xterm; rm -rf /", Rows: 24, Cols: 80}); err != nil {
			t.Fatal(err)
		}
		var m boxaccess.Control
		if err := wsjson.Read(ctx, ws2, &m); err != nil || m.Exit == nil || !strings.Contains(m.Exit.Error, "bad start message: term") {
			t.Errorf("bad term: %v %+v", err, m.Exit)
		}

		// the environment is destroyed while a command runs and a log is followed: both end, the
		// command is killed on the box, and the destroy is not held
		d := g.waitReady(g.createEnv("local").ID)
		out, done := startBoxCLI(t, g, "pid", "env", "exec", d.ID, "--", "sh", "-c", "echo pid $$; exec sleep 600")
		pid, err := strconv.Atoi(strings.TrimPrefix(<-out, "pid "))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		_, logDone := startBoxCLI(t, g, "", "env", "logs", d.ID, "-f", "--tail", "1")
		// a third session on the environment is refused (boxAccess.sessionsPerEnvironment: 2)
		if _, errOut, code := runBoxCLI(t, g, "", "env", "exec", d.ID, "--", "true"); code != 1 || !strings.Contains(errOut, "boxAccess.sessionsPerEnvironment") {
			t.Errorf("a third session: code %d stderr %q", code, errOut)
		}
		if got, err := g.destroy(d.ID, true, 30*time.Second); err != nil || got.State != envs.Destroyed {
			t.Fatalf("destroy during an exec: %v %s", err, got.State)
		}
		if ex := waitBoxExit(t, done); ex.code != 255 || !strings.Contains(ex.stderr, "environment "+d.ID+" is ") || !strings.Contains(ex.stderr, "the session on its box was closed") {
			t.Errorf("exec on a destroyed environment: %+v", ex)
		}
		if ex := waitBoxExit(t, logDone); ex.code != 0 || !strings.Contains(ex.stderr, "the log ended") {
			t.Errorf("logs -f on a destroyed environment: %+v", ex)
		}
		waitGone(t, pid)
		if _, errOut, code := runBoxCLI(t, g, "", "env", "exec", d.ID, "--", "true"); code != 1 || !strings.Contains(errOut, "it has no box to reach") {
			t.Errorf("exec on a destroyed environment: code %d stderr %q", code, errOut)
		}
	})
}

// TestBoxAccessEndsAtGatewayStop: a gateway that stops ends an open log follow at once and stops
// cleanly (the follow does not hold the HTTP server's drain).
func TestBoxAccessEndsAtGatewayStop(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), fastWorkerConfig)
	t.Cleanup(func() { destroyAll(g) })
	e := g.waitReady(g.createEnv("local").ID)
	_, done := startBoxCLI(t, g, "", "env", "logs", e.ID, "-f")
	g.stop()
	if ex := waitBoxExit(t, done); ex.code != 0 {
		t.Errorf("logs -f across a gateway stop: %+v", ex)
	}
	g.start() // so that the cleanup destroys the box
}

// waitLine waits for a line containing want on lines.
func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("output ended before %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q within 30s", want)
		}
	}
}

// openPTY opens a pseudo-terminal pair (master, slave) of 30 rows and 100 columns.
func openPTY(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	setWinsize(t, master, 30, 100)
	return master, slave
}

func setWinsize(t *testing.T, f *os.File, rows, cols int) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		t.Fatal(err)
	}
}

// TestBoxAccessTerminalOnOpenSSH: env ssh on a terminal against real OpenSSH sshd gets an
// interactive shell on a pseudo-terminal of the same size, follows a resize, and passes the
// shell's exit status through.
func TestBoxAccessTerminalOnOpenSSH(t *testing.T) {
	g, e, _ := netnsEnv(t, fastWorkerConfig)
	t.Cleanup(func() { destroyAll(g) })

	interactiveShell(t, g, e.ID)
}

// interactiveShell runs env ssh on a pseudo-terminal (TERM xterm-256color, 100x30) and checks the
// box gives it a shell on a terminal of that size with that TERM, follows a resize to 120x40,
// passes the shell's exit status through and is audited as an interactive shell.
func interactiveShell(t *testing.T, g *gw, envID string) {
	t.Helper()
	master, slave := openPTY(t)
	defer master.Close()
	cmd := boxCmd(g, "env", "ssh", envID)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	var errb strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	done := make(chan int, 1)
	go func() { done <- exitCode(cmd.Wait()) }()

	screen := make(chan string, 1) // the latest output so far
	go func() {
		buf := make([]byte, 4096)
		var all strings.Builder
		for {
			n, err := master.Read(buf)
			all.Write(buf[:n])
			select {
			case <-screen: // superseded
			default:
			}
			screen <- all.String()
			if err != nil {
				close(screen)
				return
			}
		}
	}()
	cur := "" // the terminal's output so far
	until := func(want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for !strings.Contains(cur, want) {
			select {
			case s, ok := <-screen:
				if !ok {
					t.Fatalf("terminal closed before %q: %q (stderr %q)", want, cur, errb.String())
				}
				cur = s
			case <-timeout:
				t.Fatalf("no %q on the terminal within 30s: %q (stderr %q)", want, cur, errb.String())
			}
		}
	}
	type_ := func(s string) {
		t.Helper()
		if _, err := master.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	type_("echo T=$TERM; stty size | sed 's/ /x/'; tty | sed 's/^/on-/'\r")
	until("T=xterm-256color")
	until("30x100")
	until("on-/dev/pts/")
	// the new size reaches the box after the CLI's SIGWINCH, on its own path: ask until it shows
	setWinsize(t, master, 40, 120)
	for i := 0; ; i++ {
		type_(fmt.Sprintf("echo R$((%d+1000)) $(stty size | sed 's/ /y/')\r", i))
		until(fmt.Sprintf("R%d ", i+1000))
		if strings.Contains(cur, fmt.Sprintf("R%d 40y120", i+1000)) {
			break
		} else if i == 50 {
			t.Fatalf("the resize never reached the box: %q", cur)
		}
	}
	type_("exit 5\r")
	select {
	case code := <-done:
		if code != 5 {
			t.Errorf("exit status %d, want 5 (stderr %q)", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the shell did not end")
	}
	rows := must(g.client.Audit(testenv.Context(t, 10*time.Second), envID))(t)
	found := false
	for _, r := range rows {
		found = found || (r.Kind == "box.ssh" && r.Detail == "interactive shell (xterm-256color 100x30)")
	}
	if !found {
		t.Errorf("no audit row of the interactive shell: %+v", rows)
	}
}
