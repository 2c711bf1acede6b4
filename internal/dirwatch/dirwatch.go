// Package dirwatch tells a process that its directory is gone: a local box whose directory was
// removed, a worker whose state directory went with its environment. Both then stop instead of
// serving (or reconnecting) forever.
package dirwatch

import (
	"context"
	"errors"
	"os"
	"time"
)

// Gone checks every interval whether dir still exists. It returns true once dir does not
// exist, false when ctx ends first.
func Gone(ctx context.Context, dir string, every time.Duration) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				return true
			}
		}
	}
}
