package envs

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// Step kinds of an environment's timeline.
const (
	StepProvision    = "provision"
	StepBootstrap    = "bootstrap"
	StepSetup        = "setup"
	StepCloseNetwork = "closeNetwork"
)

// Step results.
const (
	ResultOK      = "ok"
	ResultFailed  = "failed"
	ResultWarn    = "warn"
	ResultSkipped = "skipped (cache)"
)

// MaxOutputTail bounds the output tail a timeline entry keeps.
const MaxOutputTail = 4 << 10

// Step is one timeline entry: a provisioning attempt, a bootstrap step or a setup step.
type Step struct {
	Kind       string    `json:"kind"`
	Name       string    `json:"name"`
	StartedAt  time.Time `json:"startedAt"`
	DurationMs int64     `json:"durationMs"`
	Result     string    `json:"result"`
	ExitCode   int       `json:"exitCode,omitempty"`
	// Output is the tail of what the step printed (stdout and stderr), control characters stripped.
	Output string `json:"output,omitempty"`
	// Detail says what the step did or why it failed, in one line.
	Detail string `json:"detail,omitempty"`
}

// Summary is the step as one line: "setup deps: failed (exit 2, 1.2s): detail".
func (s Step) Summary() string {
	b := fmt.Sprintf("%s %s: %s", s.Kind, s.Name, s.Result)
	var paren []string
	if s.Result == ResultFailed && s.ExitCode != 0 {
		paren = append(paren, fmt.Sprintf("exit %d", s.ExitCode))
	}
	if s.Result != ResultSkipped {
		paren = append(paren, (time.Duration(s.DurationMs) * time.Millisecond).String())
	}
	if len(paren) > 0 {
		b += " (" + strings.Join(paren, ", ") + ")"
	}
	if s.Detail != "" {
		b += ": " + s.Detail
	}
	return b
}

// RecordStep records a timeline entry as an event of the environment (its state does not change).
// Output is stripped of control characters and cut to its last MaxOutputTail bytes.
func (m *Manager) RecordStep(ctx context.Context, id string, s Step) {
	s.Output = SanitizeOutput(s.Output, MaxOutputTail)
	s.Detail = Sanitize(s.Detail)
	s.Name = Sanitize(s.Name)
	err := m.db.InTx(ctx, func(tx *sql.Tx) error {
		var st string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM environments WHERE id=?`, id).Scan(&st); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO environment_events(environment_id, at, from_state, to_state, reason,
			step, step_kind, started_at, duration_ms, result, exit_code, output) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)`,
			id, store.FormatTime(m.cfg.Clock.Now()), st, st, Sanitize(s.Summary()), s.Name, s.Kind, store.FormatTime(s.StartedAt),
			s.DurationMs, s.Result, s.ExitCode, s.Output)
		return err
	})
	if err != nil {
		m.log.Warn("record step", "env", id, "step", s.Name, "err", err)
		return
	}
	m.log.Info("environment step", "env", id, "kind", s.Kind, "step", s.Name, "result", s.Result, "ms", s.DurationMs)
	m.notify()
}

// Timeline returns the environment's timeline (its provisioning attempts, bootstrap and setup
// steps), oldest first.
func (m *Manager) Timeline(ctx context.Context, id string) ([]Step, error) {
	evs, err := m.Events(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []Step{}
	for _, ev := range evs {
		if ev.Step != nil {
			out = append(out, *ev.Step)
		}
	}
	return out, nil
}

// SanitizeOutput makes command output safe to store and show: invalid UTF-8 replaced, terminal
// escape sequences and control characters other than newline and tab removed, carriage returns
// turned into newlines, and only the last max bytes kept (on a rune boundary).
func SanitizeOutput(s string, max int) string { return untrusted.Output(s, max) }

// SetSetupKey records the cache key of a setup phase that succeeded on the environment's box.
func (m *Manager) SetSetupKey(ctx context.Context, id, key string) error {
	_, err := m.db.W.ExecContext(ctx, `UPDATE environments SET setup_key=?, updated_at=? WHERE id=?`, key, store.FormatTime(m.cfg.Clock.Now()), id)
	return err
}

// Fail moves a live environment to failed with reason and starts releasing its lease. Setup
// uses it when a step fails: the box is not fit to serve a session.
func (m *Manager) Fail(ctx context.Context, id, reason string) {
	m.fail(ctx, id, reason)
	if e, err := getEnv(ctx, m.db.R, id); err == nil && e.State == Failed {
		if _, err := m.RequestDestroy(ctx, id, false); err != nil {
			m.log.Warn("release failed environment", "env", id, "err", err)
		}
	}
}

// attachStep puts a timeline entry on the environment's newest event (the transition just
// written in tx), so that a step that changes the state is one event.
func attachStep(ctx context.Context, tx *sql.Tx, id string, s *Step) error {
	if s == nil {
		return nil
	}
	_, err := tx.ExecContext(ctx, `UPDATE environment_events SET step=?, step_kind=?, started_at=?, duration_ms=?, result=?, exit_code=?,
		output=? WHERE id=(SELECT MAX(id) FROM environment_events WHERE environment_id=?)`,
		Sanitize(s.Name), s.Kind, store.FormatTime(s.StartedAt), s.DurationMs, s.Result, s.ExitCode, SanitizeOutput(s.Output, MaxOutputTail), id)
	return err
}
