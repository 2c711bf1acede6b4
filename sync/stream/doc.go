// Package stream moves a set of manifest entries, and a list of deletions, as one tar+zstd archive,
// and applies such an archive into a directory only after every byte of it has been checked.
package stream
