package manifest

import (
	"io/fs"
	"syscall"
)

// StatKey returns the inode and ctime (Unix nanoseconds) of fi: part of the hash cache key, and
// what tells a file that changed in place.
func StatKey(fi fs.FileInfo) (ino uint64, ctime int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano()
	}
	return 0, 0
}
