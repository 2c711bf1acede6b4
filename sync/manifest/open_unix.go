package manifest

import (
	"os"
	"syscall"
)

// openNoFollow opens file for reading, failing if it is a symlink.
func openNoFollow(file string) (*os.File, error) {
	return os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}
