package openclaw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// CloudProfile is a worker profile as OpenClaw's configuration shows it: cloudWorkers.profiles.<id>,
// whose provider is ours ("crabbox", "command", "local", …) and whose settings are the Crabbox ones
// both products share (backend, machine class, ttl, idle timeout, binary).
type CloudProfile struct {
	ID, Provider                             string
	Backend, Class, TTL, IdleTimeout, Binary string
}

// ProfileChanges is one config.patch of cloudWorkers.profiles: profiles to create or replace, and
// ids to remove. The gateway validates every one before it changes any.
type ProfileChanges struct {
	Put    []CloudProfile
	Delete []string
	// BaseHash is the config hash the patch was made against: the apply is refused with
	// ErrConfigChanged if the profiles no longer hash to it when they are written.
	BaseHash string
}

// ErrConfigChanged refuses a patch made against profiles that changed since.
var ErrConfigChanged = errors.New("config changed since last load; re-run config.get and retry")

// configPath names where this projection comes from (config.get's path).
const configPath = "gateway profiles (openclaw profile list)"

// configPatchTimeout bounds one config.patch, validation (which may run a lease program) and
// writes included.
const configPatchTimeout = 2 * time.Minute

// configSlotWait bounds how long a config.patch waits for the one before it.
const configSlotWait = 30 * time.Second

// maxPatchProfiles bounds the profiles one config.patch may touch.
const maxPatchProfiles = 64

// configView is the projection of this gateway's state that OpenClaw's configuration editor reads:
// only cloudWorkers.profiles, which maps onto our profiles; everything else is absent.
func (c *conn) configView(ctx context.Context) (map[string]any, string, *errorShape) {
	var list []CloudProfile
	if c.srv.cfg.CloudProfiles != nil {
		var err error
		if list, err = c.srv.cfg.CloudProfiles(ctx); err != nil {
			return nil, "", errf(CodeUnavailable, err.Error())
		}
	}
	cfg, hash := configOf(list)
	return cfg, hash, nil
}

// configOf is the projection of profiles and its hash.
func configOf(list []CloudProfile) (map[string]any, string) {
	profiles := map[string]any{}
	for _, p := range list {
		profiles[p.ID] = profileView(p)
	}
	cfg := map[string]any{"cloudWorkers": map[string]any{"profiles": profiles}}
	b, _ := json.Marshal(cfg) // map keys sorted: the same state gives the same hash
	sum := sha256.Sum256(b)
	return cfg, "sha256:" + hex.EncodeToString(sum[:16])
}

// ConfigHash is config.get's hash of these profiles (what a patch's baseHash names).
func ConfigHash(list []CloudProfile) string {
	_, h := configOf(list)
	return h
}

func profileView(p CloudProfile) map[string]any {
	st := map[string]any{}
	for k, v := range map[string]string{"provider": p.Backend, "class": p.Class, "ttl": p.TTL, "idleTimeout": p.IdleTimeout, "binary": p.Binary} {
		if v != "" {
			st[k] = v
		}
	}
	return map[string]any{"provider": p.Provider, "settings": st}
}

// configGet answers config.get with the projection, in the shape of OpenClaw's config snapshot.
func (c *conn) configGet(inFrame) (any, *errorShape) {
	ctx, cancel := c.callCtx()
	defer cancel()
	cfg, hash, e := c.configView(ctx)
	if e != nil {
		return nil, e
	}
	raw, _ := json.MarshalIndent(cfg, "", "  ")
	return map[string]any{"path": configPath, "exists": true, "valid": true, "raw": string(raw), "parsed": cfg, "resolved": cfg,
		"sourceConfig": cfg, "runtimeConfig": cfg, "config": cfg, "hash": hash, "configRevisionHash": hash, "appliedConfigHash": hash,
		"issues": []any{}, "warnings": []any{}, "legacyIssues": []any{}}, nil
}

type configPatchParams struct {
	Raw          string   `json:"raw"`
	BaseHash     string   `json:"baseHash"`
	ReplacePaths []string `json:"replacePaths"`
	Note         string   `json:"note"`
	SessionKey   string   `json:"sessionKey"`
}

// configPatch applies a JSON merge patch of cloudWorkers.profiles (what the Control UI's
// Settings → Cloud workers page sends) onto our profiles, validated as `openclaw profile apply`
// validates them, all before any is written. Any other key is refused by name.
func (c *conn) configPatch(f inFrame) (any, *errorShape) {
	var p configPatchParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if c.srv.cfg.ApplyProfiles == nil {
		return nil, errf(CodeUnavailable, "this gateway's profiles cannot be changed here")
	}
	if strings.TrimSpace(p.Raw) == "" {
		return nil, errf(CodeInvalidRequest, "invalid config.patch params: raw (string) required")
	}
	var patch map[string]json.RawMessage
	if err := json.Unmarshal([]byte(p.Raw), &patch); err != nil || patch == nil {
		return nil, errf(CodeInvalidRequest, "config.patch raw must be a JSON object")
	}
	// Validating a profile may run its lease program (crabbox --version), so this runs as a
	// long method, bounded by configPatchTimeout. One patch at a time: the base hash checked
	// below is the state the patch is applied to.
	wait, stopWaiting := context.WithTimeout(c.ctx, configSlotWait)
	defer stopWaiting()
	select {
	case c.srv.configMu <- struct{}{}:
		defer func() { <-c.srv.configMu }()
	case <-wait.Done():
		return nil, &errorShape{Code: CodeUnavailable, Message: "config.patch: another config change is still being applied; retry", Retryable: true, RetryAfterMs: 5000}
	}
	ctx, cancel := context.WithTimeout(c.ctx, configPatchTimeout)
	defer cancel()
	cur, hash, e := c.configView(ctx)
	if e != nil {
		return nil, e
	}
	if p.BaseHash == "" {
		return nil, errf(CodeInvalidRequest, "config base hash required; re-run config.get and retry")
	}
	if p.BaseHash != hash {
		return nil, errf(CodeInvalidRequest, "config changed since last load; re-run config.get and retry")
	}
	for k := range patch {
		if k != "cloudWorkers" {
			return nil, errf(CodeInvalidRequest, "config.patch: "+truncate(k, 64)+" is not kept by this gateway (only cloudWorkers.profiles can be changed here)")
		}
	}
	var cw map[string]json.RawMessage
	if err := json.Unmarshal(patch["cloudWorkers"], &cw); err != nil || cw == nil {
		return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers must be an object")
	}
	for k := range cw {
		switch k {
		case "profiles":
		case "preparedPool":
			return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.preparedPool: this gateway keeps no prepared pool of workers")
		case "projectProfiles":
			return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.projectProfiles: this gateway has no repository defaults; choose the profile when you dispatch")
		default:
			return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers."+truncate(k, 64)+" is not kept by this gateway")
		}
	}
	var profs map[string]json.RawMessage
	if err := json.Unmarshal(cw["profiles"], &profs); err != nil || profs == nil {
		return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.profiles must be an object")
	}
	if len(profs) > maxPatchProfiles {
		return nil, errf(CodeInvalidRequest, fmt.Sprintf("config.patch: at most %d profiles at once", maxPatchProfiles))
	}
	existing := cur["cloudWorkers"].(map[string]any)["profiles"].(map[string]any)
	ids := make([]string, 0, len(profs))
	for id := range profs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var ch ProfileChanges
	for _, id := range ids {
		v := profs[id]
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			if _, ok := existing[id]; !ok {
				return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.profiles."+truncate(id, 64)+": no such profile")
			}
			ch.Delete = append(ch.Delete, id)
			continue
		}
		base, _ := json.Marshal(existing[id])
		merged, err := mergePatch(base, v)
		if err != nil {
			return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.profiles."+truncate(id, 64)+": "+err.Error())
		}
		cp, msg := cloudProfile(id, merged)
		if msg != "" {
			return nil, errf(CodeInvalidRequest, "config.patch: cloudWorkers.profiles."+truncate(id, 64)+msg)
		}
		ch.Put = append(ch.Put, cp)
	}
	ch.BaseHash = hash
	if err := c.srv.cfg.ApplyProfiles(ctx, ch); err != nil {
		if errors.Is(err, ErrConfigChanged) {
			return nil, errf(CodeInvalidRequest, ErrConfigChanged.Error())
		}
		if ctx.Err() != nil {
			return nil, errf(CodeUnavailable, "config.patch: validating and writing the profiles took longer than "+configPatchTimeout.String()+"; nothing was changed")
		}
		return nil, errf(CodeInvalidRequest, "config.patch: "+truncate(err.Error(), 1000))
	}
	cfg, hash, e := c.configView(ctx)
	if e != nil {
		return nil, e
	}
	return map[string]any{"ok": true, "path": configPath, "hash": hash, "config": cfg}, nil
}

// cloudProfile reads a merged cloudWorkers.profiles entry. Only what this gateway has is taken;
// a field of OpenClaw's that it lacks is refused by name unless it is empty (msg: ".field: why").
func cloudProfile(id string, merged json.RawMessage) (CloudProfile, string) {
	var e struct {
		Provider     *string                    `json:"provider"`
		Install      *string                    `json:"install"`
		ReadyWorkers json.RawMessage            `json:"readyWorkers"`
		SuspendAfter json.RawMessage            `json:"suspendAfter"`
		Settings     map[string]json.RawMessage `json:"settings"`
	}
	dec := json.NewDecoder(bytes.NewReader(merged))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return CloudProfile{}, ": " + truncate(err.Error(), 200)
	}
	cp := CloudProfile{ID: id, Provider: "crabbox"}
	if e.Provider != nil {
		cp.Provider = *e.Provider
	}
	switch {
	case e.Install != nil && *e.Install != "bundle":
		return cp, ".install: this gateway installs its own content-hashed binary (bundle) only"
	case !isNull(e.ReadyWorkers):
		return cp, ".readyWorkers: this gateway keeps no prepared pool of workers"
	case !isNull(e.SuspendAfter):
		return cp, ".suspendAfter: this gateway does not suspend idle workers"
	}
	str := func(k string) (string, string) {
		v, ok := e.Settings[k]
		if !ok || isNull(v) {
			return "", ""
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", ".settings." + k + ": must be a string"
		}
		return s, ""
	}
	for k, v := range e.Settings {
		var msg string
		switch k {
		case "provider":
			cp.Backend, msg = str(k)
		case "class":
			cp.Class, msg = str(k)
		case "ttl":
			cp.TTL, msg = str(k)
		case "idleTimeout":
			cp.IdleTimeout, msg = str(k)
		case "binary":
			cp.Binary, msg = str(k)
		case "target":
			if t, m := str(k); m != "" || (t != "" && t != "linux") {
				msg = ".settings.target: this gateway's workers run linux"
			}
		case "setup":
			if s, m := str(k); m != "" || s != "" {
				msg = ".settings.setup: set a profile's setup steps with `openclaw profile apply` (docs/workers.md)"
			}
		case "setupEnv", "desktop", "warmImage":
			if !isNull(v) && !bytes.Equal(v, []byte("false")) && !bytes.Equal(v, []byte("[]")) {
				msg = ".settings." + k + ": not offered by this gateway"
			}
		default:
			msg = ".settings." + truncate(k, 64) + ": not kept by this gateway"
		}
		if msg != "" {
			return cp, msg
		}
	}
	return cp, ""
}

func isNull(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// mergePatch applies an RFC 7386 JSON merge patch to a document (objects merge, null removes,
// anything else replaces).
func mergePatch(doc, patch json.RawMessage) (json.RawMessage, error) {
	var p any
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	var d any
	if !isNull(doc) {
		if err := json.Unmarshal(doc, &d); err != nil {
			return nil, err
		}
	}
	return json.Marshal(mergeValue(d, p))
}

func mergeValue(d, p any) any {
	pm, ok := p.(map[string]any)
	if !ok {
		return p
	}
	dm, ok := d.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	keys := make([]string, 0, len(pm))
	for k := range pm {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if pm[k] == nil {
			delete(dm, k)
			continue
		}
		dm[k] = mergeValue(dm[k], pm[k])
	}
	return dm
}
