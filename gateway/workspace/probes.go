// Probes of an environment's sync path: what `openclaw doctor` and `openclaw sync plan` ask.

package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// cleanupTimeout bounds the removal of a probe's files from the box.
const cleanupTimeout = 30 * time.Second

// probeTimeout bounds one probe of a box (CheckSync, BoxManifest) whatever its caller's context:
// a box that never answers cannot hold the request or its SSH connection.
const probeTimeout = 2 * time.Minute

// CheckSync proves the sync path of an environment: a small tree is sent to a scratch directory
// on the box through `openclaw worker unpack`, read back with the box's manifest, compared, and
// removed. It is what `openclaw doctor` reports as its sync step.
func (w *Service) CheckSync(ctx context.Context, envID string) (string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, probeTimeout, fmt.Errorf("the box did not finish the sync check within %s", probeTimeout))
	defer cancel()
	e, err := w.cfg.Envs.Get(ctx, envID)
	if err != nil {
		return "", err
	}
	if e.WorkerHome == "" || e.BundleHash == "" {
		return "", fmt.Errorf("environment %s has no worker installed (state %s)", envID, e.State)
	}
	src, err := os.MkdirTemp("", "openclaw-synccheck-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	files := map[string]string{"check.txt": "openclaw sync check\n", "dir/nested.txt": strings.Repeat("x", 4096)}
	for name, body := range files {
		p := filepath.Join(src, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	r, c, err := w.cfg.Dispatcher.Remote(ctx, e)
	if err != nil {
		return "", err
	}
	defer c.Close()
	dir := filepath.Join(e.WorkerHome, ".openclaw-worker", "synccheck")
	defer func() {
		// after a cancelled check too, but bounded: a box that stops answering cannot hold it
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = bootstrap.RunOK(cctx, c, "remove sync check", "rm -rf "+untrusted.Quote(dir))
	}()
	start := time.Now()
	res, err := stream.PushTree(ctx, r, src, dir, stream.TreeOptions{})
	if err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	local, plan, st := res.Base, res.Plan, res.Stats
	box, err := r.Manifest(ctx, dir, stream.ManifestOptions{})
	if err != nil {
		return "", fmt.Errorf("read back: %w", err)
	}
	if ch := manifest.Diff(local, box); len(ch.Added)+len(ch.Changed)+len(ch.Deleted) > 0 {
		return "", fmt.Errorf("the box's copy differs: %d added, %d changed, %d missing", len(ch.Added), len(ch.Changed), len(ch.Deleted))
	}
	return fmt.Sprintf("%d entries (%d bytes) sent through `openclaw worker unpack` and verified by the box's manifest in %s",
		len(plan.Entries), st.Bytes, time.Since(start).Round(time.Millisecond)), nil
}

// BoxTree is the manifest of a directory on an environment's box, with what selected it.
type BoxTree struct {
	Environment string             `json:"environment"`
	Session     string             `json:"session,omitempty"`
	Dir         string             `json:"dir"`
	Mode        manifest.Mode      `json:"mode"`
	Exclude     []string           `json:"exclude"`
	Include     []string           `json:"include"`
	Manifest    *manifest.Manifest `json:"manifest"`
}

// BoxManifest lists dir on an environment's box (by default the workspace of the session the
// environment serves, in that session's sync mode), with the profile's rules: what
// `openclaw sync plan ENV` diffs a workspace against. A directory that does not exist yet is an
// empty tree (a cold box).
func (w *Service) BoxManifest(ctx context.Context, envID, dir string, mode manifest.Mode) (BoxTree, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, probeTimeout, fmt.Errorf("the box did not send its manifest within %s", probeTimeout))
	defer cancel()
	e, err := w.cfg.Envs.Get(ctx, envID)
	if err != nil {
		return BoxTree{}, err
	}
	if e.WorkerHome == "" || e.BundleHash == "" {
		return BoxTree{}, fmt.Errorf("environment %s has no worker installed (state %s)", envID, e.State)
	}
	t := BoxTree{Environment: envID, Dir: dir, Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include}
	if dir == "" {
		served, err := w.cfg.Placements.ServedBy(ctx, envID)
		if err != nil {
			return BoxTree{}, err
		}
		if len(served) == 0 {
			return BoxTree{}, providers.Fieldf("dir", "environment %s serves no session: name a directory on the box", envID)
		}
		p := served[0]
		t.Session = p.SessionID
		t.Dir = p.BoxWorkspace
		if t.Dir == "" {
			t.Dir = placement.BoxWorkspace(e, t.Session)
		}
		if t.Mode == "" {
			t.Mode = manifest.Mode(p.SyncMode)
		}
	} else if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return BoxTree{}, providers.Fieldf("dir", "must be a clean absolute path on the box, got %q", dir)
	}
	switch t.Mode {
	case "":
		t.Mode = manifest.ModePlain
	case manifest.ModePlain, manifest.ModeGit:
	default:
		return BoxTree{}, providers.Fieldf("mode", "must be git or plain, got %q", t.Mode)
	}
	r, c, err := w.cfg.Dispatcher.Remote(ctx, e)
	if err != nil {
		return BoxTree{}, err
	}
	defer c.Close()
	mo := stream.ManifestOptions{Mode: t.Mode, Exclude: t.Exclude, Include: t.Include}
	if t.Session != "" {
		mo = placement.BoxManifestOptions(e, t.Mode, t.Session)
	}
	t.Manifest, err = r.Manifest(ctx, t.Dir, mo)
	if t.Exclude == nil {
		t.Exclude = []string{}
	}
	if t.Include == nil {
		t.Include = []string{}
	}
	return t, err
}
