package openclaw

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/ids"
)

// MaxDevices bounds the devices remembered (live and revoked); past it the device seen longest
// ago is forgotten.
const MaxDevices = 1024

// DeviceTokenPrefix starts every device token.
const DeviceTokenPrefix = "ocdev_"

// Device is a client device of OpenClaw's, as `openclaw devices list` shows it.
type Device struct {
	ID         string    `json:"id"`
	ClientID   string    `json:"clientId"`
	ClientMode string    `json:"clientMode"`
	Platform   string    `json:"platform,omitempty"`
	Scopes     []string  `json:"scopes"`
	CreatedAt  time.Time `json:"createdAt"`
	LastSeenAt time.Time `json:"lastSeenAt"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
}

// Devices is the table of devices (openclaw_devices; this package writes it alone).
type Devices struct {
	db  *store.DB
	now func() time.Time
}

// NewDevices returns the device table of db.
func NewDevices(db *store.DB, now func() time.Time) *Devices {
	if now == nil {
		now = time.Now
	}
	return &Devices{db: db, now: now}
}

func hashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// Issue records a verified device and returns a new token for it (the previous one stops
// working): the client keeps it to connect as this device without the operator token.
func (d *Devices) Issue(ctx context.Context, dev *device, cl client, scopes []string) (string, error) {
	tok := DeviceTokenPrefix + ids.Hex(32)
	now := store.FormatTime(d.now())
	err := d.db.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO openclaw_devices(id, public_key, client_id, client_mode, platform, scopes, token_hash, created_at, last_seen_at)
			VALUES(?,?,?,?,?,?,?,?,?)
			ON CONFLICT(id) DO UPDATE SET public_key=excluded.public_key, client_id=excluded.client_id, client_mode=excluded.client_mode,
				platform=excluded.platform, scopes=excluded.scopes, token_hash=excluded.token_hash, last_seen_at=excluded.last_seen_at, revoked_at=''`,
			strings.ToLower(dev.ID), dev.PublicKey, truncate(cl.ID, 128), truncate(cl.Mode, 64), truncate(cl.Platform, 64),
			strings.Join(scopes, ","), hashToken(tok), now, now)
		if err != nil {
			return err
		}
		// bounded: forget the devices seen longest ago
		_, err = tx.ExecContext(ctx, `DELETE FROM openclaw_devices WHERE id IN (SELECT id FROM openclaw_devices ORDER BY last_seen_at DESC LIMIT -1 OFFSET ?)`, MaxDevices)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("issue device token: %w", err)
	}
	return tok, nil
}

// errDeviceToken is a device token that names no live device, or another device.
var errDeviceToken = errors.New("device token mismatch")

// Check authenticates a device token for the device id the connection proved it holds: it
// returns the scopes the token was issued for.
func (d *Devices) Check(ctx context.Context, tok, deviceID string) ([]string, error) {
	if !strings.HasPrefix(tok, DeviceTokenPrefix) || deviceID == "" {
		return nil, errDeviceToken
	}
	var hash, scopes, revoked string
	err := d.db.R.QueryRowContext(ctx, `SELECT token_hash, scopes, revoked_at FROM openclaw_devices WHERE id=?`, strings.ToLower(deviceID)).
		Scan(&hash, &scopes, &revoked)
	if err != nil || revoked != "" || subtle.ConstantTimeCompare([]byte(hash), []byte(hashToken(tok))) != 1 {
		return nil, errDeviceToken
	}
	_, _ = d.db.W.ExecContext(ctx, `UPDATE openclaw_devices SET last_seen_at=? WHERE id=?`, store.FormatTime(d.now()), strings.ToLower(deviceID))
	if scopes == "" {
		return nil, nil
	}
	return strings.Split(scopes, ","), nil
}

// List returns the devices, seen most recently first.
func (d *Devices) List(ctx context.Context) ([]Device, error) {
	return store.Query(ctx, d.db.R, func(r store.Scanner) (Device, error) {
		var dv Device
		var scopes, created, seen, revoked string
		if err := r.Scan(&dv.ID, &dv.ClientID, &dv.ClientMode, &dv.Platform, &scopes, &created, &seen, &revoked); err != nil {
			return dv, err
		}
		dv.Scopes = []string{}
		if scopes != "" {
			dv.Scopes = strings.Split(scopes, ",")
		}
		dv.CreatedAt, dv.LastSeenAt = store.ParseTime(created), store.ParseTime(seen)
		if revoked != "" {
			dv.RevokedAt = store.ParseTime(revoked)
		}
		return dv, nil
	}, `SELECT id, client_id, client_mode, platform, scopes, created_at, last_seen_at, revoked_at FROM openclaw_devices ORDER BY last_seen_at DESC, id`)
}

// Revoke ends a device's token at once; the error wraps store.ErrNotFound for an unknown id.
func (d *Devices) Revoke(ctx context.Context, id string) (Device, error) {
	res, err := d.db.W.ExecContext(ctx, `UPDATE openclaw_devices SET revoked_at=? WHERE id=? AND revoked_at=''`, store.FormatTime(d.now()), strings.ToLower(id))
	if err != nil {
		return Device{}, fmt.Errorf("revoke device %s: %w", id, err)
	}
	list, err := d.List(ctx)
	if err != nil {
		return Device{}, err
	}
	for _, dv := range list {
		if dv.ID == strings.ToLower(id) {
			return dv, nil
		}
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Device{}, fmt.Errorf("device %q: %w", id, store.ErrNotFound)
	}
	return Device{}, fmt.Errorf("device %q: %w", id, store.ErrNotFound)
}

// RegisterDevicesAPI mounts the device routes on the operator's /api/v1 group:
//
//	GET /openclaw/devices, POST /openclaw/devices/:id/revoke (which also closes the device's
//	connections).
func RegisterDevicesAPI(g *echo.Group, d *Devices, srv *Server) {
	g.GET("/openclaw/devices", func(c echo.Context) error {
		list, err := d.List(c.Request().Context())
		if err != nil {
			return err
		}
		if list == nil {
			list = []Device{}
		}
		return c.JSON(http.StatusOK, list)
	})
	g.POST("/openclaw/devices/:id/revoke", func(c echo.Context) error {
		dv, err := d.Revoke(c.Request().Context(), c.Param("id"))
		if errors.Is(err, store.ErrNotFound) {
			return c.JSON(http.StatusNotFound, map[string]any{"error": map[string]string{"code": "not-found", "message": err.Error()}})
		}
		if err != nil {
			return err
		}
		srv.DropDevice(dv.ID)
		return c.JSON(http.StatusOK, dv)
	})
}
