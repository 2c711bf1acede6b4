package placement

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/secretscan"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// AuditSecretRefused is the audit kind of an adoption the secret scan stopped.
const AuditSecretRefused = "sync.secret.refused"

// DefaultMaxAllowedSecrets bounds the secret scan's false positives let through for one session
// (sync.maxAllowedSecrets).
const DefaultMaxAllowedSecrets = 100

// secretScan is one inbound reconciliation's scan: the scanner and where a refusal is audited.
type secretScan struct {
	d         *Dispatcher
	sc        *secretscan.Scanner
	sessionID string
	envID     string
}

// scanner builds the scan of a session's inbound work: the credential values the gateway holds
// and the patterns, with the false positives the operator allowed for this session.
func (d *Dispatcher) scanner(ctx context.Context, sessionID, envID string) (*secretScan, error) {
	var values map[string]string
	if d.cfg.Secrets != nil {
		var err error
		if values, err = d.cfg.Secrets(ctx); err != nil {
			return nil, fmt.Errorf("secret scan: read the gateway's credentials: %w", err)
		}
	}
	d.mu.Lock()
	allow := append([]secretscan.Allow(nil), d.allowed[sessionID]...)
	d.mu.Unlock()
	return &secretScan{d: d, sc: secretscan.New(values, allow), sessionID: sessionID, envID: envID}, nil
}

// commits is the check AdoptChecked runs on the worker's commits.
func (s *secretScan) commits(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
	found, err := gitsync.ScanCommits(ctx, g, head, tip, s.sc)
	if err != nil {
		return fmt.Errorf("secret scan of the worker's commits: %w", err)
	}
	return s.refuse(ctx, found)
}

// files is the mirror's Inspect: the staged files the box sent.
func (s *secretScan) files(ctx context.Context) func(staging string, plan *stream.Plan) error {
	return func(staging string, plan *stream.Plan) error {
		found, err := s.sc.ScanTree(staging, plan.Entries)
		if err != nil {
			return err
		}
		return s.refuse(ctx, found)
	}
}

// refuse audits and returns the findings as a *secretscan.FoundError (nil when there are none):
// paths, lines and rules, never the matched text.
func (s *secretScan) refuse(ctx context.Context, found []secretscan.Finding) error {
	if len(found) == 0 {
		return nil
	}
	err := &secretscan.FoundError{Findings: found}
	parts := make([]string, 0, min(len(found), 20))
	for _, f := range found[:min(len(found), 20)] {
		parts = append(parts, f.String())
	}
	detail := fmt.Sprintf("session %s: %d finding(s): %s", s.sessionID, len(found), strings.Join(parts, ", "))
	if aerr := s.d.cfg.Placements.db.InTx(ctx, func(tx *sql.Tx) error {
		return store.Audit(ctx, tx, clock.Or(s.d.cfg.Placements.Clock).Now(), AuditSecretRefused, s.envID, detail)
	}); aerr != nil {
		s.d.log.Warn("audit a secret scan refusal", "session", s.sessionID, "err", aerr)
	}
	s.d.log.Warn("secret scan stopped an adoption", "session", s.sessionID, "findings", len(found), "first", found[0].String())
	return err
}

// allowSecrets records the false positives (RULE:PATH) the operator lets through for a
// session's pull-backs and checkpoints from now on; every entry is checked first, and a session
// holds at most cfg.MaxAllowedSecrets of them.
func (d *Dispatcher) allowSecrets(ctx context.Context, sessionID string, specs []string) error {
	if len(specs) == 0 {
		return nil
	}
	var allow []secretscan.Allow
	for _, s := range specs {
		a, err := secretscan.ParseAllow(s)
		if err != nil {
			return providers.Fieldf("allowSecrets", "%v", err)
		}
		allow = append(allow, a)
	}
	if _, err := d.cfg.Placements.Get(ctx, sessionID); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.allowed == nil {
		d.allowed = map[string][]secretscan.Allow{}
	}
	have := d.allowed[sessionID]
	for _, a := range allow {
		if !slices.Contains(have, a) {
			have = append(have, a)
		}
	}
	if len(have) > d.cfg.MaxAllowedSecrets {
		return providers.Fieldf("allowSecrets", "a session may let at most %d false positives through (sync.maxAllowedSecrets), this would make %d", d.cfg.MaxAllowedSecrets, len(have))
	}
	d.allowed[sessionID] = have
	return nil
}
