// Package atomicfile writes files so that a reader sees the old content or the new, never a part.
package atomicfile

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write writes data to path with the given mode: a temp file in path's directory is written,
// fsynced and renamed over path, then the directory is fsynced. On any error path keeps its old
// content and the temp file is removed. A failed directory fsync is not reported.
func Write(path string, data []byte, mode fs.FileMode) error {
	return write(path, mode, true, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write with the content streamed by fn; an error from fn leaves path as it was
// and is returned as is.
func WriteFunc(path string, mode fs.FileMode, fn func(io.Writer) error) error {
	return write(path, mode, true, fn)
}

// WriteUnsynced is Write without the fsyncs: still all or nothing for a reader, but a crash may
// lose the new content. For caches whose loss costs only recomputing them.
func WriteUnsynced(path string, data []byte, mode fs.FileMode) error {
	return write(path, mode, false, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func write(path string, mode fs.FileMode, durable bool, fn func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	err = f.Chmod(mode.Perm())
	if err == nil {
		err = fn(f)
	}
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if durable {
		syncDir(dir)
	}
	return nil
}

// syncDir fsyncs a directory so a rename in it survives a crash. Its error is not returned: the
// new content is in place by then, and some file systems refuse to fsync a directory.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
