package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/providers"
)

// The prepared pool: for every profile with pool.minReady, the gateway keeps that many machines
// leased, bootstrapped and with their worker admitted, assigned to no session, so that a dispatch
// claims one and only syncs its workspace. A claim is atomic on this gateway (claimWarm); the
// pool refills in the background (RunPool), within PoolCap machines unassigned gateway-wide and
// within the capacity limits and budgets every lease meets. An idle machine of a pooled profile
// is kept from its idle timeout while the profile has no more than pool.maxReady unassigned
// (PoolHolds). Pool machines are ordinary environments (idempotency key pool-<profile>-…): a
// gateway that restarts adopts them, or destroys them on proof, like any other.

// DefaultPoolCap is DispatchConfig.PoolCap's default.
const DefaultPoolCap = 4

// poolKeyPrefix marks the environments leased for a profile's pool.
const poolKeyPrefix = "pool-"

// poolInterval is how often the pool is looked at (and refilled).
const poolInterval = 2 * time.Second

// claimHold bounds how long a claim taken in provision holds its environment before the
// placement's own record (its environment id) does.
const claimHold = time.Minute

// unassigned reports whether e is ready for a session and serves none (a claim of forSession's
// own does not count: a session dispatched again takes the machine it left).
func (d *Dispatcher) unassigned(ctx context.Context, e envs.Environment, forSession string) bool {
	if (e.State != envs.Ready && e.State != envs.Idle) || len(e.AttachedSessionIDs) > 0 || !d.cfg.Admitted(e.ID) {
		return false
	}
	if d.cfg.Reserved != nil && d.cfg.Reserved(e) {
		return false
	}
	if served, err := d.cfg.Placements.ServedBy(ctx, e.ID); err != nil || len(served) > 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c, claimed := d.claims[e.ID]
	return !claimed || (forSession != "" && c.session == forSession) || clock.Or(d.cfg.Clock).Now().Sub(c.at) > claimHold
}

// Unassigned reports whether an environment is ready, serves no session and no dispatch has
// claimed it: it may be released.
func (d *Dispatcher) Unassigned(ctx context.Context, e envs.Environment) bool {
	return d.unassigned(ctx, e, "")
}

// claimedByOther reports whether another session's dispatch has claimed the environment (and its
// placement does not hold it yet).
func (d *Dispatcher) claimedByOther(envID, sessionID string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.claims[envID]
	return ok && c.session != sessionID && clock.Or(d.cfg.Clock).Now().Sub(c.at) <= claimHold
}

// claim is one environment taken by a dispatch in its provision step.
type claim struct {
	session string
	at      time.Time
}

// claimWarm takes an unassigned environment of the profile (and class) whose worker is admitted,
// for sessionID, or returns "" when there is none. Two dispatches never take the same one.
func (d *Dispatcher) claimWarm(ctx context.Context, sessionID, profileID, class string) (string, error) {
	list, err := d.cfg.Envs.List(ctx, false)
	if err != nil {
		return "", err
	}
	for _, e := range list { // in the list's order (newest first), as warm reuse always took them
		if e.ProfileID != profileID || (class != "" && e.Class() != class) || !d.unassigned(ctx, e, sessionID) {
			continue
		}
		d.mu.Lock()
		c, taken := d.claims[e.ID]
		now := clock.Or(d.cfg.Clock).Now()
		if taken && c.session != sessionID && now.Sub(c.at) <= claimHold {
			d.mu.Unlock()
			continue
		}
		if d.claims == nil {
			d.claims = map[string]claim{}
		}
		d.claims[e.ID] = claim{session: sessionID, at: now}
		d.mu.Unlock()
		return e.ID, nil
	}
	return "", nil
}

// PoolHolds reports whether an idle environment is kept from its idle timeout because its
// profile's pool holds it: it is one of the profile's max(minReady, maxReady) oldest unassigned
// machines, within pool.maxUnassigned. The held set is computed once a pool interval, not per
// environment.
func (d *Dispatcher) PoolHolds(ctx context.Context, e envs.Environment) bool {
	now := clock.Or(d.cfg.Clock).Now()
	d.mu.Lock()
	fresh := now.Sub(d.heldAt) < poolInterval
	held := d.held
	d.mu.Unlock()
	if !fresh {
		held = d.holdSet(ctx)
		d.mu.Lock()
		d.held, d.heldAt = held, now
		d.mu.Unlock()
	}
	return held[e.ID]
}

// holdSet is the environments the pools keep from their idle timeout.
func (d *Dispatcher) holdSet(ctx context.Context) map[string]bool {
	held := map[string]bool{}
	profs, err := d.cfg.Envs.Profiles(ctx)
	if err != nil {
		return held
	}
	keep := map[string]int{}
	for _, p := range profs {
		keep[p.ID] = p.Pool.Keep()
	}
	list, err := d.cfg.Envs.List(ctx, false)
	if err != nil {
		return held
	}
	slices.SortStableFunc(list, func(a, b envs.Environment) int { return a.CreatedAt.Compare(b.CreatedAt) }) // the oldest kept
	total := 0
	for _, e := range list {
		if keep[e.ProfileID] > 0 && total < d.poolCap() && d.unassigned(ctx, e, "") {
			held[e.ID] = true
			keep[e.ProfileID]--
			total++
		}
	}
	return held
}

// RunPool keeps the profiles' pools filled until ctx ends.
func (d *Dispatcher) RunPool(ctx context.Context) {
	t := clock.Or(d.cfg.Clock).NewTicker(poolInterval)
	defer t.Stop()
	for {
		if err := d.refillPools(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("refill the prepared pools", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// refillPools leases what each pooled profile lacks: pool.minReady less its unassigned ready
// machines and the pool machines on their way, within PoolCap unassigned machines gateway-wide.
func (d *Dispatcher) refillPools(ctx context.Context) error {
	profs, err := d.cfg.Envs.Profiles(ctx)
	if err != nil {
		return err
	}
	list, err := d.cfg.Envs.List(ctx, false)
	if err != nil {
		return err
	}
	have := map[string]int{}
	unassigned := 0
	now := clock.Or(d.cfg.Clock).Now()
	for _, e := range list {
		pool := strings.HasPrefix(e.IdempotencyKey, poolKeyPrefix)
		switch {
		case d.unassigned(ctx, e, ""):
			have[e.ProfileID]++
			unassigned++
			if pool {
				d.poolOK(e.ProfileID)
			}
		case pool && (e.State == envs.Requested || e.State == envs.Provisioning || e.State == envs.Bootstrapping ||
			((e.State == envs.Ready || e.State == envs.Idle) && len(e.AttachedSessionIDs) == 0 && !d.cfg.Admitted(e.ID))):
			have[e.ProfileID]++ // on its way to the pool (a worker not admitted yet included)
			unassigned++
		case pool && (e.State == envs.Failed || e.State == envs.Orphaned):
			d.poolFailed(e.ID, e.ProfileID, now)
		}
	}
	for _, p := range profs {
		if wait := d.poolWait(p.ID, now); wait > 0 {
			continue // its pool machines fail: leased again only after the backoff
		}
		for have[p.ID] < p.Pool.MinReady && unassigned < d.poolCap() {
			if err := d.lease(ctx, p); err != nil {
				var spent *spend.ExceededError
				if errors.As(err, &spent) {
					break // a spent budget holds the pool as it holds every lease; not an error to log each round
				}
				return fmt.Errorf("pool of profile %s: %w", p.ID, err)
			}
			have[p.ID]++
			unassigned++
		}
	}
	return nil
}

func (d *Dispatcher) lease(ctx context.Context, p providers.Profile) error {
	e, _, err := d.cfg.Envs.Create(ctx, p.ID, poolKeyPrefix+p.ID+"-"+ids.New("", 6))
	if err != nil {
		return err
	}
	d.log.Info("prepared pool: leasing", "profile", p.ID, "env", e.ID)
	return nil
}

func (d *Dispatcher) poolCap() int {
	if d.cfg.PoolCap == nil {
		return DefaultPoolCap
	}
	return *d.cfg.PoolCap
}

// poolBackoff is one profile's pause after its pool machines failed: 10 s doubled per failure, at
// most 30 minutes, reset once a pool machine of it is ready.
type poolBackoff struct {
	failures int
	until    time.Time
	seen     map[string]bool // failed pool machines counted
}

func (d *Dispatcher) poolFailed(envID, profileID string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.backoff == nil {
		d.backoff = map[string]*poolBackoff{}
	}
	b := d.backoff[profileID]
	if b == nil {
		b = &poolBackoff{seen: map[string]bool{}}
		d.backoff[profileID] = b
	}
	if b.seen[envID] {
		return
	}
	b.seen[envID] = true
	b.failures++
	b.until = now.Add(min(10*time.Second<<min(b.failures-1, 10), 30*time.Minute))
	d.log.Warn("prepared pool: a pool machine failed; leasing again after a pause", "profile", profileID, "env", envID, "failures", b.failures, "until", b.until)
}

func (d *Dispatcher) poolOK(profileID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.backoff, profileID)
}

func (d *Dispatcher) poolWait(profileID string, now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.backoff[profileID]; b != nil && now.Before(b.until) {
		return b.until.Sub(now)
	}
	return 0
}
