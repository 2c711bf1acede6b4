//go:build !linux

package stream

import (
	"os"
	"time"
)

// writeSmall creates file (which must not exist) with content data, mode and mtime (ns).
func writeSmall(file string, data []byte, mode uint32, mtime int64, fsync bool) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
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
	return err
}
