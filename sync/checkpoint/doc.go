// Package checkpoint records inbound checkpoints of an anchor — commits on refs in git mode,
// manifest snapshots over content-addressed blobs in plain mode — and restores them.
package checkpoint
