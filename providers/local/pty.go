package local

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Bounds on what a pty-req or window-change may ask for; anything outside is refused.
const (
	maxTermNameLen  = 64
	maxTerminalSize = 10000 // columns and rows each
)

type ptyRequest struct {
	Term          string
	Columns, Rows uint32
	Width, Height uint32
	Modes         string
}

type windowChange struct {
	Columns, Rows uint32
	Width, Height uint32
}

// validTermName reports whether term is a plausible terminal type: 1 to 64 of [A-Za-z0-9._+-].
func validTermName(term string) error {
	if term == "" || len(term) > maxTermNameLen {
		return fmt.Errorf("terminal type must be 1 to %d characters, got %d", maxTermNameLen, len(term))
	}
	for _, r := range term {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '+' || r == '-'
		if !ok {
			return fmt.Errorf("terminal type %q has a character other than letters, digits and ._+-", term)
		}
	}
	return nil
}

func validTerminalSize(cols, rows uint32) error {
	if cols < 1 || cols > maxTerminalSize || rows < 1 || rows > maxTerminalSize {
		return fmt.Errorf("terminal size %dx%d outside 1..%d", cols, rows, maxTerminalSize)
	}
	return nil
}

func (m ptyRequest) validate() error {
	if err := validTermName(m.Term); err != nil {
		return err
	}
	return validTerminalSize(m.Columns, m.Rows)
}

// openPTY allocates a pseudo-terminal of the given size and returns its master and slave ends.
func openPTY(cols, rows uint32) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n uint32
	ctlErr := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		v, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		if err != nil {
			return fmt.Errorf("pty number: %w", err)
		}
		n = v
		return nil
	})
	if ctlErr != nil {
		_ = master.Close()
		return nil, nil, ctlErr
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		_ = master.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", err)
	}
	if err := setWinsize(master, cols, rows); err != nil {
		_ = master.Close()
		_ = slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// setWinsize sets the size of the terminal whose master is f; the kernel signals SIGWINCH.
func setWinsize(f *os.File, cols, rows uint32) error {
	return control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	})
}

// control runs fn on f's descriptor without taking it out of the runtime poller (f.Fd would).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

var errNoTerminal = errors.New("session has no terminal")
