package placement

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRemoveOldBasesLeavesLaterGenerations: after a checkpoint of generation 2, the base manifests
// of generations 1 and 2 other than the new one go (also those named by checkpoint number, as
// earlier versions wrote them); a later generation's (written by a dispatch that overtook a slow
// checkpoint) and other files stay.
func TestRemoveOldBasesLeavesLaterGenerations(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"base-1.json", "base-1-cp1.json", "base-2.json", "base-2-cp2.json", "base-2-in1764000000000000000.json",
		"base-2-in1764000000000000001.json", "base-3.json", "base-3-in1764000000000000002.json", "hash-cache.json", "result-2.bundle", "base-x.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removeOldBases(filepath.Join(dir, "base-2-in1764000000000000001.json"), 2)
	var left []string
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		left = append(left, de.Name())
	}
	want := []string{"base-2-in1764000000000000001.json", "base-3-in1764000000000000002.json", "base-3.json", "base-x.json", "hash-cache.json", "result-2.bundle"}
	if !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
}
