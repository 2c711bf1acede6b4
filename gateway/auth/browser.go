package auth

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
)

// Lifetimes and bounds of sign-in codes and browser sessions.
const (
	// CodeLifetime is how long a sign-in code may be used (once).
	CodeLifetime = 2 * time.Minute
	// DefaultSessionIdle ends a browser session that made no request this long (ui.sessionIdle).
	DefaultSessionIdle = 12 * time.Hour
	// DefaultSessionLifetime ends a browser session this long after sign-in, however active
	// (ui.sessionLifetime).
	DefaultSessionLifetime = 7 * 24 * time.Hour
	// MaxLiveCodes bounds the sign-in codes minted and not yet used or expired.
	MaxLiveCodes = 32
	// MaxLiveSessions bounds the live browser sessions; a sign-in past it ends the session idle
	// longest.
	MaxLiveSessions = 64
	// keepEnded is how long an ended session stays listed before it is deleted.
	keepEnded = 24 * time.Hour
	// touchEvery bounds the writes of a session's last request: at most one a minute (one a
	// quarter of the idle lifetime, when that is shorter).
	touchEvery = time.Minute
	// maxUserAgent bounds the user agent a session row keeps.
	maxUserAgent = 200
	// secretBytes is the randomness of a sign-in code and of a session cookie: 256 bits.
	secretBytes = 32
)

// Errors of sign-in.
var (
	// ErrCodeRefused: a sign-in code that is unknown, used or expired.
	ErrCodeRefused = errors.New("sign-in code refused")
	// ErrNoSession: a session cookie that names no live browser session.
	ErrNoSession = errors.New("no browser session")
	// ErrTooManyCodes: MaxLiveCodes codes wait to be used.
	ErrTooManyCodes = errors.New("too many unused sign-in codes")
)

// BrowserConfig configures the Control UI's sign-in.
type BrowserConfig struct {
	DB *store.DB
	// Token is the operator token: sessions signed in under another token are ended at Open
	// and never valid.
	Token string
	// Idle and Lifetime end a session (zero: DefaultSessionIdle, DefaultSessionLifetime).
	Idle, Lifetime time.Duration
	// TrustedProxies are the addresses whose X-Forwarded-Proto: https counts as TLS.
	TrustedProxies []netip.Prefix
	// Refusals logs refused sign-ins and session cookies (nil: not logged).
	Refusals *Refusals
	Clock    clock.Clock
	Log      *slog.Logger
}

// Browser signs the Control UI in: it mints one-time sign-in codes (with the operator token),
// exchanges a code for a browser session and checks session cookies. It is the one writer of
// the signin_codes and browser_sessions tables.
type Browser struct {
	cfg       BrowserConfig
	tokenHash string
}

// Session is a browser session as `openclaw ui sessions` lists it (never its cookie).
type Session struct {
	ID         string    `json:"id"`
	State      string    `json:"state"` // active, signed-out, revoked, idle, expired
	CreatedAt  time.Time `json:"createdAt"`
	LastSeenAt time.Time `json:"lastSeenAt"`
	// IdleExpiresAt is when the session ends without another request; ExpiresAt when it ends
	// regardless.
	IdleExpiresAt time.Time `json:"idleExpiresAt"`
	ExpiresAt     time.Time `json:"expiresAt"`
	Remote        string    `json:"remote,omitempty"`
	UserAgent     string    `json:"userAgent,omitempty"`
	RevokedAt     time.Time `json:"revokedAt,omitzero"`
	RevokedReason string    `json:"revokedReason,omitempty"`
}

// States of a browser session, derived from its row.
const (
	SessionActive  = "active"
	SessionRevoked = "revoked"
	SessionIdle    = "idle"
	SessionExpired = "expired"
)

// Active reports whether the session still signs a browser in.
func (s Session) Active() bool { return s.State == SessionActive }

// Code is a minted sign-in code.
type Code struct {
	Code      string    `json:"code"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// OpenBrowser returns the sign-in of the gateway whose operator token is cfg.Token; sessions
// signed in under another token (a rotated one) are ended.
func OpenBrowser(ctx context.Context, cfg BrowserConfig) (*Browser, error) {
	if cfg.DB == nil || cfg.Token == "" {
		return nil, errors.New("browser sign-in: a database and the operator token are required")
	}
	if cfg.Idle == 0 {
		cfg.Idle = DefaultSessionIdle
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = DefaultSessionLifetime
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	b := &Browser{cfg: cfg, tokenHash: hash("openclaw operator token\x00" + cfg.Token)}
	var ended int64
	err := cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE browser_sessions SET revoked_at = ?, revoked_reason = 'operator token rotated'
			WHERE revoked_at = '' AND token_hash != ?`, b.now(), b.tokenHash)
		if err != nil {
			return err
		}
		ended, _ = res.RowsAffected()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("end browser sessions of a rotated token: %w", err)
	}
	if ended > 0 {
		cfg.Log.Info("browser sessions ended: the operator token changed", "sessions", ended)
	}
	return b, nil
}

func (b *Browser) now() string { return store.FormatTime(b.cfg.Clock.Now()) }

// secret returns a new random secret: 256 bits, base64url without padding.
func secret() string {
	p := make([]byte, secretBytes)
	_, _ = rand.Read(p) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(p)
}

// MintCode returns a new sign-in code, valid once for CodeLifetime. Only its hash is stored.
func (b *Browser) MintCode(ctx context.Context) (Code, error) {
	now := b.cfg.Clock.Now()
	c := Code{Code: secret(), ExpiresAt: now.Add(CodeLifetime)}
	err := b.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM signin_codes WHERE used_at != '' OR expires_at <= ?`, store.FormatTime(now)); err != nil {
			return err
		}
		var live int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM signin_codes`).Scan(&live); err != nil {
			return err
		}
		if live >= MaxLiveCodes {
			return fmt.Errorf("%w: %d wait to be used (each expires %s after it was minted)", ErrTooManyCodes, live, CodeLifetime)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO signin_codes(hash, created_at, expires_at) VALUES(?,?,?)`,
			hash(c.Code), store.FormatTime(now), store.FormatTime(c.ExpiresAt))
		return err
	})
	if err != nil {
		return Code{}, fmt.Errorf("mint sign-in code: %w", err)
	}
	return c, nil
}

// Redeem uses a sign-in code up and starts a browser session: it returns the session and the
// secret its cookie carries. A code that is unknown, used or expired is ErrCodeRefused.
func (b *Browser) Redeem(ctx context.Context, code, remote, userAgent string) (string, Session, error) {
	now := b.cfg.Clock.Now()
	if len(userAgent) > maxUserAgent {
		userAgent = userAgent[:maxUserAgent]
	}
	s := Session{ID: "bs_" + ids.Hex(8), CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(b.cfg.Lifetime),
		Remote: remote, UserAgent: userAgent}
	sec := secret()
	err := b.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		var usedAt, expiresAt string
		err := tx.QueryRowContext(ctx, `SELECT used_at, expires_at FROM signin_codes WHERE hash = ?`, hash(code)).Scan(&usedAt, &expiresAt)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%w: not a code of this gateway (run `openclaw ui` for a new one)", ErrCodeRefused)
		case err != nil:
			return err
		case usedAt != "":
			return fmt.Errorf("%w: already used (a code signs in once; run `openclaw ui` for a new one)", ErrCodeRefused)
		case !now.Before(store.ParseTime(expiresAt)):
			return fmt.Errorf("%w: expired (a code is valid %s; run `openclaw ui` for a new one)", ErrCodeRefused, CodeLifetime)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE signin_codes SET used_at = ? WHERE hash = ?`, store.FormatTime(now), hash(code)); err != nil {
			return err
		}
		if err := b.pruneTx(ctx, tx, now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO browser_sessions(id, secret_hash, token_hash, created_at, last_seen_at, expires_at, remote, user_agent)
			VALUES(?,?,?,?,?,?,?,?)`, s.ID, hash(sec), b.tokenHash, store.FormatTime(now), store.FormatTime(now),
			store.FormatTime(s.ExpiresAt), remote, userAgent)
		return err
	})
	if err != nil {
		return "", Session{}, err
	}
	b.cfg.Log.Info("browser signed in", "session", s.ID, "remote", remote)
	return sec, b.derive(s), nil
}

// pruneTx deletes sessions ended over keepEnded ago and, at MaxLiveSessions live sessions, ends
// the one idle longest, so that the table stays bounded.
func (b *Browser) pruneTx(ctx context.Context, tx *sql.Tx, now time.Time) error {
	old := store.FormatTime(now.Add(-keepEnded))
	if _, err := tx.ExecContext(ctx, `DELETE FROM browser_sessions WHERE (revoked_at != '' AND revoked_at < ?) OR expires_at < ? OR last_seen_at < ?`,
		old, old, store.FormatTime(now.Add(-b.cfg.Idle-keepEnded))); err != nil {
		return err
	}
	live, err := store.Strings(ctx, tx, `SELECT id FROM browser_sessions WHERE revoked_at = '' AND expires_at > ? AND last_seen_at > ?
		ORDER BY last_seen_at ASC`, store.FormatTime(now), store.FormatTime(now.Add(-b.cfg.Idle)))
	if err != nil {
		return err
	}
	for i := 0; len(live)-i >= MaxLiveSessions; i++ {
		if _, err := tx.ExecContext(ctx, `UPDATE browser_sessions SET revoked_at = ?, revoked_reason = ? WHERE id = ?`,
			store.FormatTime(now), fmt.Sprintf("more than %d browser sessions: the one idle longest ends", MaxLiveSessions), live[i]); err != nil {
			return err
		}
	}
	return nil
}

const sessionColumns = `id, created_at, last_seen_at, expires_at, remote, user_agent, revoked_at, revoked_reason`

func scanSession(r store.Scanner) (Session, error) {
	var s Session
	var created, seen, expires, revoked string
	err := r.Scan(&s.ID, &created, &seen, &expires, &s.Remote, &s.UserAgent, &revoked, &s.RevokedReason)
	s.CreatedAt, s.LastSeenAt, s.ExpiresAt, s.RevokedAt = store.ParseTime(created), store.ParseTime(seen), store.ParseTime(expires), store.ParseTime(revoked)
	return s, err
}

// derive sets the session's state and idle deadline from its row and the clock.
func (b *Browser) derive(s Session) Session {
	now := b.cfg.Clock.Now()
	s.IdleExpiresAt = s.LastSeenAt.Add(b.cfg.Idle)
	if s.IdleExpiresAt.After(s.ExpiresAt) {
		s.IdleExpiresAt = s.ExpiresAt
	}
	switch {
	case !s.RevokedAt.IsZero():
		s.State = SessionRevoked
	case !now.Before(s.ExpiresAt):
		s.State = SessionExpired
	case !now.Before(s.LastSeenAt.Add(b.cfg.Idle)):
		s.State = SessionIdle
	default:
		s.State = SessionActive
	}
	return s
}

// Lookup returns the live session whose cookie carries sec, noting the request (at most once a
// minute). A cookie of no live session is ErrNoSession, saying why.
func (b *Browser) Lookup(ctx context.Context, sec string) (Session, error) {
	if sec == "" {
		return Session{}, fmt.Errorf("%w: empty cookie", ErrNoSession)
	}
	var th string
	row := b.cfg.DB.R.QueryRowContext(ctx, `SELECT token_hash, `+sessionColumns+` FROM browser_sessions WHERE secret_hash = ?`, hash(sec))
	var s Session
	var created, seen, expires, revoked string
	err := row.Scan(&th, &s.ID, &created, &seen, &expires, &s.Remote, &s.UserAgent, &revoked, &s.RevokedReason)
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, fmt.Errorf("%w: unknown session cookie", ErrNoSession)
	}
	if err != nil {
		return Session{}, fmt.Errorf("read browser session: %w", err)
	}
	s.CreatedAt, s.LastSeenAt, s.ExpiresAt, s.RevokedAt = store.ParseTime(created), store.ParseTime(seen), store.ParseTime(expires), store.ParseTime(revoked)
	s = b.derive(s)
	if th != b.tokenHash && s.Active() { // a token changed under a running gateway's rows
		s.State, s.RevokedReason = SessionRevoked, "operator token rotated"
	}
	if !s.Active() {
		why := s.State
		if s.RevokedReason != "" {
			why += ": " + s.RevokedReason
		}
		return s, fmt.Errorf("%w: session %s %s", ErrNoSession, s.ID, why)
	}
	now := b.cfg.Clock.Now()
	if now.Sub(s.LastSeenAt) >= min(touchEvery, b.cfg.Idle/4) { // a short idle lifetime is noted more often
		err := b.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE browser_sessions SET last_seen_at = ? WHERE id = ? AND revoked_at = ''`, store.FormatTime(now), s.ID)
			return err
		})
		if err != nil {
			return Session{}, fmt.Errorf("note browser session %s: %w", s.ID, err)
		}
		s.LastSeenAt = now
		s = b.derive(s)
	}
	return s, nil
}

// MaxListed bounds the sessions List returns (newest first); ended ones are deleted a day after
// they end, and MaxLiveSessions bounds the live ones.
const MaxListed = 500

// List returns the browser sessions, newest first: the live ones and those ended in the last day.
func (b *Browser) List(ctx context.Context) ([]Session, error) {
	ss, err := store.Query(ctx, b.cfg.DB.R, scanSession, `SELECT `+sessionColumns+` FROM browser_sessions ORDER BY created_at DESC, id LIMIT ?`, MaxListed)
	if err != nil {
		return nil, fmt.Errorf("list browser sessions: %w", err)
	}
	for i := range ss {
		ss[i] = b.derive(ss[i])
	}
	return ss, nil
}

// Revoke ends a browser session by its id, saying why; a session already ended stays as it
// is. An unknown id is store.ErrNotFound.
func (b *Browser) Revoke(ctx context.Context, id, reason string) (Session, error) {
	return b.revoke(ctx, `id = ?`, id, id, reason)
}

// revokeSecret ends the session whose cookie carries sec.
func (b *Browser) revokeSecret(ctx context.Context, sec, reason string) (Session, error) {
	return b.revoke(ctx, `secret_hash = ?`, hash(sec), "of this cookie", reason)
}

func (b *Browser) revoke(ctx context.Context, where, arg, name, reason string) (Session, error) {
	var s Session
	err := b.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE browser_sessions SET revoked_at = ?, revoked_reason = ? WHERE revoked_at = '' AND `+where,
			b.now(), reason, arg); err != nil {
			return err
		}
		var err error
		s, err = scanSession(tx.QueryRowContext(ctx, `SELECT `+sessionColumns+` FROM browser_sessions WHERE `+where, arg))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("browser session %s: %w", name, store.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return Session{}, err
	}
	b.cfg.Log.Info("browser session ended", "session", s.ID, "reason", reason)
	return b.derive(s), nil
}
