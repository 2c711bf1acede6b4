// Package manifest describes a workspace tree as sorted entries with content hashes, builds it in plain
// and git mode, diffs two trees, and strictly decodes manifests that come from a box.
package manifest
