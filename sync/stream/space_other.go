//go:build !linux

package stream

// statfs is not implemented here: the free-space check is skipped.
func statfs(string) (FSSpace, error) { return FSSpace{}, errNoStatfs }
