//go:build !linux

package manifest

import (
	"os"
	"syscall"
)

// OpenFile opens file for reading, failing if it is a symlink (O_NONBLOCK: a FIFO in a file's
// place does not block the open).
func OpenFile(file string) (File, error) {
	return os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
}
