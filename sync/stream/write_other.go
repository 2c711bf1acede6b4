//go:build !linux

package stream

import (
	"os"
	"path"
	"time"
)

// writeSmall creates file (which must not exist) with content data, mode and mtime (ns).
// No stat is returned here (the hash cache then stats the file after the commit).
func writeSmall(file string, data []byte, mode uint32, mtime int64, fsync, _ bool) (fileStat, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fileStat{}, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(os.FileMode(mode))
	}
	if err == nil && fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		mt := time.Unix(0, mtime)
		err = os.Chtimes(file, mt, mt)
	}
	return fileStat{}, err
}

// growPipe is Linux's way of giving sshd's pipes more room: nothing here.
func growPipe(any) {}

// stagedDirMode: the umask is not read here, so every directory's mode is set.
func stagedDirMode() (uint32, bool) { return 0, false }

// dirHandle: no directory is held open here; files are created by their full path.
type dirHandle struct{}

func (d *dirHandle) close() {}

// writeSmallIn writes the file name in the staged directory dir (a plan path), by its full path.
func writeSmallIn(_ *dirHandle, s *stager, dir, name string, data []byte, mode uint32, mtime int64, fsync, stat bool) (fileStat, error) {
	return writeSmall(s.full(path.Join(dir, name)), data, mode, mtime, fsync, stat)
}
