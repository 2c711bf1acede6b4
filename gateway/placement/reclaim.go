package placement

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/sync/checkpoint"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// checkpointRun is the pseudo run id a checkpoint claims the session with, so no turn runs while
// the box's workspace is read.
const checkpointRun = "checkpoint"

// Checkpoint brings the worker's current workspace into the anchor (turn-based cadence: after every
// worker turn) and records it as the new base and as a named checkpoint (git: a commit on
// refs/openclaw/checkpoints/<session>/<n>; plain: a manifest snapshot with content-addressed
// blobs). A reclaimed session is restored from the last one.
func (d *Dispatcher) Checkpoint(ctx context.Context, sessionID string) error {
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil || p.State != Active {
		return err
	}
	if err := d.cfg.Placements.ClaimTurn(ctx, sessionID, p.Generation, true, checkpointRun); err != nil {
		return fmt.Errorf("checkpoint skipped: %w", err)
	}
	defer d.cfg.Placements.ReleaseTurn(context.WithoutCancel(ctx), sessionID, checkpointRun)
	// Read again under the claim: a checkpoint that held it meanwhile moved the base.
	gen := p.Generation
	if p, err = d.cfg.Placements.Get(ctx, sessionID); err != nil {
		return err
	}
	if p.Generation != gen || p.State != Active {
		return fmt.Errorf("checkpoint skipped: session %s moved to %s (generation %d): %w", sessionID, p.State, p.Generation, ErrStale)
	}
	e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return err
	}
	summary, now, err := d.inbound(ctx, p, e, false)
	if err != nil {
		d.cfg.Placements.Note(ctx, sessionID, "checkpoint failed: "+err.Error())
		return err
	}
	// From here the anchor holds the box's work: its new base is written first and recorded even
	// when the named checkpoint cannot be made (and when the gateway is stopping), or the next
	// checkpoint and the pull-back would take that work for drift from the old base.
	keep := context.WithoutCancel(ctx)
	baseFile := filepath.Join(filepath.Dir(p.BaseManifestID), fmt.Sprintf("base-%d-in%d.json", p.Generation, time.Now().UnixNano()))
	unrecorded := func(err error) error {
		d.cfg.Placements.Note(keep, sessionID, "checkpoint failed: record the anchor's base: "+err.Error()+
			" (the anchor holds work its recorded base does not describe: a pull-back will stop on it as drift)")
		return err
	}
	if err := writeManifest(baseFile, now); err != nil {
		return unrecorded(err)
	}
	cs, cerr := checkpoint.New(checkpoint.Config{Mode: manifest.Mode(p.SyncMode), Anchor: p.AnchorDir, Session: anchorName(sessionID),
		DataDir: d.cfg.DataDir, Exclude: e.Profile.Sync.Exclude, Include: e.Profile.Sync.Include, Keep: cmp.Or(e.Profile.Checkpoint.Keep, d.cfg.CheckpointKeep)})
	var cp checkpoint.Checkpoint
	if cerr == nil {
		cp, _, cerr = cs.Create(ctx)
	}
	reason := fmt.Sprintf("checkpoint %d: %s", cp.Seq, summary)
	if cerr != nil {
		reason = fmt.Sprintf("checkpoint failed: %v (%s: %s)", cerr, anchorSaved, summary)
	}
	if err := d.cfg.Placements.RecordBase(keep, sessionID, checkpointRun, p.Generation, baseFile, reason); err != nil {
		_ = os.Remove(baseFile)
		return unrecorded(err)
	}
	// Retention: the session's newest checkpoints stay (sync.checkpointKeep), and only the base
	// manifest just recorded (earlier ones are no longer read: the placement names this one).
	if cerr == nil {
		if removed, err := cs.Prune(ctx); err != nil {
			d.cfg.Placements.Note(ctx, sessionID, "checkpoint pruning failed: "+err.Error())
		} else if len(removed) > 0 {
			d.log.Debug("pruned checkpoints", "session", sessionID, "removed", len(removed), "oldest kept", removed[len(removed)-1].Seq+1)
		}
	}
	removeOldBases(baseFile, p.Generation)
	return cerr
}

// anchorSaved marks the event of a checkpoint whose named checkpoint could not be made but whose
// base was recorded: the anchor holds the worker's workspace as of that turn all the same.
const anchorSaved = "the anchor holds the worker's workspace as of this turn"

// baseName matches the base manifests dispatch and checkpoints write: base-<generation>.json,
// base-<generation>-in<unix ns>.json, and base-<generation>-cp<n>.json of earlier versions.
var baseName = regexp.MustCompile(`^base-([0-9]+)(-(cp|in)[0-9]+)?\.json$`)

// removeOldBases removes the base manifests next to keep, other than keep, of generation gen or
// earlier: the placement names keep, and never again an earlier one. Those of a later generation
// (a reclaim and a new dispatch can overtake a slow checkpoint) are left alone.
func removeOldBases(keep string, gen uint64) {
	des, _ := os.ReadDir(filepath.Dir(keep))
	for _, de := range des {
		m := baseName.FindStringSubmatch(de.Name())
		if m == nil {
			continue
		}
		g, err := strconv.ParseUint(m[1], 10, 64)
		if f := filepath.Join(filepath.Dir(keep), de.Name()); err == nil && g <= gen && f != keep {
			_ = os.Remove(f)
		}
	}
}

// reclaimLoop watches active placements and reclaims those whose machine or worker is lost.
func (d *Dispatcher) reclaimLoop(interval, grace time.Duration) {
	defer d.wg.Done()
	away := map[string]time.Time{} // session → when its worker was first seen unreachable
	t := clock.Or(d.cfg.Clock).NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C():
		}
		list, err := d.cfg.Placements.query(d.ctx, `WHERE state=?`, string(Active))
		if err != nil {
			continue
		}
		for _, p := range list {
			e, err := d.cfg.Envs.Get(d.ctx, p.EnvironmentID)
			lost := ""
			switch {
			case errors.Is(err, store.ErrNotFound):
				lost = "its environment no longer exists"
			case err != nil:
				continue
			case e.State.Dead() || e.State == envs.Destroying || e.State == envs.Draining:
				lost = fmt.Sprintf("environment %s is %s", e.ID, e.State)
				if e.Error != "" {
					lost += " (" + e.Error + ")"
				}
			case !d.cfg.Admitted(e.ID):
				// the worker is away: ask the provider whether the machine is still there
				if e2, err := d.cfg.Envs.Recheck(d.ctx, e.ID); err == nil && e2.State.Dead() {
					lost = fmt.Sprintf("environment %s is %s (%s)", e2.ID, e2.State, e2.Error)
					break
				}
				if since, ok := away[p.SessionID]; !ok {
					away[p.SessionID] = time.Now()
				} else if time.Since(since) > grace {
					lost = fmt.Sprintf("its worker has been unreachable for %s", time.Since(since).Round(time.Second))
				}
			default:
				delete(away, p.SessionID)
			}
			if lost != "" {
				delete(away, p.SessionID)
				if err := d.reclaim(d.ctx, p, e, lost); err != nil {
					d.log.Warn("reclaim", "session", p.SessionID, "err", err)
				}
			}
		}
	}
}

// reclaim moves a session whose worker is lost to reclaimed: the worker is fenced, the session row
// and its transcript stay, and the session says which workspace changes were lost.
func (d *Dispatcher) reclaim(ctx context.Context, p Placement, e envs.Environment, why string) error {
	cp := d.cfg.Placements.LastCheckpoint(ctx, p.SessionID)
	lost := "workspace changes since it was dispatched were lost"
	if cp != "" {
		lost = "workspace changes after " + cp + " were lost"
	}
	reason := "worker lost: " + why + "; " + lost + "; the next message restores the workspace on a fresh worker"
	// the worker is fenced in the transaction that records the reclaim
	if _, err := d.cfg.Placements.Transition(ctx, p.SessionID, p.Generation, Change{To: Reclaimed, Reason: reason, Error: reason,
		Also: d.unbind(p.SessionID, "")}); err != nil {
		return err
	}
	data, _ := json.Marshal(map[string]string{"event": "reclaimed", "environmentId": p.EnvironmentID, "reason": reason})
	if _, err := d.cfg.Sessions.AppendCustom(ctx, p.SessionID, sessions.Custom{CustomType: "openclaw.placement", Data: data}); err != nil {
		d.log.Warn("note reclaim in transcript", "session", p.SessionID, "err", err)
	}
	if e.ID != "" && !e.State.Dead() && e.State != envs.Destroying {
		if _, err := d.cfg.Envs.RequestDestroy(ctx, e.ID, true); err != nil {
			d.log.Warn("destroy unreachable worker's environment", "env", e.ID, "err", err)
		}
	}
	d.log.Warn("session reclaimed", "session", p.SessionID, "reason", reason)
	return nil
}

// Redispatch brings a reclaimed session back onto a fresh worker of the same profile; its anchor
// (as of the last checkpoint) is what is synced out.
func (d *Dispatcher) Redispatch(ctx context.Context, sessionID string) error {
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return err
	}
	if p.State != Reclaimed {
		return fmt.Errorf("session %s is %s, not reclaimed", sessionID, p.State)
	}
	empty, zero := "", 0
	if _, err := d.cfg.Placements.Transition(ctx, sessionID, p.Generation, Change{To: Requested,
		Reason: "restoring on a fresh worker of profile " + p.ProfileID, EnvironmentID: &empty, BarrierStep: &zero, Idle: true}); err != nil {
		return err
	}
	d.kick(sessionID)
	return nil
}
