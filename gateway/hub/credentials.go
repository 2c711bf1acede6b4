package hub

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// Credential errors returned by Verify and Refresh.
var (
	// ErrUnknownCredential means the secret matches no credential, or a revoked one.
	ErrUnknownCredential = errors.New("unknown worker credential")
	// ErrCredentialExpired means the credential exists but its expiry has passed.
	ErrCredentialExpired = errors.New("worker credential expired")
)

// secretPrefix marks worker credentials so a leaked one is recognisable (e.g. by secret scanners).
const secretPrefix = "ocw_"

// Credential is a stored worker credential; it never contains the secret.
type Credential struct {
	// ID is the hex sha256 of the secret, safe to log in shortened form (see ShortID).
	ID            string
	EnvironmentID string
	// Lineage is the ID of the minted credential this one descends from by refreshes (its own ID
	// when it was minted).
	Lineage    string
	BundleHash string
	Methods    []string
	ExpiresAt  time.Time
	CreatedAt  time.Time
}

// ShortID is a loggable prefix of the credential's hash.
func (c Credential) ShortID() string { return c.ID[:min(12, len(c.ID))] }

// Allows reports whether the credential grants method; only WorkerMethods can ever be granted.
func (c Credential) Allows(method string) bool {
	return protocol.IsWorkerMethod(method) && slices.Contains(c.Methods, method)
}

// Credentials mints and verifies worker credentials stored (as hashes) in the gateway database.
//
// Refresh policy: Refresh issues a new credential with the same binding and lifetime and leaves the
// old one valid, so a refresh whose answer is lost on a dropped tunnel cannot lock the worker out.
// The first admission with the new credential revokes every older credential of its lineage (the
// minted credential and the refreshes before it). RevokeEnv revokes every credential of an
// environment at once.
type Credentials struct {
	db *store.DB
	// Clock tells the time of minting, expiry and refresh; the real clock when nil.
	Clock clock.Clock
}

// NewCredentials returns the credential store backed by db.
func NewCredentials(db *store.DB) *Credentials { return &Credentials{db: db} }

func (cs *Credentials) now() time.Time { return clock.Or(cs.Clock).Now() }

// hashSecret is the stored form of a secret.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Mint creates a credential for envID bound to bundleHash and methods (nil means every WorkerMethod),
// valid for ttl, and returns its secret. Only the secret's hash is stored.
func (cs *Credentials) Mint(ctx context.Context, envID, bundleHash string, ttl time.Duration, methods []string) (string, error) {
	return cs.mint(ctx, envID, bundleHash, ttl, methods, false)
}

// MintSole is Mint for a worker launched anew: in the same transaction every other credential of
// envID is revoked, so that those of earlier launches (whose workers are gone, and which a box
// could have kept) admit nothing any more.
func (cs *Credentials) MintSole(ctx context.Context, envID, bundleHash string, ttl time.Duration, methods []string) (string, error) {
	return cs.mint(ctx, envID, bundleHash, ttl, methods, true)
}

func (cs *Credentials) mint(ctx context.Context, envID, bundleHash string, ttl time.Duration, methods []string, sole bool) (string, error) {
	if envID == "" || bundleHash == "" {
		return "", errors.New("mint worker credential: environment id and bundle hash are required")
	}
	if ttl <= 0 {
		return "", fmt.Errorf("mint worker credential for %s: ttl must be positive", envID)
	}
	if methods == nil {
		methods = protocol.WorkerMethods()
	}
	for _, m := range methods {
		if !protocol.IsWorkerMethod(m) {
			return "", fmt.Errorf("mint worker credential for %s: %q is not a worker method", envID, m)
		}
	}
	var secret string
	err := cs.db.InTx(ctx, func(tx *sql.Tx) error {
		if sole {
			if err := cs.revokeEnvTx(ctx, tx, envID); err != nil {
				return err
			}
		}
		var err error
		secret, err = mintTx(ctx, tx, envID, bundleHash, "", cs.now(), ttl, methods)
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, cs.now(), "worker.credential.mint", envID,
			fmt.Sprintf("credential %s expires in %s", hashSecret(secret)[:12], ttl))
	})
	if err != nil {
		return "", err
	}
	return secret, nil
}

// mintTx stores a new credential of lineage ("" for a freshly minted one: its own hash).
func mintTx(ctx context.Context, tx *sql.Tx, envID, bundleHash, lineage string, now time.Time, ttl time.Duration, methods []string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("mint worker credential: %w", err)
	}
	secret := secretPrefix + base64.RawURLEncoding.EncodeToString(raw)
	ms, err := json.Marshal(methods)
	if err != nil {
		return "", err
	}
	hash := hashSecret(secret)
	if lineage == "" {
		lineage = hash
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO worker_credentials(hash, environment_id, bundle_hash, methods, expires_at, created_at, lineage)
		VALUES(?,?,?,?,?,?,?)`, hash, envID, bundleHash, string(ms),
		store.FormatTime(now.Add(ttl)), store.FormatTime(now), lineage)
	if err != nil {
		return "", fmt.Errorf("store worker credential for %s: %w", envID, err)
	}
	return secret, nil
}

// Verify returns the credential for secret, or ErrUnknownCredential (also for revoked ones) or
// ErrCredentialExpired (with the credential, so the caller can audit its environment).
func (cs *Credentials) Verify(ctx context.Context, secret string) (Credential, error) {
	if !strings.HasPrefix(secret, secretPrefix) || len(secret) > 256 {
		return Credential{}, ErrUnknownCredential
	}
	return cs.byHash(ctx, cs.db.R, hashSecret(secret))
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (cs *Credentials) byHash(ctx context.Context, q queryer, hash string) (Credential, error) {
	var c Credential
	var methods, expires, created, revoked string
	err := q.QueryRowContext(ctx, `SELECT hash, environment_id, bundle_hash, methods, expires_at, created_at, revoked_at, lineage
		FROM worker_credentials WHERE hash = ?`, hash).Scan(&c.ID, &c.EnvironmentID, &c.BundleHash, &methods, &expires, &created, &revoked, &c.Lineage)
	if errors.Is(err, sql.ErrNoRows) {
		return Credential{}, ErrUnknownCredential
	}
	if err != nil {
		return Credential{}, fmt.Errorf("look up worker credential: %w", err)
	}
	if revoked != "" {
		return Credential{}, ErrUnknownCredential
	}
	if err := json.Unmarshal([]byte(methods), &c.Methods); err != nil {
		return Credential{}, fmt.Errorf("worker credential %s: methods: %w", c.ShortID(), err)
	}
	c.ExpiresAt, c.CreatedAt = store.ParseTime(expires), store.ParseTime(created)
	if c.Lineage == "" {
		c.Lineage = c.ID // minted before lineages were recorded
	}
	if !cs.now().Before(c.ExpiresAt) {
		return c, ErrCredentialExpired
	}
	return c, nil
}

// Refresh verifies old and issues a new credential with the same binding and lifetime. The old
// credential stays valid until its own expiry (see Credentials).
func (cs *Credentials) Refresh(ctx context.Context, old string) (string, error) {
	if !strings.HasPrefix(old, secretPrefix) || len(old) > 256 {
		return "", ErrUnknownCredential
	}
	secret, _, err := cs.refreshHash(ctx, hashSecret(old))
	return secret, err
}

// refreshHash is Refresh by the stored hash, so the hub need not keep a worker's secret in memory.
func (cs *Credentials) refreshHash(ctx context.Context, hash string) (string, Credential, error) {
	var secret string
	var c Credential
	err := cs.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		c, err = cs.byHash(ctx, tx, hash)
		if err != nil {
			return err
		}
		ttl := c.ExpiresAt.Sub(c.CreatedAt)
		now := cs.now()
		secret, err = mintTx(ctx, tx, c.EnvironmentID, c.BundleHash, c.Lineage, now, ttl, c.Methods)
		if err != nil {
			return err
		}
		c = Credential{ID: hashSecret(secret), EnvironmentID: c.EnvironmentID, BundleHash: c.BundleHash, Lineage: c.Lineage,
			Methods: c.Methods, CreatedAt: now, ExpiresAt: now.Add(ttl)}
		return store.Audit(ctx, tx, cs.now(), "worker.credential.refresh", c.EnvironmentID,
			fmt.Sprintf("credential %s replaced by %s", hash[:12], c.ShortID()))
	})
	if err != nil {
		return "", Credential{}, err
	}
	return secret, c, nil
}

// revokeSupersededTx revokes the live credentials of c's lineage stored before c: c is in use, so
// the worker holds it and needs none of those it replaced.
func (cs *Credentials) revokeSupersededTx(ctx context.Context, tx *sql.Tx, c Credential) error {
	res, err := tx.ExecContext(ctx, `UPDATE worker_credentials SET revoked_at = ?
		WHERE (lineage = ? OR hash = ?) AND hash <> ? AND revoked_at = ''
		AND rowid < (SELECT rowid FROM worker_credentials WHERE hash = ?)`,
		store.FormatTime(cs.now()), c.Lineage, c.Lineage, c.ID, c.ID)
	if err != nil {
		return fmt.Errorf("revoke credentials replaced by %s: %w", c.ShortID(), err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		return store.Audit(ctx, tx, cs.now(), "worker.credential.revoke", c.EnvironmentID,
			fmt.Sprintf("%d credentials replaced by %s revoked on its first use", n, c.ShortID()))
	}
	return nil
}

// Prune deletes credentials that expired or were revoked before cutoff and returns how many.
func (cs *Credentials) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	c := store.FormatTime(cutoff)
	return cs.db.DeleteBatched(ctx, `DELETE FROM worker_credentials WHERE rowid IN (SELECT rowid FROM worker_credentials
		WHERE expires_at < ? OR (revoked_at <> '' AND revoked_at < ?) LIMIT ?)`, c, c)
}

// PruneKeys deletes the key bindings of lineages that have no credential left.
func (cs *Credentials) PruneKeys(ctx context.Context) (int64, error) {
	return cs.db.DeleteBatched(ctx, `DELETE FROM worker_keys WHERE rowid IN (SELECT k.rowid FROM worker_keys k
		WHERE NOT EXISTS (SELECT 1 FROM worker_credentials c WHERE c.lineage = k.lineage OR c.hash = k.lineage) LIMIT ?)`)
}

// bindKeyTx binds c's lineage to a worker's public key on its first admission, and refuses any
// other key afterwards (ErrOtherKey).
func (cs *Credentials) bindKeyTx(ctx context.Context, tx *sql.Tx, c Credential, publicKey string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO worker_keys(lineage, public_key, bound_at) VALUES(?,?,?) ON CONFLICT(lineage) DO NOTHING`,
		c.Lineage, publicKey, store.FormatTime(cs.now())); err != nil {
		return fmt.Errorf("bind worker key: %w", err)
	}
	var bound string
	if err := tx.QueryRowContext(ctx, `SELECT public_key FROM worker_keys WHERE lineage = ?`, c.Lineage).Scan(&bound); err != nil {
		return fmt.Errorf("read worker key: %w", err)
	}
	if bound != publicKey {
		return ErrOtherKey
	}
	return nil
}

// ErrOtherKey refuses an admission whose credential's lineage is bound to another worker key.
var ErrOtherKey = errors.New("the credential is bound to another worker key")

// RevokeEnv revokes every credential of envID and returns how many were live.
func (cs *Credentials) RevokeEnv(ctx context.Context, envID string) (int, error) {
	var n int64
	err := cs.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		n, err = cs.revokeTx(ctx, tx, envID)
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, cs.now(), "worker.credential.revoke", envID, fmt.Sprintf("%d credentials revoked", n))
	})
	return int(n), err
}

// revokeEnvTx revokes every live credential of envID in tx, audited when there was one.
func (cs *Credentials) revokeEnvTx(ctx context.Context, tx *sql.Tx, envID string) error {
	n, err := cs.revokeTx(ctx, tx, envID)
	if err != nil || n == 0 {
		return err
	}
	return store.Audit(ctx, tx, cs.now(), "worker.credential.revoke", envID, fmt.Sprintf("%d credentials of earlier launches revoked", n))
}

func (cs *Credentials) revokeTx(ctx context.Context, tx *sql.Tx, envID string) (int64, error) {
	res, err := tx.ExecContext(ctx, `UPDATE worker_credentials SET revoked_at = ? WHERE environment_id = ? AND revoked_at = ''`,
		store.FormatTime(cs.now()), envID)
	if err != nil {
		return 0, fmt.Errorf("revoke worker credentials of %s: %w", envID, err)
	}
	return res.RowsAffected()
}
