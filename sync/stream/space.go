package stream

import (
	"errors"
	"fmt"
	"math"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// SpaceCheck keeps free space on the filesystems an inbound archive fills: that of the
// directory it is staged in (the anchor, or its parent for a new one) and those of Keep (the
// gateway's data directory, whose gateway.db must stay writable whatever a box sends).
type SpaceCheck struct {
	// Keep lists more directories whose filesystems must keep the reserve free.
	Keep []string
	// ReserveBytes and ReservePercent: the reserve kept free on each filesystem is the larger of
	// ReserveBytes (default 1 GiB) and ReservePercent of its size (default 5).
	ReserveBytes   int64
	ReservePercent float64
	// Statfs reports the filesystem holding a directory; statfs (statfs(2)) when nil. Tests fake it.
	Statfs func(dir string) (FSSpace, error)
}

// Defaults of SpaceCheck.
const (
	DefaultReserveBytes   = 1 << 30
	DefaultReservePercent = 5
)

// FSSpace is what a filesystem has: an id that tells filesystems apart (its device), and its
// free bytes (those an unprivileged user may take) and size.
type FSSpace struct {
	ID          uint64
	Free, Total uint64
}

// ErrNoSpace is what a *SpaceError is.
var ErrNoSpace = errors.New("not enough free space")

// SpaceError refuses an archive that would leave a filesystem with less than its reserve free;
// nothing was written.
type SpaceError struct {
	Dir                 string // a directory on the filesystem
	Need, Have, Reserve uint64
}

func (e *SpaceError) Error() string {
	return fmt.Sprintf("not enough free space on the filesystem of %s: need %s, have %s, keeping at least %s free",
		e.Dir, sizeString(e.Need), sizeString(e.Have), sizeString(e.Reserve))
}

// Is makes errors.Is(err, ErrNoSpace) hold.
func (e *SpaceError) Is(target error) bool { return target == ErrNoSpace }

// Validate names the first bad field.
func (c *SpaceCheck) Validate() error {
	switch {
	case c.ReserveBytes < 0:
		return fmt.Errorf("reserveFreeBytes: must not be negative, got %d", c.ReserveBytes)
	case !(c.ReservePercent >= 0 && c.ReservePercent < 100): // NaN too
		return fmt.Errorf("reserveFreePercent: must be from 0 to under 100, got %v", c.ReservePercent)
	}
	return nil
}

// reserve is what c keeps free on a filesystem of total bytes.
func (c *SpaceCheck) reserve(total uint64) uint64 {
	b, pct := c.ReserveBytes, c.ReservePercent
	if b == 0 {
		b = DefaultReserveBytes
	}
	if pct == 0 {
		pct = DefaultReservePercent
	}
	return max(uint64(b), uint64(math.Ceil(float64(total)*pct/100)))
}

// Check refuses (*SpaceError) when writing need bytes into dir would leave its filesystem, or
// that of any of c.Keep, with less than its reserve free.
func (c *SpaceCheck) Check(dir string, need uint64) error { return c.check(dir, need) }

// check refuses when writing need bytes into dir would leave its filesystem, or that of any of
// c.Keep, with less than its reserve free. need is counted once per filesystem (Keep's may be
// the same one).
func (c *SpaceCheck) check(dir string, need uint64) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("space check: %w", err)
	}
	stat := c.Statfs
	if stat == nil {
		stat = statfs
	}
	seen := map[uint64]bool{}
	for i, d := range append([]string{dir}, c.Keep...) {
		fs, err := stat(d)
		if errors.Is(err, errNoStatfs) {
			return nil // this platform does not tell
		}
		if err != nil {
			return fmt.Errorf("free space of %s: %w", d, err)
		}
		if seen[fs.ID] {
			continue
		}
		seen[fs.ID] = true
		n := uint64(0)
		if i == 0 {
			n = need
		}
		if r := c.reserve(fs.Total); fs.Free < n || fs.Free-n < r {
			return &SpaceError{Dir: d, Need: n, Have: fs.Free, Reserve: r}
		}
	}
	return nil
}

// errNoStatfs: the platform reports no free space (the check is skipped).
var errNoStatfs = errors.New("statfs not supported")

// spaceNeeded estimates the bytes the plan's entries take once written: each file's content
// rounded up to 4 KiB blocks, and a block for every other entry.
func spaceNeeded(plan *Plan) uint64 {
	const block = 4096
	var n uint64
	for _, e := range plan.Entries {
		if e.Type == manifest.TypeFile {
			n += (uint64(e.Size) + block - 1) / block * block
		} else {
			n += block
		}
	}
	return n
}

// sizeString writes a byte count for people: "1.5 GiB".
func sizeString(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
