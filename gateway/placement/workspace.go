// The workspace work of the dispatcher: the anchor, the sync out to a box, the inbound
// reconciliation (git bundles, mirrored files) and the base manifests it records.

package placement

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/mirror"
	"github.com/openclaw/cloudworkers/sync/secretscan"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// BoxManifestOptions select a session's workspace on its box: the sync mode, the profile's rules
// and the box's hash cache file (beside the workspace, never synced back).
func BoxManifestOptions(e envs.Environment, mode manifest.Mode, sessionID string) stream.ManifestOptions {
	return stream.ManifestOptions{Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include,
		CacheFile: BoxWorkspace(e, sessionID) + ".sync-cache.json"}
}

// BoxWorkspace is where a session's workspace lives on its environment's box.
func BoxWorkspace(e envs.Environment, sessionID string) string {
	return filepath.Join(e.WorkerHome, ".openclaw-worker", "work", sessionID)
}

// isGit reports whether dir is inside a git work tree. Neither the system's nor the user's git
// configuration is read (HOME is a scratch directory): whether a workspace is a repository does not
// depend on them.
func isGit(ctx context.Context, dir string) bool {
	out, err := gitexec.RunEnv(ctx, dir, []string{"HOME=" + os.TempDir(), "XDG_CONFIG_HOME=", "GIT_CONFIG_NOSYSTEM=1"}, nil,
		"rev-parse", "--is-inside-work-tree")
	return err == nil && strings.TrimSpace(string(out)) == "true"
}

// AnchorGit runs git in a managed worktree, which holds what workers made (their commits, the
// files mirrored back): through gitexec.Untrusted, so nothing there runs a filter, hook or
// transport.
func AnchorGit(ctx context.Context, dir string, args ...string) (string, error) {
	g, err := gitexec.NewUntrusted(ctx, dir)
	if err != nil {
		return "", err
	}
	return g.Line(ctx, args...)
}

// Remote opens the sync connection to an environment's box.
func (d *Dispatcher) Remote(ctx context.Context, e envs.Environment) (stream.Remote, *ssh.Client, error) {
	c, err := d.cfg.Boot.Dial(ctx, e)
	if err != nil {
		return stream.Remote{}, nil, fmt.Errorf("sync connection: %w", err)
	}
	bin := filepath.Join(e.WorkerHome, bootstrap.BundlesDir, e.BundleHash, "openclaw")
	return stream.Remote{Client: c, Command: untrusted.Quote(bin) + " worker", Wire: d.sync.countWire}, c, nil
}

// syncOut builds the anchor (a managed worktree for git, a gateway-owned copy otherwise), records
// its base manifest and sends it to the box.
func (d *Dispatcher) syncOut(ctx context.Context, p Placement) (Change, error) {
	ctx, cancel, wrap := withStepDeadline(ctx, &StepTimeoutError{Step: "sync", Setting: "box.syncTimeout", Timeout: d.cfg.SyncTimeout})
	defer cancel()
	start := time.Now()
	ch, err := d.syncOutStep(ctx, p)
	d.sync.observe("out", start, err)
	return ch, wrap(err)
}

func (d *Dispatcher) syncOutStep(ctx context.Context, p Placement) (Change, error) {
	sess, err := d.cfg.Sessions.Get(ctx, p.SessionID)
	if err != nil {
		return Change{}, err
	}
	e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return Change{}, err
	}
	excl, incl := e.Profile.Sync.Exclude, e.Profile.Sync.Include
	dir := filepath.Join(d.cfg.DataDir, "anchors", p.SessionID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Change{}, err
	}
	mode := manifest.ModePlain
	anchorDir := filepath.Join(dir, "workspace")
	var anchor *gitsync.Anchor
	var skipped []string // what the anchor's copy left out
	if p.AnchorDir != "" {
		anchorDir = p.AnchorDir
	}
	if isGit(ctx, sess.Workspace) {
		mode = manifest.ModeGit
		anchor, err = gitAnchor(ctx, sess.Workspace, d.cfg.DataDir, p.SessionID, "",
			gitsync.SnapshotOptions{Exclude: excl, Include: incl, Author: d.cfg.SnapshotAuthor})
		if err != nil {
			return Change{}, fmt.Errorf("managed worktree: %w", err)
		}
		anchorDir = anchor.Dir
	} else if p.AnchorDir == "" {
		if skipped, err = copyTree(ctx, sess.Workspace, anchorDir, excl, incl, dataDirFiles(d.cfg.DataDir)); err != nil {
			return Change{}, fmt.Errorf("copy workspace to the anchor: %w", err)
		}
	}
	r, c, err := d.Remote(ctx, e)
	if err != nil {
		return Change{}, err
	}
	defer c.Close()
	// long transfers show their progress (files, bytes, rate) as placement notes, every 2 s
	r.ProgressInterval = 2 * time.Second
	r.Progress = func(pr stream.Progress) {
		if !pr.Done && pr.Elapsed >= 2*time.Second {
			d.cfg.Placements.Note(ctx, p.SessionID, "sync progress: "+pr.String())
		}
	}
	r.Compression, r.Channels = d.cfg.Compression, d.cfg.Channels
	boxWS := BoxWorkspace(e, p.SessionID)
	// The anchor's hash cache stays on the gateway; the box keeps its own next to the workspace,
	// so that the pull-back's manifest of the box does not re-hash what it was sent.
	cacheFile := filepath.Join(dir, "hash-cache.json")
	cache := manifest.LoadCache(cacheFile)
	res, err := stream.PushTree(ctx, r, anchorDir, boxWS, stream.TreeOptions{Cache: cache, Manifest: BoxManifestOptions(e, mode, p.SessionID)})
	if err != nil {
		return Change{}, fmt.Errorf("sync out: %w", err)
	}
	if err := cache.Save(cacheFile); err != nil {
		d.log.Warn("save the anchor's hash cache", "session", p.SessionID, "err", err)
	}
	d.sync.bytes.WithLabelValues("out").Add(float64(res.Stats.Bytes))
	skipped = append(skipped, res.Skipped...)
	if anchor != nil {
		// Submodules the anchor holds go to their places, as they are at the recorded commits.
		subs, subSkipped, err := gitsync.PushSubmodules(ctx, r, anchor, boxWS, dir, excl, incl)
		if err != nil {
			return Change{}, fmt.Errorf("sync out: %w", err)
		}
		skipped = append(skipped, subSkipped...)
		for _, sub := range subs {
			skipped = slices.DeleteFunc(skipped, func(p string) bool { return p == sub.Path })
			d.cfg.Placements.Note(ctx, p.SessionID, fmt.Sprintf("submodule %s sent at %s (read-only on the box: the worker cannot commit in it, and what it changes there does not come back)",
				sub.Path, sub.Commit[:min(12, len(sub.Commit))]))
		}
	}
	if n := notSynced(skipped); n != "" {
		d.cfg.Placements.Note(ctx, p.SessionID, n)
	}
	base := res.Base
	if anchor != nil {
		base.BaseCommit = anchor.Base
		if anchor.Snapshot {
			base.SnapshotOf = anchor.Head
			d.cfg.Placements.Note(ctx, p.SessionID, fmt.Sprintf("uncommitted work of the checkout sent as commit %s (%q) on top of HEAD %s",
				short(anchor.Base), gitsync.SnapshotMessage, short(anchor.Head)))
		}
	}
	plan, st := res.Plan, res.Stats
	baseFile := filepath.Join(dir, fmt.Sprintf("base-%d.json", p.Generation))
	if err := writeManifest(baseFile, base); err != nil {
		return Change{}, err
	}
	if anchor != nil {
		pdir := filepath.Join(dir, "base-pack")
		_ = os.RemoveAll(pdir)
		if err := os.MkdirAll(pdir, 0o700); err != nil {
			return Change{}, err
		}
		if err := anchor.BasePack(ctx, filepath.Join(pdir, "base.pack")); err != nil {
			return Change{}, fmt.Errorf("base pack: %w", err)
		}
		pm, _, err := manifest.Build(ctx, pdir, manifest.Options{})
		if err != nil {
			return Change{}, err
		}
		inbox := filepath.Join(e.WorkerHome, ".openclaw-worker", "inbox", p.SessionID)
		if _, err := r.Unpack(ctx, inbox, pdir, stream.PlanFor(nil, pm)); err != nil {
			return Change{}, fmt.Errorf("send base pack: %w", err)
		}
		if _, err := bootstrap.RunOK(ctx, c, "set up the box repository", gitsync.BoxRepoCommand(boxWS, filepath.Join(inbox, "base.pack"), anchor.Name, anchor.Base, d.gitAuthor(e))); err != nil {
			return Change{}, err
		}
	}
	d.cfg.Envs.Touch(ctx, e.ID)
	m := string(mode)
	bundle := e.BundleHash
	return Change{To: Starting, Reason: fmt.Sprintf("synced %d entries (%d bytes) in %s mode", len(plan.Entries), st.Bytes, mode),
		AnchorDir: &anchorDir, BoxWorkspace: &boxWS, SyncMode: &m, BaseManifestID: &baseFile, BundleHash: &bundle}, nil
}

// gitAnchor creates the session's managed worktree at the user's HEAD plus a snapshot commit of
// their uncommitted work (gitsync.CreateWorkingAnchor), or opens it when an earlier (interrupted
// or resumed) step already created it; base is then the recorded base commit ("" = its branch
// head).
func gitAnchor(ctx context.Context, repo, dataDir, sessionID, base string, snap gitsync.SnapshotOptions) (*gitsync.Anchor, error) {
	name := anchorName(sessionID)
	fp, err := gitsync.Fingerprint(ctx, repo)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, "worktrees", fp, name)
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		snap.TempDir = filepath.Join(dataDir, "worktrees", fp)
		return gitsync.CreateWorkingAnchor(ctx, repo, dataDir, name, snap)
	}
	a := &gitsync.Anchor{Repo: repo, Dir: dir, Name: name, Branch: gitsync.BranchPrefix + name, Base: base}
	if a.Base == "" {
		head, err := AnchorGit(ctx, dir, "rev-parse", "--verify", "refs/heads/"+a.Branch)
		if err != nil {
			return nil, fmt.Errorf("open managed worktree %s: %w", dir, err)
		}
		a.Base = head
	}
	return a, nil
}

// short is an object id cut to 12 digits, as notes show it.
func short(id string) string { return id[:min(12, len(id))] }

// anchorName is the managed branch name (openclaw/<name>) of a session.
func anchorName(sessionID string) string { return strings.TrimPrefix(sessionID, "ses_") }

// Branch is a session's managed branch in its repository (and its anchor).
func Branch(sessionID string) string { return gitsync.BranchPrefix + anchorName(sessionID) }

// inbound brings the box's workspace into the anchor (git: adopt the worker's commits, then
// mirror untracked work; plain: mirror against the base) and returns the anchor's new manifest.
//
// force lets the mirror delete past the deletion brake (a pull-back the operator confirmed; never
// a checkpoint).
func (d *Dispatcher) inbound(ctx context.Context, p Placement, e envs.Environment, force bool) (string, *manifest.Manifest, error) {
	ctx, cancel, wrap := withStepDeadline(ctx, &StepTimeoutError{Step: "reconcile", Setting: "box.reconcileTimeout", Timeout: d.cfg.ReconcileTimeout})
	defer cancel()
	start := time.Now()
	summary, m, err := d.inboundStep(ctx, p, e, force)
	d.sync.observe("in", start, err)
	return summary, m, wrap(err)
}

func (d *Dispatcher) inboundStep(ctx context.Context, p Placement, e envs.Environment, force bool) (string, *manifest.Manifest, error) {
	var err error
	base, err := readManifest(p.BaseManifestID)
	if err != nil {
		return "", nil, fmt.Errorf("base manifest: %w", err)
	}
	r, c, err := d.Remote(ctx, e)
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	mode := manifest.Mode(p.SyncMode)
	// Nothing is adopted that holds a credential the gateway holds or looks like one.
	scan, err := d.scanner(ctx, p.SessionID, e.ID)
	if err != nil {
		return "", nil, err
	}
	// What the box sends back is bounded by the profile's inbound quotas, and may not fill the
	// anchor's filesystem or the data directory's (gateway.db) past the reserve.
	lim, mlim := stream.InboundLimits(e.Profile.Sync.MaxInboundBytes, e.Profile.Sync.MaxInboundEntries, e.Profile.Sync.MaxInboundFileBytes)
	r.ManifestLimits = mlim
	space := &stream.SpaceCheck{Keep: []string{d.cfg.DataDir}, ReserveBytes: d.cfg.ReserveFreeBytes, ReservePercent: d.cfg.ReserveFreePercent}
	// The worker is fenced: its workspace no longer changes, one manifest serves both steps.
	boxM, err := r.Manifest(ctx, p.BoxWorkspace, BoxManifestOptions(e, mode, p.SessionID))
	if err != nil {
		return "", nil, fmt.Errorf("box manifest: %w", err)
	}
	summary := ""
	if mode == manifest.ModeGit {
		sess, err := d.cfg.Sessions.Get(ctx, p.SessionID)
		if err != nil {
			return "", nil, err
		}
		a, err := gitAnchor(ctx, sess.Workspace, d.cfg.DataDir, p.SessionID, base.BaseCommit,
			gitsync.SnapshotOptions{Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include, Author: d.cfg.SnapshotAuthor})
		if err != nil {
			return "", nil, err
		}
		bundle := filepath.Join(filepath.Dir(p.BaseManifestID), fmt.Sprintf("result-%d.bundle", p.Generation))
		f, err := os.Create(bundle)
		if err != nil {
			return "", nil, err
		}
		err = r.Exec(ctx, gitsync.BoxBundleCommand(p.BoxWorkspace, base.BaseCommit), f, gitsync.MaxBundleBytes)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", nil, fmt.Errorf("fetch the worker's commits: %w", err)
		}
		if fi, _ := os.Stat(bundle); fi != nil && fi.Size() > 0 {
			d.sync.bytes.WithLabelValues("in").Add(float64(fi.Size()))
			// Everything that came back is scanned before anything is adopted: the commits, then
			// the files the mirror would bring (a hit in an uncommitted file adopts no commit).
			check := func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
				// the checkout is bounded like any inbound tree, and must leave the reserve free
				size, err := gitsync.CheckoutSize(ctx, g, head, tip, lim)
				if err != nil {
					return err
				}
				if err := space.Check(a.Dir, uint64(size)); err != nil {
					return err
				}
				if err := scan.commits(ctx, g, head, tip); err != nil {
					return err
				}
				committed, err := gitsync.CommittedSums(ctx, g, head, tip)
				if err != nil {
					return err
				}
				return scanUncommitted(ctx, r, p, base, mirror.Filter(boxM, e.Profile.Sync.Exclude, e.Profile.Sync.Include), committed, lim, space, scan)
			}
			tip, err := a.AdoptChecked(ctx, anchorName(p.SessionID), bundle, check)
			if err != nil {
				return "", nil, err
			}
			n := "?"
			if out, err := AnchorGit(ctx, a.Dir, "rev-list", "--count", base.BaseCommit+".."+tip); err == nil {
				n = out
			}
			summary = fmt.Sprintf("commits: %s adopted, managed branch %s fast-forwarded to %s", n, a.Branch, short(tip))
		} else {
			summary = "commits: none"
		}
		// untracked and uncommitted work comes back against the fast-forwarded anchor
		base, err = a.Manifest(ctx, manifest.Options{Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include})
		if err != nil {
			return "", nil, err
		}
	}
	res, err := mirror.Pull(ctx, mirror.Config{Anchor: p.AnchorDir, Base: base, Box: boxM, Mode: mode,
		Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include, Force: force, MaxDeleteShare: e.Profile.Sync.MaxDeleteShare,
		Limits: lim, Space: space,
		Inspect: scan.files(ctx),
		Fetch: func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error) {
			return r.Pack(ctx, p.BoxWorkspace, plan, root, opts)
		}})
	if err != nil {
		return "", nil, fmt.Errorf("reconcile workspace: %w", err)
	}
	d.sync.bytes.WithLabelValues("in").Add(float64(res.Stats.Bytes))
	if summary != "" {
		summary += "; "
	}
	if mode == manifest.ModeGit {
		// reported apart from the commits: they stay uncommitted changes of the managed worktree
		summary += "uncommitted work: "
	}
	summary += fmt.Sprintf("%d files updated, %d deleted", len(res.Plan.Entries), len(res.Plan.Deletes))
	now, _, err := manifest.Build(ctx, p.AnchorDir, manifest.Options{Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include})
	if err != nil {
		return "", nil, err
	}
	if mode == manifest.ModeGit {
		if head, herr := AnchorGit(ctx, p.AnchorDir, "rev-parse", "HEAD"); herr == nil {
			now.BaseCommit = head
		}
	}
	return summary, now, nil
}

// errScanned ends scanUncommitted's fetch once its files are scanned: nothing is written.
var errScanned = errors.New("scanned")

// scanUncommitted scans, before a git pull-back adopts the worker's commits, every file and
// symlink of the box that differs from the anchor's recorded base — the uncommitted work the
// mirror brings after the adoption — but the files whose content is the one the commits leave
// there (committed: path → SHA256, scanned as commits): fetched, staged and verified in a scratch
// directory of the data dir under the same limits, scanned there, then dropped. The mirror scans
// what it fetches again (the box is fenced: the same content).
func scanUncommitted(ctx context.Context, r stream.Remote, p Placement, base, box *manifest.Manifest, committed map[string]string, lim stream.Limits, space *stream.SpaceCheck, scan *secretScan) error {
	plan := stream.PlanFor(base, box)
	plan.Deletes = nil // a deletion carries nothing to scan
	plan.Entries = slices.DeleteFunc(plan.Entries, func(e manifest.Entry) bool {
		return e.Type == manifest.TypeFile && e.SHA256 != "" && committed[e.Path] == e.SHA256
	})
	if !slices.ContainsFunc(plan.Entries, func(e manifest.Entry) bool { return e.Type != manifest.TypeDir }) {
		return nil
	}
	if err := stream.ValidatePlan(&plan, lim, false); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(filepath.Dir(p.BaseManifestID), "scan-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	inspect := scan.files(ctx)
	_, err = r.Pack(ctx, p.BoxWorkspace, plan, filepath.Join(scratch, "tree"), stream.ApplyOptions{Limits: lim, Space: space,
		Inspect: func(staging string, plan *stream.Plan) error {
			if err := inspect(staging, plan); err != nil {
				return err
			}
			return errScanned
		}})
	var found *secretscan.FoundError
	switch {
	case errors.Is(err, errScanned):
		return nil
	case errors.As(err, &found):
		return found // path, line and rule: the refusal as the mirror's scan gives it
	case err != nil:
		return fmt.Errorf("secret scan of the box's uncommitted work: %w", err)
	}
	return nil
}

func writeManifest(path string, m *manifest.Manifest) error {
	return atomicfile.WriteFunc(path, 0o600, m.Encode)
}

func readManifest(path string) (*manifest.Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return manifest.Decode(f, manifest.TrustedLimits) // the gateway's own record of a workspace
}

// notSynced says which paths of the workspace the box did not get because no sync can carry
// them, or "" when there are none.
func notSynced(skipped []string) string {
	if len(skipped) == 0 {
		return ""
	}
	slices.Sort(skipped)
	skipped = slices.Compact(skipped)
	shown := skipped[:min(len(skipped), 5)]
	more := ""
	if len(skipped) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(skipped)-len(shown))
	}
	return fmt.Sprintf("not synced to the box: %d path(s) no sync can carry (submodules, devices, FIFOs, sockets, names that are not UTF-8): %s%s",
		len(skipped), strings.Join(shown, ", "), more)
}

// dataDirFiles are the data dir and every entry directly in it (its tokens, credentials key,
// database, and the directories of boxes, anchors and checkpoints), by device and inode: a
// workspace's copy refuses them under any name (a hard link, a bind mount), so that no sync sends
// one to a box even when the workspace check was passed by a path that reaches them.
func dataDirFiles(dataDir string) map[manifest.FileID]string {
	out := map[manifest.FileID]string{}
	add := func(path, what string) {
		if fi, err := os.Lstat(path); err == nil {
			if id := manifest.IDOf(fi); id != (manifest.FileID{}) {
				out[id] = what
			}
		}
	}
	add(dataDir, "the gateway's data dir")
	ents, _ := os.ReadDir(dataDir)
	for _, e := range ents {
		add(filepath.Join(dataDir, e.Name()), "the gateway's "+filepath.Join(dataDir, e.Name()))
	}
	return out
}

// copyTree copies the workspace src into the new anchor dst and returns what it left out
// (manifest.Stats.Skipped).
func copyTree(ctx context.Context, src, dst string, excl, incl []string, forbidden map[manifest.FileID]string) ([]string, error) {
	m, st, err := manifest.Build(ctx, src, manifest.Options{Mode: manifest.ModePlain, Exclude: excl, Include: incl, Forbidden: forbidden})
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := stream.Write(ctx, pw, src, stream.PlanFor(nil, m))
		pw.CloseWithError(err)
		errc <- err
	}()
	plan := stream.PlanFor(nil, m)
	_, aerr := stream.Apply(ctx, pr, dst, stream.ApplyOptions{Limits: stream.TrustedLimits, Expect: &plan, AllowEscapingSymlinks: true})
	pr.Close()
	return st.Skipped, errors.Join(aerr, <-errc)
}

// gitAuthor is the identity of the worker's commits in an environment's box repositories: the
// profile's git.author, else the gateway's.
func (d *Dispatcher) gitAuthor(e envs.Environment) gitsync.Identity {
	if a := e.Profile.Git.Author; a.Name != "" {
		return gitsync.Identity{Name: a.Name, Email: a.Email}
	}
	return d.cfg.GitAuthor
}
