package placement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/mirror"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// DispatchConfig configures a Dispatcher.
type DispatchConfig struct {
	Placements *Placements
	Sessions   *sessions.Store
	Envs       *envs.Manager
	Boot       *bootstrap.Bootstrapper
	// Admitted reports whether an environment's worker is admitted.
	Admitted func(envID string) bool
	// Busy reports whether a session has a turn in flight (turn admission owns that fact).
	Busy func(sessionID string) bool
	// ReclaimInterval is how often active placements are checked for a lost worker (default 2s);
	// ReclaimGrace is how long a worker may stay unreachable before its session is reclaimed
	// (default 2m).
	ReclaimInterval, ReclaimGrace time.Duration
	DataDir                       string
	Log                           *slog.Logger
	// Compression encodes workspace syncs to boxes (stream.CompressAuto when empty); Channels is
	// how many SSH channels a cold sync of a large workspace uses (0: stream.DefaultChannels).
	Compression stream.Compression
	Channels    int
	// ReserveFreeBytes and ReserveFreePercent: what a pull-back leaves free on the anchor's and
	// the data directory's filesystems, the larger of the two (0: stream.DefaultReserveBytes,
	// stream.DefaultReservePercent).
	ReserveFreeBytes   int64
	ReserveFreePercent float64
	// CheckpointKeep is how many of a session's newest checkpoints are kept (0:
	// checkpoint.DefaultKeep); older ones are pruned after each checkpoint.
	CheckpointKeep int
	// SyncTimeout bounds one sync out to a box (default 30m); ReconcileTimeout bounds one
	// pull-back or checkpoint from a box (default 10m). A step past its deadline fails the
	// placement with a recovery action instead of holding it.
	SyncTimeout, ReconcileTimeout time.Duration
	// Clock paces the dispatcher's polls (a worker's admission, a turn's end); the real clock
	// when nil.
	Clock clock.Clock
}

// StepTimeoutError is a placement step that passed its deadline because the box did not answer
// in time.
type StepTimeoutError struct {
	Step    string        // "sync" or "reconcile"
	Setting string        // the config setting that bounds it
	Timeout time.Duration // its value
}

func (e *StepTimeoutError) Error() string {
	return fmt.Sprintf("%s did not finish within %s (%s): the box did not answer in time", e.Step, e.Timeout, e.Setting)
}

// withStepDeadline bounds ctx by a step's timeout; the returned wrap turns an error that the
// deadline caused into its *StepTimeoutError.
func withStepDeadline(ctx context.Context, te *StepTimeoutError) (context.Context, context.CancelFunc, func(error) error) {
	sctx, cancel := context.WithTimeoutCause(ctx, te.Timeout, te)
	wrap := func(err error) error {
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(sctx), te) {
			return fmt.Errorf("%w (last error: %v)", te, err)
		}
		return err
	}
	return sctx, cancel, wrap
}

// boxManifestOptions select a session's workspace on its box: the sync mode, the profile's rules
// and the box's hash cache file (beside the workspace, never synced back).
func boxManifestOptions(e envs.Environment, mode manifest.Mode, sessionID string) stream.ManifestOptions {
	return stream.ManifestOptions{Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include,
		CacheFile: boxWorkspace(e, sessionID) + ".sync-cache.json"}
}

// boxWorkspace is where a session's workspace lives on its environment's box.
func boxWorkspace(e envs.Environment, sessionID string) string {
	return filepath.Join(e.WorkerHome, ".openclaw-worker", "work", sessionID)
}

// Dispatcher moves sessions between the gateway and workers: dispatch (local → … → active) and
// pull-back (active → draining → reconciling → local). Every step is recorded in the placement
// state machine before and after it runs, so a restarted gateway resumes from the recorded step.
type Dispatcher struct {
	cfg DispatchConfig
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	active map[string]bool // session ids with a step running
	force  map[string]bool // session ids whose next reconciliation may pass the deletion brake
}

// NewDispatcher returns a Dispatcher; call Resume after the environment manager has started.
func NewDispatcher(cfg DispatchConfig) *Dispatcher {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ReclaimInterval == 0 {
		cfg.ReclaimInterval = 2 * time.Second
	}
	if cfg.ReclaimGrace == 0 {
		cfg.ReclaimGrace = 2 * time.Minute
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = 30 * time.Minute
	}
	if cfg.ReconcileTimeout == 0 {
		cfg.ReconcileTimeout = 10 * time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Dispatcher{cfg: cfg, log: cfg.Log, ctx: ctx, cancel: cancel, active: map[string]bool{}}
	d.wg.Add(1)
	go d.reclaimLoop(cfg.ReclaimInterval, cfg.ReclaimGrace)
	return d
}

// AfterTurn checkpoints a session in the background after one of its worker turns ended.
func (d *Dispatcher) AfterTurn(sessionID string) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.Checkpoint(d.ctx, sessionID); err != nil && d.ctx.Err() == nil {
			d.log.Warn("checkpoint", "session", sessionID, "err", err)
		}
	}()
}

// Close stops background steps; they resume on the next start.
func (d *Dispatcher) Close() {
	d.cancel()
	d.wg.Wait()
}

// Resume restarts every placement that a previous gateway left mid-way.
func (d *Dispatcher) Resume(ctx context.Context) error {
	rows, err := d.cfg.Placements.db.R.QueryContext(ctx, `SELECT session_id FROM placements WHERE state IN (?,?,?,?,?,?)`,
		string(Requested), string(Provisioning), string(Syncing), string(Starting), string(Draining), string(Reconciling))
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	for _, id := range ids {
		d.log.Info("resuming placement", "session", id)
		d.kick(id)
	}
	return nil
}

// kick runs the state machine of a session in the background unless it already runs.
func (d *Dispatcher) kick(sessionID string) {
	d.mu.Lock()
	if d.active[sessionID] {
		d.mu.Unlock()
		return
	}
	d.active[sessionID] = true
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		defer func() {
			d.mu.Lock()
			delete(d.active, sessionID)
			d.mu.Unlock()
		}()
		if err := d.advance(d.ctx, sessionID); err != nil && d.ctx.Err() == nil {
			d.log.Warn("placement step failed", "session", sessionID, "err", err)
		}
	}()
}

// Dispatch starts moving a local session to a worker of the profile. It returns once the intent
// is recorded; the steps run in the background (follow them with Get or the events).
func (d *Dispatcher) Dispatch(ctx context.Context, sessionID, profileID, machineClass string) (Placement, error) {
	sess, err := d.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return Placement{}, err
	}
	if sess.Workspace == "" {
		return Placement{}, fmt.Errorf("session %s has no workspace to send to a worker", sessionID)
	}
	prof, err := d.cfg.Envs.Profile(ctx, profileID)
	if err != nil {
		return Placement{}, err
	}
	if machineClass != "" {
		if _, err := envs.WithClass(prof, machineClass); err != nil {
			return Placement{}, err
		}
	}
	if d.cfg.Busy != nil && d.cfg.Busy(sessionID) {
		return Placement{}, fmt.Errorf("session %s: %w; dispatch after it ends", sessionID, ErrBusy)
	}
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	reason := "dispatch to profile " + profileID
	if machineClass != "" {
		reason += " (machine class " + machineClass + ")"
	}
	zero := 0 // a new dispatch: no barrier passed yet
	p, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, Change{To: Requested, Reason: reason, ProfileID: &profileID, MachineClass: &machineClass, BarrierStep: &zero})
	if err != nil {
		return p, err
	}
	d.kick(sessionID)
	return p, nil
}

// PullBack starts bringing a session home: drain, reconcile the workspace, activate local.
func (d *Dispatcher) PullBack(ctx context.Context, sessionID string, force bool) (Placement, error) {
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	if p.State == Failed && d.failedReconciling(ctx, sessionID) {
		// Reconciling failed (deletion brake, drift, divergence, a lost link): the worker is
		// drained and fenced; try the reconciliation again, confirming deletions when forced.
		reason := "pull-back retried"
		if force {
			reason += " with --force (deletions confirmed)"
		}
		// The confirmation is in place before the move is recorded (a step loop still running
		// could take the reconciliation at once) and withdrawn if the move is refused; reconcile
		// consumes it.
		d.setForce(sessionID, force)
		p, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, Change{To: Reconciling, Reason: reason})
		if err != nil {
			d.setForce(sessionID, false)
			return p, err
		}
		d.kick(sessionID)
		return p, nil
	}
	if p.State != Active {
		return p, fmt.Errorf("session %s is %s, not active on a worker", sessionID, p.State)
	}
	step := 1 // barrier step 1: stop new turn admission (the placement leaves active)
	d.setForce(sessionID, force)
	wait, cancel := context.WithTimeout(ctx, CheckpointWait)
	defer cancel()
	for {
		// Not while a checkpoint holds the session: it brings the box's work into the anchor and
		// then records the new base at the generation it claimed. Leaving active first would
		// refuse that record, and the reconciliation would find the anchor drifted from a base
		// that no longer describes it. A checkpoint starts only while the session is active, so
		// once this move is made none can.
		var moved Placement
		moved, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation,
			Change{To: Draining, Reason: "pull-back requested", BarrierStep: &step, UnlessClaim: checkpointRun})
		if err == nil {
			p = moved
			break
		}
		if !errors.Is(err, ErrBusy) {
			d.setForce(sessionID, false)
			return p, err
		}
		if err := d.poll(wait); err != nil {
			d.setForce(sessionID, false)
			if ctx.Err() == nil {
				err = fmt.Errorf("session %s: a checkpoint has been bringing the worker's workspace into the anchor for over %s; pull back again once it is done: %w", sessionID, CheckpointWait, ErrBusy)
			}
			return p, err
		}
	}
	d.kick(sessionID)
	return p, nil
}

// CheckpointWait bounds how long a pull-back waits for a running checkpoint before it answers
// that the session is busy.
var CheckpointWait = 2 * time.Minute

// failedReconciling reports whether a session's placement failed in its reconciliation step (its
// last transition was reconciling → failed): only then is the worker drained and fenced, with the
// recorded base and box workspace still those of the reconciliation.
func (d *Dispatcher) failedReconciling(ctx context.Context, sessionID string) bool {
	evs, err := d.cfg.Placements.Events(ctx, sessionID)
	if err != nil {
		return false
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if ev := evs[i]; ev.From != ev.To { // notes keep the state
			return ev.From == Reconciling && ev.To == Failed
		}
	}
	return false
}

// setForce records whether the next reconciliation of a session may delete more than the
// deletion brake allows. It is kept in memory: after a gateway restart the brake applies again,
// and the operator confirms once more.
func (d *Dispatcher) setForce(sessionID string, force bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.force == nil {
		d.force = map[string]bool{}
	}
	if force {
		d.force[sessionID] = true
	} else {
		delete(d.force, sessionID)
	}
}

// takeForce returns and clears a session's confirmation: it holds for one reconciliation.
func (d *Dispatcher) takeForce(sessionID string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.force[sessionID]
	delete(d.force, sessionID)
	return f
}

// advance runs steps until the placement rests (active, local, reclaimed or failed).
func (d *Dispatcher) advance(ctx context.Context, sessionID string) error {
	for {
		p, err := d.cfg.Placements.Get(ctx, sessionID)
		if err != nil {
			return err
		}
		var next Change
		switch p.State {
		case Requested:
			next, err = d.provision(ctx, p)
		case Provisioning:
			next, err = d.waitReady(ctx, p)
		case Syncing:
			next, err = d.syncOut(ctx, p)
		case Starting:
			next, err = d.start(ctx, p)
		case Draining:
			next, err = d.drain(ctx, p)
		case Reconciling:
			next, err = d.reconcile(ctx, p)
		default:
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err() // stopping: the recorded step resumes on restart
		}
		if err != nil {
			next = failure(p, err)
		}
		_, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, next)
		var also *AlsoError
		if errors.As(err, &also) && next.To != Failed && ctx.Err() == nil {
			// what moves with the placement failed (the session's binding, the environment's
			// attachment): nothing of it was written, and the step fails
			next = failure(p, also.Err)
			_, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, next)
		}
		if err != nil {
			return err
		}
		d.log.Info("placement", "session", sessionID, "from", p.State, "to", next.To, "reason", next.Reason)
	}
}

// failure is the move to failed of a placement whose step at p failed with err, with the recovery
// action its step calls for.
func failure(p Placement, err error) Change {
	next := Change{To: Failed, Reason: err.Error(), Error: err.Error()}
	var timeout *StepTimeoutError
	switch {
	case errors.As(err, &timeout) && p.State == Reconciling:
		next.Error = err.Error() + " — recovery: the worker's results are still on the box (environment " + p.EnvironmentID +
			"); run `openclaw session pullback " + p.SessionID + "` again once it answers, or `openclaw env destroy " + p.EnvironmentID +
			" --force` to discard them"
	case errors.As(err, &timeout):
		next.Error = err.Error() + " — recovery: run `openclaw session dispatch " + p.SessionID + "` to try again (another machine is leased if this one stays silent), or `openclaw env destroy " + p.EnvironmentID + " --force`"
	case p.State == Reconciling:
		var tooMany *mirror.TooManyDeletesError
		if errors.As(err, &tooMany) {
			next.Error = err.Error() + " — recovery: if the worker meant to delete them, run `openclaw session pullback " + p.SessionID +
				" --force`; the worker's results stay on the box (environment " + p.EnvironmentID + ") until then"
		} else {
			next.Error = err.Error() + " — recovery: the worker's results are still on the box (environment " + p.EnvironmentID +
				"); resolve the conflict in " + p.AnchorDir + " and run `openclaw session pullback " + p.SessionID +
				"` again, or destroy the environment to discard them"
		}
	}
	return next
}

// provision reuses an idle environment of the profile (warm lease) or leases a new one.
func (d *Dispatcher) provision(ctx context.Context, p Placement) (Change, error) {
	list, err := d.cfg.Envs.List(ctx, false)
	if err != nil {
		return Change{}, err
	}
	for _, e := range list {
		if e.ProfileID == p.ProfileID && (e.State == envs.Ready || e.State == envs.Idle) && d.cfg.Admitted(e.ID) &&
			(p.MachineClass == "" || e.Class() == p.MachineClass) {
			id := e.ID
			return Change{To: Provisioning, Reason: "reusing warm environment " + id, EnvironmentID: &id}, nil
		}
	}
	e, _, err := d.cfg.Envs.CreateClass(ctx, p.ProfileID, fmt.Sprintf("dispatch-%s-%d", p.SessionID, p.Generation), p.MachineClass)
	if err != nil {
		return Change{}, fmt.Errorf("lease a machine: %w", err)
	}
	id := e.ID
	return Change{To: Provisioning, Reason: "leasing environment " + id, EnvironmentID: &id}, nil
}

func (d *Dispatcher) waitReady(ctx context.Context, p Placement) (Change, error) {
	e, err := d.cfg.Envs.WaitFor(ctx, p.EnvironmentID, func(e envs.Environment) bool {
		return e.State == envs.Ready || e.State == envs.Idle || e.State == envs.Attached || e.State.Dead() || e.State == envs.Destroying
	})
	if err != nil {
		return Change{}, err
	}
	if e.State != envs.Ready && e.State != envs.Idle {
		return Change{}, fmt.Errorf("environment %s is %s: %s", e.ID, e.State, e.Error)
	}
	return Change{To: Syncing, Reason: "environment " + e.ID + " ready"}, nil
}

// isGit reports whether dir is inside a git work tree.
func isGit(ctx context.Context, dir string) bool {
	cmd := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "--is-inside-work-tree")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "GIT_CONFIG_NOSYSTEM=1"}
	out, err := cmd.Output()
	return err == nil && strings.TrimSpace(string(out)) == "true"
}

// remote opens the sync connection to an environment's box.
func (d *Dispatcher) remote(ctx context.Context, e envs.Environment) (stream.Remote, *ssh.Client, error) {
	c, err := d.cfg.Boot.Dial(ctx, e)
	if err != nil {
		return stream.Remote{}, nil, fmt.Errorf("sync connection: %w", err)
	}
	bin := filepath.Join(e.WorkerHome, bootstrap.BundlesDir, e.BundleHash, "openclaw")
	return stream.Remote{Client: c, Command: bootstrap.Quote(bin) + " worker"}, c, nil
}

// syncOut builds the anchor (a managed worktree for git, a gateway-owned copy otherwise), records
// its base manifest and sends it to the box.
func (d *Dispatcher) syncOut(ctx context.Context, p Placement) (Change, error) {
	ctx, cancel, wrap := withStepDeadline(ctx, &StepTimeoutError{Step: "sync", Setting: "box.syncTimeout", Timeout: d.cfg.SyncTimeout})
	defer cancel()
	ch, err := d.syncOutStep(ctx, p)
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
		anchor, err = gitAnchor(ctx, sess.Workspace, d.cfg.DataDir, p.SessionID, "")
		if err != nil {
			return Change{}, fmt.Errorf("managed worktree: %w", err)
		}
		anchorDir = anchor.Dir
	} else if p.AnchorDir == "" {
		if skipped, err = copyTree(ctx, sess.Workspace, anchorDir, excl, incl); err != nil {
			return Change{}, fmt.Errorf("copy workspace to the anchor: %w", err)
		}
	}
	r, c, err := d.remote(ctx, e)
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
	boxWS := boxWorkspace(e, p.SessionID)
	// The anchor's hash cache stays on the gateway; the box keeps its own next to the workspace,
	// so that the pull-back's manifest of the box does not re-hash what it was sent.
	cacheFile := filepath.Join(dir, "hash-cache.json")
	cache := manifest.LoadCache(cacheFile)
	res, err := stream.PushTree(ctx, r, anchorDir, boxWS, stream.TreeOptions{Cache: cache, Manifest: boxManifestOptions(e, mode, p.SessionID)})
	if err != nil {
		return Change{}, fmt.Errorf("sync out: %w", err)
	}
	if err := cache.Save(cacheFile); err != nil {
		d.log.Warn("save the anchor's hash cache", "session", p.SessionID, "err", err)
	}
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
		if _, err := bootstrap.RunOK(ctx, c, "set up the box repository", gitsync.BoxRepoCommand(boxWS, filepath.Join(inbox, "base.pack"), anchor.Name, anchor.Base)); err != nil {
			return Change{}, err
		}
	}
	d.cfg.Envs.Touch(ctx, e.ID)
	m := string(mode)
	bundle := e.BundleHash
	return Change{To: Starting, Reason: fmt.Sprintf("synced %d entries (%d bytes) in %s mode", len(plan.Entries), st.Bytes, mode),
		AnchorDir: &anchorDir, BoxWorkspace: &boxWS, SyncMode: &m, BaseManifestID: &baseFile, BundleHash: &bundle}, nil
}

// gitAnchor creates the session's managed worktree, or opens it when an earlier (interrupted or
// resumed) step already created it; base is then the recorded base commit ("" = its branch head).
func gitAnchor(ctx context.Context, repo, dataDir, sessionID, base string) (*gitsync.Anchor, error) {
	name := anchorName(sessionID)
	fp, err := gitsync.Fingerprint(ctx, repo)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, "worktrees", fp, name)
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		return gitsync.CreateAnchor(ctx, repo, dataDir, name, "")
	}
	a := &gitsync.Anchor{Repo: repo, Dir: dir, Name: name, Branch: gitsync.BranchPrefix + name, Base: base}
	if a.Base == "" {
		out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "--verify", "refs/heads/"+a.Branch).Output()
		if err != nil {
			return nil, fmt.Errorf("open managed worktree %s: %w", dir, err)
		}
		a.Base = strings.TrimSpace(string(out))
	}
	return a, nil
}

// anchorName is the managed branch name (openclaw/<name>) of a session.
func anchorName(sessionID string) string { return strings.TrimPrefix(sessionID, "ses_") }

// startAdmitWait bounds how long the start step waits for the environment's worker to be admitted.
var startAdmitWait = time.Minute

// start attaches the session to the environment's worker and fences any earlier owner.
func (d *Dispatcher) start(ctx context.Context, p Placement) (Change, error) {
	// a restarted gateway resumes here before the box's worker is re-admitted: wait for it
	for deadline := time.Now().Add(startAdmitWait); !d.cfg.Admitted(p.EnvironmentID); {
		if time.Now().After(deadline) {
			return Change{}, fmt.Errorf("the worker of environment %s is not admitted after %s", p.EnvironmentID, startAdmitWait)
		}
		if err := d.poll(ctx); err != nil {
			return Change{}, err
		}
	}
	// The session is bound, the environment attached and the placement active in one transaction.
	return Change{To: Active, Also: func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
		epoch, err := d.cfg.Sessions.BindTx(ctx, tx, p.SessionID, p.EnvironmentID)
		if err != nil {
			return nil, err
		}
		attached, err := d.cfg.Envs.AttachTx(ctx, tx, p.EnvironmentID, p.SessionID)
		if err != nil {
			return nil, err
		}
		c.OwnerEpoch = epoch
		c.Reason = fmt.Sprintf("worker of %s owns the session (owner epoch %d)", p.EnvironmentID, epoch)
		return func() {
			d.cfg.Sessions.Notify(sessions.ChangeSessionUpdated, p.SessionID)
			attached()
		}, nil
	}}, nil
}

// unbind returns the session of a transition to the gateway inside its transaction, fencing the
// worker. When why is not "" (a pull-back's drain), the new owner epoch goes into the change and
// into its reason (why formats it).
func (d *Dispatcher) unbind(sessionID, why string) func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
	return func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
		epoch, err := d.cfg.Sessions.BindTx(ctx, tx, sessionID, "")
		if err != nil {
			return nil, err
		}
		if why != "" {
			c.OwnerEpoch, c.Reason = epoch, fmt.Sprintf(why, epoch)
		}
		return func() { d.cfg.Sessions.Notify(sessions.ChangeSessionUpdated, sessionID) }, nil
	}
}

// drain passes barrier steps 2–6: wait for the active run to end (new turns are refused while the
// placement is not active), then advance the owner epoch so the worker is fenced.
func (d *Dispatcher) drain(ctx context.Context, p Placement) (Change, error) {
	for d.cfg.Busy != nil && d.cfg.Busy(p.SessionID) {
		if err := d.poll(ctx); err != nil {
			return Change{}, err
		}
	}
	step := 6
	return Change{To: Reconciling, BarrierStep: &step, Also: d.unbind(p.SessionID, "drained; worker fenced (owner epoch %d)")}, nil
}

// reconcile is barrier step 7: bring the worker's results into the anchor, conflict-aware.
// Divergence stops with an error and changes nothing.
func (d *Dispatcher) reconcile(ctx context.Context, p Placement) (Change, error) {
	e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return Change{}, err
	}
	summary, _, err := d.inbound(ctx, p, e, d.takeForce(p.SessionID))
	if err != nil {
		return Change{}, err
	}
	// barrier step 8: the gateway owns the session again, on the anchor holding the results
	if err := d.cfg.Sessions.SetWorkspace(ctx, p.SessionID, p.AnchorDir); err != nil {
		return Change{}, err
	}
	if err := d.cfg.Envs.Detach(ctx, e.ID, p.SessionID); err != nil {
		d.log.Warn("detach environment", "env", e.ID, "err", err)
	}
	step := 8
	return Change{To: Local, Reason: "pulled back: " + summary, BarrierStep: &step}, nil
}

// inbound brings the box's workspace into the anchor (git: adopt the worker's commits, then
// mirror untracked work; plain: mirror against the base) and returns the anchor's new manifest.
//
// force lets the mirror delete past the deletion brake (a pull-back the operator confirmed; never
// a checkpoint).
func (d *Dispatcher) inbound(ctx context.Context, p Placement, e envs.Environment, force bool) (string, *manifest.Manifest, error) {
	ctx, cancel, wrap := withStepDeadline(ctx, &StepTimeoutError{Step: "reconcile", Setting: "box.reconcileTimeout", Timeout: d.cfg.ReconcileTimeout})
	defer cancel()
	summary, m, err := d.inboundStep(ctx, p, e, force)
	return summary, m, wrap(err)
}

func (d *Dispatcher) inboundStep(ctx context.Context, p Placement, e envs.Environment, force bool) (string, *manifest.Manifest, error) {
	var err error
	base, err := readManifest(p.BaseManifestID)
	if err != nil {
		return "", nil, fmt.Errorf("base manifest: %w", err)
	}
	r, c, err := d.remote(ctx, e)
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	mode := manifest.Mode(p.SyncMode)
	summary := ""
	if mode == manifest.ModeGit {
		sess, err := d.cfg.Sessions.Get(ctx, p.SessionID)
		if err != nil {
			return "", nil, err
		}
		a, err := gitAnchor(ctx, sess.Workspace, d.cfg.DataDir, p.SessionID, base.BaseCommit)
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
			tip, err := a.Adopt(ctx, anchorName(p.SessionID), bundle)
			if err != nil {
				return "", nil, err
			}
			summary = "managed branch " + a.Branch + " fast-forwarded to " + tip[:min(12, len(tip))]
		} else {
			summary = "no new commits"
		}
		// untracked and uncommitted work comes back against the fast-forwarded anchor
		base, err = a.Manifest(ctx, manifest.Options{Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include})
		if err != nil {
			return "", nil, err
		}
	}
	// What the box sends back is bounded by the profile's inbound quotas, and may not fill the
	// anchor's filesystem or the data directory's (gateway.db) past the reserve.
	lim, mlim := stream.InboundLimits(e.Profile.Sync.MaxInboundBytes, e.Profile.Sync.MaxInboundEntries, e.Profile.Sync.MaxInboundFileBytes)
	r.ManifestLimits = mlim
	boxM, err := r.Manifest(ctx, p.BoxWorkspace, boxManifestOptions(e, mode, p.SessionID))
	if err != nil {
		return "", nil, fmt.Errorf("box manifest: %w", err)
	}
	res, err := mirror.Pull(ctx, mirror.Config{Anchor: p.AnchorDir, Base: base, Box: boxM, Mode: mode,
		Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include, Force: force, MaxDeleteShare: e.Profile.Sync.MaxDeleteShare,
		Limits: lim, Space: &stream.SpaceCheck{Keep: []string{d.cfg.DataDir}, ReserveBytes: d.cfg.ReserveFreeBytes, ReservePercent: d.cfg.ReserveFreePercent},
		Fetch: func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error) {
			return r.Pack(ctx, p.BoxWorkspace, plan, root, opts)
		}})
	if err != nil {
		return "", nil, fmt.Errorf("reconcile workspace: %w", err)
	}
	if summary != "" {
		summary += "; "
	}
	summary += fmt.Sprintf("%d files updated, %d deleted", len(res.Plan.Entries), len(res.Plan.Deletes))
	now, _, err := manifest.Build(ctx, p.AnchorDir, manifest.Options{Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include})
	if err != nil {
		return "", nil, err
	}
	if mode == manifest.ModeGit {
		if head, herr := exec.CommandContext(ctx, "git", "-C", p.AnchorDir, "rev-parse", "HEAD").Output(); herr == nil {
			now.BaseCommit = strings.TrimSpace(string(head))
		}
	}
	return summary, now, nil
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

// copyTree copies a plain workspace into the anchor through the same checked archive path.
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

// copyTree copies the workspace src into the new anchor dst and returns what it left out
// (manifest.Stats.Skipped).
func copyTree(ctx context.Context, src, dst string, excl, incl []string) ([]string, error) {
	m, st, err := manifest.Build(ctx, src, manifest.Options{Mode: manifest.ModePlain, Exclude: excl, Include: incl})
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

// pollInterval is how often the dispatcher looks again at a fact it waits for.
const pollInterval = 100 * time.Millisecond

// poll waits pollInterval on the dispatcher's clock, or until ctx ends.
func (d *Dispatcher) poll(ctx context.Context) error {
	return clock.Sleep(ctx, d.cfg.Clock, pollInterval)
}

// CheckSync proves the sync path of an environment: a small tree is sent to a scratch directory
// on the box through `openclaw worker unpack`, read back with the box's manifest, compared, and
// removed. It is what `openclaw doctor` reports as its sync step.
func (d *Dispatcher) CheckSync(ctx context.Context, envID string) (string, error) {
	e, err := d.cfg.Envs.Get(ctx, envID)
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
	r, c, err := d.remote(ctx, e)
	if err != nil {
		return "", err
	}
	defer c.Close()
	dir := filepath.Join(e.WorkerHome, ".openclaw-worker", "synccheck")
	defer bootstrap.RunOK(context.WithoutCancel(ctx), c, "remove sync check", "rm -rf "+bootstrap.Quote(dir))
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
func (d *Dispatcher) BoxManifest(ctx context.Context, envID, dir string, mode manifest.Mode) (BoxTree, error) {
	e, err := d.cfg.Envs.Get(ctx, envID)
	if err != nil {
		return BoxTree{}, err
	}
	if e.WorkerHome == "" || e.BundleHash == "" {
		return BoxTree{}, fmt.Errorf("environment %s has no worker installed (state %s)", envID, e.State)
	}
	t := BoxTree{Environment: envID, Dir: dir, Mode: mode, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include}
	if dir == "" {
		served, err := d.cfg.Placements.ServedBy(ctx, envID)
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
			t.Dir = boxWorkspace(e, t.Session)
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
	r, c, err := d.remote(ctx, e)
	if err != nil {
		return BoxTree{}, err
	}
	defer c.Close()
	mo := stream.ManifestOptions{Mode: t.Mode, Exclude: t.Exclude, Include: t.Include}
	if t.Session != "" {
		mo = boxManifestOptions(e, t.Mode, t.Session)
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
