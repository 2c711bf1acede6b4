package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/providers"
)

// openClawDeps are the services the OpenClaw-protocol door translates to.
type openClawDeps struct {
	token      string
	sessions   *sessions.Store
	turns      *turns.Service
	catalog    *inference.Catalog
	envs       *envs.Manager
	profiles   *profiles.Store
	placements *placement.Placements
	dispatcher *placement.Dispatcher
	dataDir    string
	tunnel     func(envID string) string
	version    string
	log        *slog.Logger
	trace      io.Writer
	signedIn   func(r *http.Request) bool
	maxConns   int
	maxPerDev  int
	devices    *openclaw.Devices
	// removeSession is session rm without force: a session held on a worker is refused.
	removeSession func(ctx context.Context, id string) error
	refuse        func(r *http.Request, why string)
}

// newOpenClawDoor builds the OpenClaw Gateway protocol v4 endpoint (docs/openclaw-clients.md).
func newOpenClawDoor(d openClawDeps) (*openclaw.Server, error) {
	return openclaw.New(openclaw.Config{
		Token:    func() string { return d.token },
		Sessions: d.sessions,
		Turns:    d.turns,
		Models: func() []openclaw.Model {
			var out []openclaw.Model
			for _, m := range d.catalog.Models() {
				out = append(out, openclaw.Model{Ref: m.Ref, Provider: m.Provider, ID: m.ID, Name: m.Name, ContextWindow: m.ContextWindow})
			}
			return out
		},
		DefaultModel: d.catalog.Default,
		Environments: func(ctx context.Context) ([]openclaw.Environment, error) {
			list, err := d.envs.List(ctx, false)
			if err != nil {
				return nil, err
			}
			out := make([]openclaw.Environment, 0, len(list))
			for _, e := range list {
				out = append(out, environmentView(ctx, d, e))
			}
			return out, nil
		},
		Profiles: func(ctx context.Context) ([]openclaw.Profile, error) {
			list, err := d.profiles.List(ctx)
			if err != nil {
				return nil, err
			}
			out := make([]openclaw.Profile, 0, len(list))
			for _, p := range list {
				op := openclaw.Profile{ID: p.ID, ProviderID: p.Provider}
				var st struct {
					Class string `json:"class"`
				}
				if json.Unmarshal(p.Settings, &st) == nil && st.Class != "" {
					op.Classes = []string{st.Class}
				}
				out = append(out, op)
			}
			return out, nil
		},
		NewWorkspace: func(sessionID string) (string, error) { return newSessionWorkspace(d.dataDir, sessionID) },
		CloudProfiles: func(ctx context.Context) ([]openclaw.CloudProfile, error) {
			list, err := d.profiles.List(ctx)
			if err != nil {
				return nil, err
			}
			return cloudProfiles(list), nil
		},
		ApplyProfiles: func(ctx context.Context, ch openclaw.ProfileChanges) error {
			return applyCloudProfiles(ctx, d.profiles, ch)
		},
		CreateEnvironment: func(ctx context.Context, profileID, key string) (openclaw.Environment, error) {
			e, _, err := d.envs.Create(ctx, profileID, key)
			if err != nil {
				return openclaw.Environment{}, envRefusal(err)
			}
			return environmentView(ctx, d, e), nil
		},
		DestroyEnvironment: func(ctx context.Context, id string, force bool) (openclaw.Environment, error) {
			e, err := d.envs.Destroy(ctx, id, force)
			if errors.Is(err, context.DeadlineExceeded) {
				e, err = d.envs.Get(context.WithoutCancel(ctx), id) // still stopping: the teardown goes on
			}
			if err != nil {
				return openclaw.Environment{}, envRefusal(err)
			}
			return environmentView(ctx, d, e), nil
		},
		Dispatch: func(ctx context.Context, sessionID, profileID, class string) error {
			_, err := d.dispatcher.Dispatch(ctx, sessionID, profileID, class)
			return placementRefusal(err)
		},
		Reclaim: func(ctx context.Context, sessionID string, recover bool) error {
			p, err := d.placements.Get(ctx, sessionID)
			if err != nil {
				return placementRefusal(err)
			}
			switch {
			case recover && (p.State == placement.Failed || p.State == placement.Reclaimed):
				_, err = d.dispatcher.MoveLocal(ctx, sessionID, false)
			case p.State == placement.Local:
				return nil
			default:
				_, err = d.dispatcher.PullBack(ctx, sessionID, false)
			}
			return placementRefusal(err)
		},
		Placement: func(ctx context.Context, sessionID string) (openclaw.Placement, bool) {
			p, err := d.placements.Get(ctx, sessionID)
			if err != nil {
				return openclaw.Placement{}, false
			}
			out := openclaw.Placement{State: string(p.State), EnvironmentID: p.EnvironmentID, ProfileID: p.ProfileID,
				BundleHash: p.BundleHash, BaseManifest: p.BaseManifestID, BoxWorkspace: p.BoxWorkspace, Error: p.Error,
				Generation: p.Generation, OwnerEpoch: p.OwnerEpoch}
			if p.EnvironmentID != "" {
				if e, err := d.envs.Get(ctx, p.EnvironmentID); err == nil {
					out.ProviderID = e.ProviderID
				}
			}
			return out, true
		},
		Version:        d.version,
		Log:            d.log,
		Trace:          d.trace,
		MaxConnections: d.maxConns, MaxConnectionsPerDevice: d.maxPerDev,
		RemoveSession: d.removeSession,
		Devices:       d.devices,
		SignedIn:      d.signedIn,
		Refuse:        d.refuse,
	})
}

// environmentView is an environment as the OpenClaw door shows it.
func environmentView(ctx context.Context, d openClawDeps, e envs.Environment) openclaw.Environment {
	now := time.Now()
	oe := openclaw.Environment{ID: e.ID, ProfileID: e.ProfileID, ProviderID: e.ProviderID, LeaseID: e.LeaseID,
		State: string(e.State), Error: e.Error, TunnelStatus: d.tunnel(e.ID), AgeMs: now.Sub(e.CreatedAt).Milliseconds()}
	if !e.LastActivityAt.IsZero() {
		oe.IdleMs = now.Sub(e.LastActivityAt).Milliseconds()
	}
	if ps, err := d.placements.ServedBy(ctx, e.ID); err == nil {
		for _, p := range ps {
			oe.AttachedSessionIDs = append(oe.AttachedSessionIDs, p.SessionID)
		}
	}
	return oe
}

// envRefusal is an environment manager's error as the OpenClaw door reports it.
func envRefusal(err error) error {
	var fe *providers.FieldError
	var ce *envs.CapacityError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &openclaw.EnvironmentError{Invalid: true, Code: "not_found", Message: err.Error()}
	case errors.As(err, &fe):
		return &openclaw.EnvironmentError{Invalid: true, Code: "invalid_profile", Message: err.Error()}
	case errors.Is(err, envs.ErrAttached):
		return &openclaw.EnvironmentError{Invalid: true, Code: "attached", Message: err.Error() + " (pull the session back first, or pass force)"}
	case errors.As(err, &ce):
		return &openclaw.EnvironmentError{Code: "capacity", Message: ce.Message, RetryAfter: ce.RetryAfter}
	}
	return err
}

// cloudSettings are the settings OpenClaw's Cloud workers page edits: the Crabbox ones (the
// crabbox provider's settings have these names; a lease CLI's may have some of them).
type cloudSettings struct {
	Provider    string `json:"provider"`
	Class       string `json:"class"`
	TTL         string `json:"ttl"`
	IdleTimeout string `json:"idleTimeout"`
	Binary      string `json:"binary"`
}

// applyCloudProfiles makes a config.patch's profile changes: each profile is the stored one (or a
// new one) with the page's settings set and the rest of its settings, lifetime, sync rules and
// policies kept; every one is validated as `openclaw profile apply` does before any is written.
func applyCloudProfiles(ctx context.Context, ps *profiles.Store, ch openclaw.ProfileChanges) error {
	var puts []*providers.Profile
	for _, cp := range ch.Put {
		p, err := ps.Get(ctx, cp.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			p = providers.Profile{ID: cp.ID}
		case err != nil:
			return err
		}
		settings := map[string]json.RawMessage{}
		if p.Provider == cp.Provider && len(p.Settings) > 0 {
			if err := json.Unmarshal(p.Settings, &settings); err != nil {
				return fmt.Errorf("profile %s: its stored settings are not an object: %w", cp.ID, err)
			}
		}
		for k, v := range map[string]string{"provider": cp.Backend, "class": cp.Class, "ttl": cp.TTL, "idleTimeout": cp.IdleTimeout, "binary": cp.Binary} {
			delete(settings, k)
			if v != "" {
				settings[k], _ = json.Marshal(v)
			}
		}
		p.Provider = cp.Provider
		p.Settings, _ = json.Marshal(settings)
		puts = append(puts, &p)
	}
	// All validated, then all written in one transaction: a refusal changes nothing, and so does
	// a change made meanwhile by another door (the CLI, the API) that the client has not seen.
	return ps.Apply(ctx, puts, ch.Delete, func(now []providers.Profile) error {
		if ch.BaseHash != "" && openclaw.ConfigHash(cloudProfiles(now)) != ch.BaseHash {
			return openclaw.ErrConfigChanged
		}
		return nil
	})
}

// cloudProfiles is our profiles as OpenClaw's cloudWorkers.profiles shows them.
func cloudProfiles(list []providers.Profile) []openclaw.CloudProfile {
	out := make([]openclaw.CloudProfile, 0, len(list))
	for _, p := range list {
		var st cloudSettings
		_ = json.Unmarshal(p.Settings, &st) // settings of other shapes show as empty
		out = append(out, openclaw.CloudProfile{ID: p.ID, Provider: p.Provider, Backend: st.Provider, Class: st.Class,
			TTL: st.TTL, IdleTimeout: st.IdleTimeout, Binary: st.Binary})
	}
	return out
}

// placementRefusal is a refused dispatch or pull-back as the OpenClaw door reports it: bad input
// names its code; a busy session or a full gateway is retryable.
func placementRefusal(err error) error {
	var fe *providers.FieldError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return &openclaw.EnvironmentError{Invalid: true, Code: "profile_not_found", Message: err.Error()}
	case errors.As(err, &fe):
		return &openclaw.EnvironmentError{Invalid: true, Code: "invalid_profile", Message: err.Error()}
	case errors.Is(err, placement.ErrBusy):
		return &openclaw.EnvironmentError{Code: "busy", Message: err.Error(), RetryAfter: 5 * time.Second}
	case errors.Is(err, placement.ErrStale):
		return &openclaw.EnvironmentError{Invalid: true, Code: "stale", Message: err.Error()}
	case errors.Is(err, sessions.ErrArchived):
		return &openclaw.EnvironmentError{Invalid: true, Code: "archived", Message: err.Error()}
	}
	if re := envRefusal(err); re != err {
		return re
	}
	return &openclaw.EnvironmentError{Invalid: true, Code: "refused", Message: err.Error()}
}

// withOpenClaw routes WebSocket upgrades of "/" (where OpenClaw's clients connect when given the
// gateway's URL) and of any path under the Control UI's base path to the OpenClaw-protocol door, and the Control
// UI's pages (when one is served) to it, behind the same Host check as the API; every other
// request goes to next.
func withOpenClaw(next http.Handler, oc *openclaw.Server, cui *openclaw.ControlUI, allowedHosts []string) http.Handler {
	base := ""
	if cui != nil {
		base = cui.BasePath()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		under := base != "" && (p == base || strings.HasPrefix(p, base+"/"))
		// The Control UI connects from the page it is on (a deep link such as base/sessions too).
		ws := openclaw.IsUpgrade(r) && (p == "/" || under)
		ui := !ws && under
		if !ws && !ui {
			next.ServeHTTP(w, r)
			return
		}
		if !api.HostAllowed(r.Host, allowedHosts) {
			http.Error(w, "host not allowed", http.StatusMisdirectedRequest)
			return
		}
		if ws {
			oc.ServeHTTP(w, r)
			return
		}
		cui.ServeHTTP(w, r)
	})
}

// newSessionWorkspace makes <data dir>/workspaces/<session>, where a session without a workspace
// runs on the gateway (session rm removes it), mode 0700 like every area of the data dir. It is
// always a fresh directory: an existing one, or a workspaces area that is not a real directory
// (a symlink planted there), is refused.
func newSessionWorkspace(dataDir, sessionID string) (string, error) {
	root := filepath.Join(dataDir, "workspaces")
	if err := os.Mkdir(root, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory of the gateway's own", root)
	}
	dir := filepath.Join(root, sessionID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}
