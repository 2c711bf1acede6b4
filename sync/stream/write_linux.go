package stream

import (
	"bufio"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirHandle holds one staged directory open (O_PATH), for creating the files in it relative to
// its descriptor: a file created by its full path walked every component of that path again,
// ≈ 8% of the box's time in openat(2) on a cold sync of the Go tree.
type dirHandle struct {
	dir string // the staged directory's plan path; "" when none is open
	fd  int
}

func (d *dirHandle) close() {
	if d.dir != "" {
		syscall.Close(d.fd)
		d.dir = ""
	}
}

// writeSmallIn is writeSmall of the file name in the staged directory dir (a plan path), which
// d holds open, or opens instead of the one it held.
func writeSmallIn(d *dirHandle, s *stager, dir, name string, data []byte, mode uint32, mtime int64, fsync, stat bool) (fileStat, error) {
	full := func() string { return s.full(path.Join(dir, name)) }
	if d.dir != dir {
		d.close()
		fd, err := unix.Open(s.full(dir), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fileStat{}, &os.PathError{Op: "open", Path: s.full(dir), Err: err}
		}
		d.dir, d.fd = dir, fd
	}
	return writeSmallAt(d.fd, name, full, data, mode, mtime, fsync, stat)
}

// writeSmallAt creates the file name (which must not exist) in the directory open as dirfd,
// with content data, mode and mtime (ns), in as few system calls as the kernel allows: open with
// the final mode (a chmod only when the umask would strip bits of it), write, futimens, fsync when
// asked, close. Staging creates thousands of small files; os.File would add poller registration
// and fcntl calls to each. full names the file in errors.
//
// With stat set, the file's stat (taken last, so that its ctime is final) is returned for a hash
// cache.
func writeSmallAt(dirfd int, name string, full func() string, data []byte, mode uint32, mtime int64, fsync, stat bool) (fileStat, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fileStat{}, &os.PathError{Op: "create", Path: full(), Err: err}
	}
	err = writeFD(fd, data, mode, mtime, fsync)
	var fs fileStat
	if err == nil && stat {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			fs = fileStat{ok: true, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino}
		}
	}
	if cerr := syscall.Close(fd); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fileStat{}, &os.PathError{Op: "write", Path: full(), Err: err}
	}
	return fs, nil
}

func writeFD(fd int, data []byte, mode uint32, mtime int64, fsync bool) error {
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	if mode&processUmask() != 0 {
		if err := syscall.Fchmod(fd, mode); err != nil {
			return err
		}
	}
	ts := [2]syscall.Timespec{syscall.NsecToTimespec(mtime), syscall.NsecToTimespec(mtime)}
	// utimensat(fd, NULL, times, 0) is futimens(2).
	if _, _, e := syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
		return e
	}
	if fsync {
		return syscall.Fsync(fd)
	}
	return nil
}

// processUmask is the process's umask, read from /proc/self/status (setting it to read it would
// race with other goroutines creating files); all bits when it cannot be read, so that every
// file is chmodded.
var processUmask = sync.OnceValue(func() uint32 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0o777
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(m)
			}
		}
	}
	return 0o777
})

// growPipe raises the capacity of f's pipe (sshd's pipe of a channel, when f is one) to 1 MiB,
// the most an unprivileged process may ask for by default (/proc/sys/fs/pipe-max-size). With the
// default 64 KiB, sshd and the unpack took turns every 64 KiB: sshd blocked on the full pipe, held
// up to a channel window (2 MiB) of decrypted data in its buffers and polled again, both sides
// woke tens of thousands of times per sync. A cold sync of GOROOT/src (121 MB) to a netns sshd box
// went from 0.63–0.68 s to 0.58–0.61 s (medians of 7 runs, alternated), 1.15 s to 1.07 s of CPU.
// Anything else (a terminal, a file, a socket) is left alone: the call fails and is ignored.
func growPipe(r any) {
	const pipeSize = 1 << 20
	f, ok := r.(*os.File)
	if !ok {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		// Only ever grown: a pipe already larger keeps its size. Each grown pipe counts 256 pages
		// against the user's pipe-user-pages-soft (64 MiB by default), a sync's for as long as
		// it runs: past that limit the kernel gives the user's new pipes their minimum size.
		if n, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && n < pipeSize {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize)
		}
	})
}

// stagedDirMode is the mode of a directory the stager created: stagedDirPerm less the umask
// (unknown when the umask could not be read: processUmask then answers all bits).
func stagedDirMode() (uint32, bool) {
	u := processUmask()
	return stagedDirPerm &^ u, u != 0o777
}
