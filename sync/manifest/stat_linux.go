package manifest

import (
	"io/fs"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// StatKey returns the inode and ctime (Unix nanoseconds) of fi: part of the hash cache key, and
// what tells a file that changed in place.
func StatKey(fi fs.FileInfo) (ino uint64, ctime int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano()
	}
	return 0, 0
}

// IDOf returns fi's device and inode (zero where the platform does not say).
func IDOf(fi fs.FileInfo) FileID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return FileID{Dev: uint64(st.Dev), Ino: st.Ino}
	}
	return FileID{}
}

// lstatAt is os.Lstat of the entry name of the directory open as dir, without walking the
// directory's path again for every entry: fstatat(2) relative to the directory's descriptor. The
// listing of a tree called lstat with full paths, and resolving every component of every path was
// half of its CPU (25 ms of 40 ms for the Go tree's 12.8k entries).
func lstatAt(dir *os.File, name string) (fs.FileInfo, error) {
	fi := &statInfo{name: name}
	for {
		// syscall.Stat_t and unix.Stat_t are the same kernel structure; statInfo keeps the
		// syscall one, which StatKey reads.
		err := unix.Fstatat(int(dir.Fd()), name, (*unix.Stat_t)(unsafe.Pointer(&fi.st)), unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "lstat", Path: dir.Name() + "/" + name, Err: err}
		}
		return fi, nil
	}
}
