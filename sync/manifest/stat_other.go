//go:build !linux

package manifest

import (
	"io/fs"
	"os"
	"path/filepath"
)

// StatKey returns 0s where the inode and ctime are not read: the cache then keys on size and
// mtime only.
func StatKey(fs.FileInfo) (ino uint64, ctime int64) { return 0, 0 }

// IDOf returns the zero FileID where the inode is not read.
func IDOf(fs.FileInfo) FileID { return FileID{} }

// lstatAt is os.Lstat of the entry name of the directory open as dir.
func lstatAt(dir *os.File, name string) (fs.FileInfo, error) {
	return os.Lstat(filepath.Join(dir.Name(), name))
}
