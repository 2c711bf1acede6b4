package manifest

import (
	"io/fs"
	"syscall"
)

// statKey returns the inode and ctime (Unix nanoseconds) of fi, part of the hash cache key.
func statKey(fi fs.FileInfo) (ino uint64, ctime int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano()
	}
	return 0, 0
}
