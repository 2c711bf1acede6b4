package gitsync

import "testing"

func TestSessionOfRef(t *testing.T) {
	for ref, want := range map[string]string{
		ResultRefPrefix + "abc":             "abc",
		"refs/openclaw/checkpoints/abc/3":   "abc",
		SnapshotRefPrefix + "abc":           "abc",
		"refs/openclaw/checkpoints/":        "",
		"refs/openclaw/worker-results":      "",
		"refs/heads/openclaw/abc":           "",
		"refs/openclawx/worker-results/abc": "",
	} {
		got, ok := SessionOfRef(ref)
		if got != want || ok != (want != "") {
			t.Errorf("SessionOfRef(%q) = %q, %t; want %q", ref, got, ok, want)
		}
	}
}
