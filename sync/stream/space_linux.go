package stream

import (
	"os"
	"syscall"
)

// statfs reports the filesystem holding dir: its device, and its free (f_bavail) and total
// bytes.
func statfs(dir string) (FSSpace, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return FSSpace{}, err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return FSSpace{}, err
	}
	var id uint64
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		id = s.Dev
	}
	bs := uint64(st.Bsize)
	if st.Frsize > 0 {
		bs = uint64(st.Frsize)
	}
	return FSSpace{ID: id, Free: st.Bavail * bs, Total: st.Blocks * bs}, nil
}
