package manifest

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// OpenFile opens file for reading, failing if it is a symlink. On Linux it reads with plain
// system calls: os.File would register each of the thousands of files a sync hashes or sends
// with the runtime's poller (which refuses regular files) and switch it between blocking modes,
// five system calls per file that change nothing. O_NONBLOCK (no effect on regular files) keeps
// a FIFO put in a file's place from blocking the open until something writes to it.
func OpenFile(file string) (File, error) {
	for {
		fd, err := syscall.Open(file, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: file, Err: err}
		}
		return &rawFile{fd: fd, name: file}, nil
	}
}

// rawFile is an open file descriptor without the runtime's poller.
type rawFile struct {
	fd       int
	name     string
	blocking bool // made blocking after a read that would have blocked
}

func (s *rawFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := syscall.Read(s.fd, p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN && !s.blocking:
			// O_NONBLOCK: a FIFO with nothing to read, or a regular file on a filesystem that
			// honours the flag. A regular file is read blocking from then on (once: a second
			// EAGAIN is an error); anything else is not what was listed.
			var st syscall.Stat_t
			if syscall.Fstat(s.fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
				if err := syscall.SetNonblock(s.fd, false); err == nil {
					s.blocking = true
					continue
				}
			}
			return 0, &os.PathError{Op: "read", Path: s.name, Err: errors.New("not a regular file")}
		case err != nil:
			return 0, &os.PathError{Op: "read", Path: s.name, Err: err}
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (s *rawFile) Stat() (fs.FileInfo, error) {
	fi := &statInfo{name: filepath.Base(s.name)}
	for {
		err := syscall.Fstat(s.fd, &fi.st)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "stat", Path: s.name, Err: err}
		}
		return fi, nil
	}
}

func (s *rawFile) Close() error { return syscall.Close(s.fd) }

// statInfo is an fs.FileInfo of a Stat_t.
type statInfo struct {
	name string
	st   syscall.Stat_t
}

func (i *statInfo) Name() string       { return i.name }
func (i *statInfo) Size() int64        { return i.st.Size }
func (i *statInfo) ModTime() time.Time { return time.Unix(i.st.Mtim.Sec, i.st.Mtim.Nsec) }
func (i *statInfo) IsDir() bool        { return i.Mode().IsDir() }
func (i *statInfo) Sys() any           { return &i.st }

func (i *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.st.Mode & 0o777)
	if i.st.Mode&syscall.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if i.st.Mode&syscall.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if i.st.Mode&syscall.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	switch i.st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		m |= fs.ModeDir
	case syscall.S_IFLNK:
		m |= fs.ModeSymlink
	default:
		m |= fs.ModeIrregular
	}
	return m
}
