package boxaccess

import (
	"errors"
	"fmt"
	"strings"

	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// The exec WebSocket (GET /api/v1/environments/:id/exec) carries one command or shell:
//
//   - the client's first message is a text message, a JSON Start;
//   - then binary messages are data, their first byte the stream (StreamStdin from the client,
//     StreamStdout and StreamStderr from the gateway), at most maxFrameBytes each;
//   - text messages are JSON Controls: resize, eof and signal from the client; the gateway's last
//     message is an exit, after which it closes the socket.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// Control types.
const (
	ControlResize = "resize"
	ControlEOF    = "eof"
	ControlSignal = "signal"
	ControlExit   = "exit"
)

// Limits of a Start.
const (
	MaxArgs         = 1024
	MaxCommandBytes = 64 << 10
	MaxWindow       = 10000
)

// Start is the first message of an exec WebSocket.
type Start struct {
	// Command is the argv to run on the box (each argument passed as it is, quoted for the box's
	// shell); empty runs the login shell.
	Command []string `json:"command,omitempty"`
	// TTY asks the box for a pseudo-terminal of Term, Rows and Cols.
	TTY  bool   `json:"tty,omitempty"`
	Term string `json:"term,omitempty"`
	Rows int    `json:"rows,omitempty"`
	Cols int    `json:"cols,omitempty"`
}

// Control is a text message after the Start.
type Control struct {
	Type string `json:"type"`
	// Rows and Cols of a resize.
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Signal of a signal (an RFC 4254 name without SIG: INT, TERM, HUP, KILL, QUIT).
	Signal string `json:"signal,omitempty"`
	// Exit is the end of the command (on an exit).
	Exit *Exit `json:"exit,omitempty"`
}

// Exit is how a command ended: an exit code, a signal, or an error when the box gave neither
// (it refused the command, the connection was lost, the environment was destroyed).
type Exit struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	Error  string `json:"error,omitempty"`
}

// signals are the signals an operator may send to a command.
var signals = map[string]bool{"INT": true, "TERM": true, "HUP": true, "KILL": true, "QUIT": true, "USR1": true, "USR2": true}

// Validate names what is wrong with a Start.
func (s Start) Validate() error {
	if len(s.Command) > MaxArgs {
		return fmt.Errorf("command: at most %d arguments, got %d", MaxArgs, len(s.Command))
	}
	n := 0
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("command[%d]: contains a NUL byte", i)
		}
		n += len(a) + 1
	}
	if n > MaxCommandBytes {
		return fmt.Errorf("command: at most %d bytes, got %d", MaxCommandBytes, n)
	}
	if len(s.Command) > 0 && s.Command[0] == "" {
		return errors.New("command[0]: is empty")
	}
	if !s.TTY {
		if s.Term != "" || s.Rows != 0 || s.Cols != 0 {
			return errors.New("term, rows and cols: only with tty")
		}
		return nil
	}
	if !ValidTerm(s.Term) {
		return fmt.Errorf("term: must be 1 to 64 letters, digits or -_.+, got %q", s.Term)
	}
	return validWindow(s.Rows, s.Cols)
}

func validWindow(rows, cols int) error {
	if rows < 1 || rows > MaxWindow || cols < 1 || cols > MaxWindow {
		return fmt.Errorf("rows and cols: must be from 1 to %d, got %dx%d", MaxWindow, cols, rows)
	}
	return nil
}

// shellCommand is the command line an exec request carries for argv: the box's shell execs it,
// so that its exit status or signal is the command's own.
func shellCommand(argv []string) string {
	return "exec " + untrusted.QuoteAll(argv)
}

// nonInteractiveShell is the command of a shell without a terminal: the user's shell reading
// commands from stdin.
const nonInteractiveShell = `exec "${SHELL:-/bin/sh}"`
