package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// openClawDeps are the services the OpenClaw-protocol door translates to.
type openClawDeps struct {
	token      string
	sessions   *sessions.Store
	turns      *turns.Service
	catalog    *inference.Catalog
	envs       *envs.Manager
	placements *placement.Placements
	tunnel     func(envID string) string
	version    string
	log        *slog.Logger
	trace      io.Writer
	signedIn   func(r *http.Request) bool
	refuse     func(r *http.Request, why string)
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
			now := time.Now()
			out := make([]openclaw.Environment, 0, len(list))
			for _, e := range list {
				oe := openclaw.Environment{ID: e.ID, ProfileID: e.ProfileID, ProviderID: e.ProviderID, LeaseID: e.LeaseID,
					State: string(e.State), Error: e.Error, TunnelStatus: d.tunnel(e.ID),
					AgeMs: now.Sub(e.CreatedAt).Milliseconds()}
				if !e.LastActivityAt.IsZero() {
					oe.IdleMs = now.Sub(e.LastActivityAt).Milliseconds()
				}
				if ps, err := d.placements.ServedBy(ctx, e.ID); err == nil {
					for _, p := range ps {
						oe.AttachedSessionIDs = append(oe.AttachedSessionIDs, p.SessionID)
					}
				}
				out = append(out, oe)
			}
			return out, nil
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
		Version:  d.version,
		Log:      d.log,
		Trace:    d.trace,
		SignedIn: d.signedIn,
		Refuse:   d.refuse,
	})
}

// withOpenClaw routes WebSocket upgrades of "/" (where OpenClaw's clients connect when given the
// gateway's URL) and of the Control UI's base path to the OpenClaw-protocol door, and the Control
// UI's pages (when one is served) to it, behind the same Host check as the API; every other
// request goes to next.
func withOpenClaw(next http.Handler, oc *openclaw.Server, cui *openclaw.ControlUI, allowedHosts []string) http.Handler {
	base := ""
	if cui != nil {
		base = cui.BasePath()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		ws := openclaw.IsUpgrade(r) && (p == "/" || (base != "" && (p == base || p == base+"/")))
		ui := !ws && base != "" && (p == base || strings.HasPrefix(p, base+"/"))
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
