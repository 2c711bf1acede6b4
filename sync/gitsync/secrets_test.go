package gitsync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/secretscan"
)

// TestScanCommitsRefusesAdoption: a held credential that one worker commit adds and the next
// removes, and one in a commit message, are found (path and line, the message by its commit);
// the adoption stops with the managed branch where it was.
func TestScanCommitsRefusesAdoption(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t, setup{})
	const key = "held-model-key-0123456789abcdef"
	synctest.Write(t, w.box, map[string]string{"conf/app.env": "A=1\nKEY=" + key + "\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "add config")
	synctest.Write(t, w.box, map[string]string{"conf/app.env": "A=1\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "drop the key\n\nit was "+key)
	msgCommit := synctest.Git(t, w.box, "rev-parse", "HEAD")
	bundle := w.bundle(t)

	sc := secretscan.New(map[string]string{"model": key}, nil)
	var found []secretscan.Finding
	_, err := w.anchor.AdoptChecked(ctx, "s1", bundle, func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
		var err error
		if found, err = ScanCommits(ctx, g, head, tip, sc); err != nil {
			return err
		}
		return &secretscan.FoundError{Findings: found}
	})
	var fe *secretscan.FoundError
	if !errors.As(err, &fe) {
		t.Fatalf("adoption: %v, want the scan's refusal", err)
	}
	rule := secretscan.KnownRulePrefix + "model"
	for _, want := range []secretscan.Finding{{Path: "conf/app.env", Line: 2, Rule: rule}, {Path: MessagePath(msgCommit), Line: 8, Rule: rule}} {
		if !slices.Contains(found, want) {
			t.Fatalf("findings %v, want %v", found, want)
		}
	}
	if head := synctest.Git(t, w.anchor.Dir, "rev-parse", "HEAD"); head != w.anchor.Base {
		t.Fatalf("refused adoption moved the managed branch to %s", head)
	}
	// allowed at both places, it adopts
	sc = secretscan.New(map[string]string{"model": key}, []secretscan.Allow{{Rule: rule, Path: "conf/app.env"}, {Rule: rule, Path: MessagePath(msgCommit)}})
	if _, err := w.anchor.AdoptChecked(ctx, "s1", bundle, func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
		found, err := ScanCommits(ctx, g, head, tip, sc)
		if err == nil && len(found) > 0 {
			err = &secretscan.FoundError{Findings: found}
		}
		return err
	}); err != nil {
		t.Fatalf("adoption with the findings allowed: %v", err)
	}
}

// TestCommittedSums: the regular files the worker's commits add or change, with the SHA256 of
// their content at the tip; a file changed and changed back, a deleted file and a symlink are
// not among them.
func TestCommittedSums(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t, setup{})
	synctest.Write(t, w.box, map[string]string{"new.txt": "first\n", "back.txt": "tmp\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "one")
	synctest.Write(t, w.box, map[string]string{"new.txt": "second\n"})
	synctest.Git(t, w.box, "rm", "-q", "back.txt")
	if err := os.Symlink("new.txt", filepath.Join(w.box, "link")); err != nil {
		t.Fatal(err)
	}
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "two")
	bundle := w.bundle(t)
	var sums map[string]string
	if _, err := w.anchor.AdoptChecked(ctx, "s1", bundle, func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
		var err error
		sums, err = CommittedSums(ctx, g, head, tip)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte("second\n"))
	if want := map[string]string{"new.txt": hex.EncodeToString(h[:])}; !maps.Equal(sums, want) {
		t.Fatalf("committed sums %v, want %v", sums, want)
	}
}
