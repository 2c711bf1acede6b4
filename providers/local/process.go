package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

type waitStatus = syscall.WaitStatus

// terminalDrain is how long a terminal's output is still relayed after its shell exited while
// another process holds the terminal open.
const terminalDrain = 250 * time.Millisecond

// process is one command started by an exec request, in its own process group.
type process struct {
	cmd        *exec.Cmd
	outR, errR *os.File      // errR is nil on a terminal, where stderr goes to the terminal
	tty        *os.File      // the terminal's master end, or nil
	exited     chan struct{} // closed when the shell has exited
	finished   chan struct{} // closed when its exit was reported and the channel closed
}

// startProcess starts command under /bin/sh -c (an interactive /bin/sh for a shell request, when
// shell is true) with a clean environment, wired to ch: on a new pseudo-terminal when pty is set,
// else on pipes. The caller answers the request and then calls run.
func (c *conn) startProcess(ch ssh.Channel, command string, shell bool, env map[string]string, pty *ptyRequest) (*process, error) {
	cmd := exec.Command("/bin/sh", "-c", command)
	if shell {
		cmd = exec.Command("/bin/sh")
	}
	cmd.Dir = c.cfg.Dir
	if pty != nil {
		withTerm := map[string]string{"TERM": pty.Term}
		for k, v := range env {
			withTerm[k] = v
		}
		cmd.Env = c.execEnv(withTerm)
		return c.startOnTerminal(ch, cmd, *pty)
	}
	cmd.Env = c.execEnv(env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return nil, err
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, fmt.Errorf("start %q: %w", cmd.Args, err)
	}
	// The child holds its ends now.
	_ = inR.Close()
	_ = outW.Close()
	_ = errW.Close()

	p := &process{cmd: cmd, outR: outR, errR: errR, exited: make(chan struct{}), finished: make(chan struct{})}
	c.wg.Go(func() {
		_, _ = io.Copy(inW, ch)
		_ = inW.Close()
	})
	return p, nil
}

// startOnTerminal starts cmd as the leader of a new session whose controlling terminal is a new
// pseudo-terminal, wired to ch.
func (c *conn) startOnTerminal(ch ssh.Channel, cmd *exec.Cmd, pty ptyRequest) (*process, error) {
	master, slave, err := openPTY(pty.Columns, pty.Rows)
	if err != nil {
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// The session leader's process group is its pid, so signals to -pid reach it as with Setpgid.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = cmd.Start()
	_ = slave.Close() // the child holds it now
	if err != nil {
		_ = master.Close()
		return nil, fmt.Errorf("start %q: %w", cmd.Args, err)
	}
	p := &process{cmd: cmd, outR: master, tty: master, exited: make(chan struct{}), finished: make(chan struct{})}
	c.wg.Go(func() {
		// Ends when the client closes its side or the terminal is closed.
		_, _ = io.Copy(master, ch)
	})
	return p, nil
}

// resize applies a window-change to the command's terminal.
func (p *process) resize(cols, rows uint32) error {
	if p.tty == nil {
		return errNoTerminal
	}
	if err := validTerminalSize(cols, rows); err != nil {
		return err
	}
	return setWinsize(p.tty, cols, rows)
}

// run waits for the command and its output, reports its exit and closes the channel.
// Like OpenSSH, the channel stays open while anything still holds the command's stdout or stderr.
func (p *process) run(ch ssh.Channel) {
	defer close(p.finished)
	var copies sync.WaitGroup
	copies.Go(func() { copyAndClose(ch, p.outR) })
	if p.errR != nil {
		copies.Go(func() { copyAndClose(ch.Stderr(), p.errR) })
	}
	_ = p.cmd.Wait()
	close(p.exited)
	if p.tty != nil {
		// Like sshd, a terminal session ends with its shell: what it wrote is drained (the read ends
		// at once when nothing else holds the terminal), a background process still holding the
		// terminal does not keep the session open.
		_ = p.tty.SetReadDeadline(time.Now().Add(terminalDrain))
	}
	copies.Wait()
	sendExit(ch, p.cmd.ProcessState)
	_ = ch.Close()
}

// abandon is called when the client closed the channel: a command still running is killed with
// its process group, and output nobody will read is dropped.
func (p *process) abandon() {
	select {
	case <-p.exited:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = p.outR.Close()
	if p.errR != nil {
		_ = p.errR.Close()
	}
}

func (p *process) wait() { <-p.finished }

// signal delivers an RFC 4254 "signal" request to the command's process group.
func (p *process) signal(name string) error {
	sig, ok := signalsByName[name]
	if !ok {
		return fmt.Errorf("unknown signal %q", name)
	}
	select {
	case <-p.exited:
		return errors.New("process has exited")
	default:
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

var signalsByName = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

// signalName is the RFC 4254 name of sig (without "SIG").
func signalName(sig syscall.Signal) string {
	for name, s := range signalsByName {
		if s == sig {
			return name
		}
	}
	return fmt.Sprintf("SIG%d@openclaw", int(sig))
}

func sendExit(ch ssh.Channel, state *os.ProcessState) {
	if ws, ok := state.Sys().(waitStatus); ok && ws.Signaled() {
		_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(exitSignalMsg{
			Signal:     signalName(ws.Signal()),
			CoreDumped: ws.CoreDump(),
		}))
		return
	}
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(exitStatusMsg{Status: uint32(state.ExitCode())}))
}

// copyAndClose copies src to dst and closes src so that a writer on the other end gets EPIPE.
func copyAndClose(dst io.Writer, src io.ReadCloser) {
	_, _ = io.Copy(dst, src)
	_ = src.Close()
}

// serveSFTP runs the SFTP subsystem on ch, rooted (for relative paths) at the box directory.
func (c *conn) serveSFTP(ch ssh.Channel) {
	srv, err := sftp.NewServer(ch, sftp.WithServerWorkingDirectory(c.cfg.Dir))
	if err != nil {
		_ = ch.Close()
		return
	}
	status := uint32(0)
	if err := srv.Serve(); err != nil {
		status = 1
	}
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(exitStatusMsg{Status: status}))
	_ = srv.Close()
}
