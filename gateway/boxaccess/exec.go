package boxaccess

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/labstack/echo/v4"
	"golang.org/x/crypto/ssh"
	"golang.org/x/time/rate"

	"github.com/openclaw/cloudworkers/gateway/envs"
)

// writeTimeout bounds one write to the operator's socket: a client that stops reading ends its
// session instead of holding the box's output.
const writeTimeout = 30 * time.Second

// maxInputFrame bounds one message from the operator (stdin is sent in frames of 32 KiB).
const maxInputFrame = 64<<10 + 1

// stdinQueue is how many stdin messages wait for the box to take them (at most 2 MiB), while the
// socket is still read for controls and for the operator leaving.
const stdinQueue = 32

// startTimeout bounds how long the client may take to send its Start.
const startTimeout = 10 * time.Second

// serveExec runs one command or shell on an environment's box for a WebSocket client.
func (s *Service) serveExec(c echo.Context) error {
	r := c.Request()
	e, err := s.d.Envs.Get(r.Context(), c.Param("id"))
	if err != nil {
		return err
	}
	if err := usable(e); err != nil {
		return err
	}
	release, err := s.acquire(e.ID)
	if err != nil {
		return err
	}
	defer release()
	ws, err := websocket.Accept(c.Response(), r, nil)
	if err != nil {
		return nil // Accept has written the HTTP error
	}
	defer ws.CloseNow()
	ws.SetReadLimit(maxInputFrame)

	ctx, cancel := s.sessionContext(r.Context(), e.ID)
	defer cancel()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The socket has a life of its own (coder/websocket closes a connection whose read or write
	// context ends): the exit is written on it after the session ended.
	wsCtx, wsCancel := context.WithCancel(context.Background())
	defer wsCancel()
	x := &execution{s: s, ws: ws, ctx: ctx, stop: stop, wsCtx: wsCtx, limit: s.limiter()}
	exit := x.run(e)
	// what the box said (a refusal's message, a signal's name) reaches the operator's terminal:
	// printable and bounded
	exit.Error, exit.Signal = envs.Sanitize(exit.Error), envs.Sanitize(exit.Signal)
	wctx, wcancel := context.WithTimeout(context.Background(), writeTimeout)
	defer wcancel()
	if wsjson.Write(wctx, ws, Control{Type: ControlExit, Exit: &exit}) == nil {
		_ = ws.Close(websocket.StatusNormalClosure, "")
	}
	return nil
}

// execution is one command on a box, relayed to one WebSocket.
type execution struct {
	s     *Service
	ws    *websocket.Conn
	ctx   context.Context // the session's life on the box
	stop  context.CancelCauseFunc
	wsCtx context.Context // the socket's
	limit *rate.Limiter
	wmu   sync.Mutex // one writer on ws at a time
}

// run starts the command and relays until it ends; it returns how it ended.
func (x *execution) run(e envs.Environment) Exit {
	sctx, scancel := context.WithTimeout(x.wsCtx, startTimeout)
	var st Start
	err := wsjson.Read(sctx, x.ws, &st)
	scancel()
	if err != nil {
		return Exit{Code: -1, Error: fmt.Sprintf("no start message: %v", err)}
	}
	if err := st.Validate(); err != nil {
		return Exit{Code: -1, Error: "bad start message: " + err.Error()}
	}
	kind, detail := "box.exec", shellCommand(st.Command)
	if len(st.Command) == 0 {
		kind, detail = "box.ssh", "shell without a terminal"
		if st.TTY {
			detail = fmt.Sprintf("interactive shell (%s %dx%d)", st.Term, st.Cols, st.Rows)
		}
	}
	if len(detail) > 2000 {
		detail = detail[:2000] + "…"
	}
	x.s.d.Audit(x.ctx, kind, e.ID, detail)
	x.s.d.Log.Info("box access", "kind", kind, "env", e.ID)

	client, err := x.s.dial(x.ctx, e)
	if err != nil {
		return Exit{Code: -1, Error: err.Error()}
	}
	defer client.Close()
	inTime := x.s.startDeadline(client)
	sess, stdin, stdout, stderr, err := x.start(client, st)
	if !inTime() {
		if err == nil {
			sess.Close()
		}
		err = x.s.errStartTimeout("start the command")
	}
	if err != nil {
		if cause := context.Cause(x.ctx); cause != nil {
			return Exit{Code: -1, Error: cause.Error()}
		}
		return Exit{Code: -1, Error: err.Error()}
	}
	defer sess.Close()

	var pumps sync.WaitGroup
	pumps.Go(func() { x.pump(StreamStdout, stdout) })
	pumps.Go(func() { x.pump(StreamStderr, stderr) })
	go x.input(client, sess, stdin) // ends when the socket or the session closes (both closed on return)
	pumps.Wait()
	err = waitSession(x.ctx, sess)
	var ee *ssh.ExitError
	var missing *ssh.ExitMissingError
	switch cause := context.Cause(x.ctx); {
	case cause != nil && !errors.Is(cause, context.Canceled):
		return Exit{Code: -1, Error: cause.Error()} // the environment ended, or the gateway stops
	case err == nil:
		return Exit{}
	case errors.As(err, &ee) && ee.Signal() != "":
		return Exit{Code: -1, Signal: ee.Signal()}
	case errors.As(err, &ee):
		return Exit{Code: ee.ExitStatus()}
	case cause != nil:
		return Exit{Code: -1, Error: cause.Error()}
	case errors.As(err, &missing):
		return Exit{Code: -1, Error: "the box ended the command without an exit status"}
	default:
		return Exit{Code: -1, Error: fmt.Sprintf("the connection to the box was lost: %v", err)}
	}
}

// waitSession waits for the command's exit status; the box's connection closes when ctx ends.
func waitSession(ctx context.Context, sess *ssh.Session) error {
	err := sess.Wait()
	if ctx.Err() != nil && err != nil {
		var ee *ssh.ExitError
		if !errors.As(err, &ee) {
			return context.Cause(ctx)
		}
	}
	return err
}

// start opens the session on the box and starts the command or shell.
func (x *execution) start(client *ssh.Client, st Start) (*ssh.Session, io.WriteCloser, io.Reader, io.Reader, error) {
	sess, err := client.NewSession()
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("open a session on the box: %w", err)
	}
	fail := func(err error) (*ssh.Session, io.WriteCloser, io.Reader, io.Reader, error) {
		sess.Close()
		return nil, nil, nil, nil, err
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		return fail(err)
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	stderr, err := sess.StderrPipe()
	if err != nil {
		return fail(err)
	}
	switch {
	case st.TTY:
		if err := sess.RequestPty(st.Term, st.Rows, st.Cols, ssh.TerminalModes{ssh.ECHO: 1}); err != nil {
			return fail(fmt.Errorf("the box refused a terminal (pty-req): %v; without a terminal, openclaw env ssh runs the shell on stdin", err))
		}
		if len(st.Command) > 0 {
			err = sess.Start(shellCommand(st.Command))
		} else {
			err = sess.Shell()
		}
	case len(st.Command) == 0:
		err = sess.Start(nonInteractiveShell)
	default:
		err = sess.Start(shellCommand(st.Command))
	}
	if err != nil {
		return fail(fmt.Errorf("the box refused the command: %w", err))
	}
	return sess, stdin, stdout, stderr, nil
}

// pump relays one output stream of the box in frames of at most maxFrameBytes, paced to
// outputBytesPerSecond. A write that fails ends the session (the client is gone or too slow).
func (x *execution) pump(stream byte, r io.Reader) {
	buf := make([]byte, x.s.cfg.MaxFrameBytes)
	buf[0] = stream
	for {
		n, err := r.Read(buf[1:])
		if n > 0 {
			if x.limit.WaitN(x.ctx, n) != nil {
				_, _ = io.Copy(io.Discard, r) // the session ended: drop what is left until it closes
				return
			}
			if x.write(websocket.MessageBinary, buf[:1+n]) != nil {
				_ = x.ws.CloseNow() // the client is gone or too slow
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (x *execution) write(typ websocket.MessageType, b []byte) error {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	ctx, cancel := context.WithTimeout(x.wsCtx, writeTimeout)
	defer cancel()
	return x.ws.Write(ctx, typ, b)
}

// input relays the client's stdin and controls to the session until the socket closes. Stdin is
// written by a goroutine of its own, through a queue of stdinQueue messages: a box that does not
// read its stdin blocks that writer, not the socket, and once the queue has been full for
// Config.StdinStall the session ends.
func (x *execution) input(client *ssh.Client, sess *ssh.Session, stdin io.WriteCloser) {
	in := make(chan []byte, stdinQueue) // nil: EOF
	defer close(in)
	go func() {
		open := true
		for b := range in {
			switch {
			case !open:
			case b == nil:
				_ = stdin.Close()
				open = false
			default:
				if _, err := stdin.Write(b); err != nil {
					open = false // the command closed its stdin; controls still go on
				}
			}
		}
		_ = stdin.Close()
	}()
	queue := func(b []byte) bool {
		select {
		case in <- b:
			return true
		default:
		}
		stall := x.s.cfg.StdinStall.D()
		t := time.NewTimer(stall)
		defer t.Stop()
		select {
		case in <- b:
			return true
		case <-t.C:
			x.stop(fmt.Errorf("the box did not read the command's input for %s (boxAccess.stdinStall): the session was closed", stall))
		case <-x.ctx.Done():
		}
		_ = client.Close()
		return false
	}
	for {
		typ, b, err := x.ws.Read(x.wsCtx)
		if err != nil {
			// the client is gone: so is its command, and the session's connection (a box that
			// never answers the session's close cannot hold it)
			_ = client.Close()
			return
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 || b[0] != StreamStdin {
				continue
			}
			if len(b) > 1 && !queue(b[1:]) {
				return
			}
			continue
		}
		var m Control
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case ControlEOF:
			if !queue(nil) {
				return
			}
		case ControlResize:
			if validWindow(m.Rows, m.Cols) == nil {
				_ = sess.WindowChange(m.Rows, m.Cols)
			}
		case ControlSignal:
			if signals[m.Signal] {
				_ = sess.Signal(ssh.Signal(m.Signal))
			}
		}
	}
}
