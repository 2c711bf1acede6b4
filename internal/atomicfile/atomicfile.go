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

func write(path string, mode fs.FileMode, durable bool, fn func(io.Writer) error) error {
	st, err := stage(path, mode, durable, fn)
	if err != nil {
		return err
	}
	return st.Commit()
}

// Staged is new content written and synced beside its path, not yet in place: several files
// can be staged first and put in place one after the other only once all of them were written
// (a multi-file patch).
type Staged struct {
	path, tmp string
	durable   bool
}

// Stage writes data beside path as Write does, without renaming it over path yet.
func Stage(path string, data []byte, mode fs.FileMode) (*Staged, error) {
	return stage(path, mode, true, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Commit renames the staged content over its path and fsyncs the directory; on error the
// staged file is removed and path keeps what it had.
func (s *Staged) Commit() error {
	if err := os.Rename(s.tmp, s.path); err != nil {
		_ = os.Remove(s.tmp)
		return err
	}
	if s.durable {
		syncDir(filepath.Dir(s.path))
	}
	return nil
}

// Discard removes the staged content (after a Commit, it does nothing).
func (s *Staged) Discard() { _ = os.Remove(s.tmp) }

func stage(path string, mode fs.FileMode, durable bool, fn func(io.Writer) error) (_ *Staged, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, err
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
		return nil, err
	}
	return &Staged{path: path, tmp: tmp, durable: durable}, nil
}

// syncDir fsyncs a directory so a rename in it survives a crash. Its error is not returned: the
// new content is in place by then, and some file systems refuse to fsync a directory.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
