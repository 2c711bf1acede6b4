package remote

import (
	"os"
	"sync"
)

// LogFile is a size-bounded log file: when it would grow past Max bytes it is renamed to
// "<path>.1" (replacing an older one) and started afresh, so a box never fills up with logs.
type LogFile struct {
	Path string
	Max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

// OpenLogFile opens (appending to) a bounded log file with mode 0600.
func OpenLogFile(path string, max int64) (*LogFile, error) {
	l := &LogFile{Path: path, Max: max}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *LogFile) open() error {
	f, err := os.OpenFile(l.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write appends p, rotating first when the file would exceed Max.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	if l.Max > 0 && l.size+int64(len(p)) > l.Max {
		l.f.Close()
		_ = os.Rename(l.Path, l.Path+".1")
		if err := l.open(); err != nil {
			l.f = nil
			return 0, err
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// Close closes the file.
func (l *LogFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
