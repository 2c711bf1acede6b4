package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// v1 is the API path of the given segments, each escaped: v1("environments", id) is
// /api/v1/environments/<id>.
func v1(segments ...string) string {
	p := "/api/v1"
	for _, s := range segments {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// getAs GETs path and decodes its body as a T.
func getAs[T any](ctx context.Context, c *Client, path string) (T, error) {
	return doAs[T](ctx, c, http.MethodGet, path, nil)
}

// doAs sends body (none when nil) to path and decodes the answer's body as a T.
func doAs[T any](ctx context.Context, c *Client, method, path string, body any) (T, error) {
	var v T
	_, err := c.Do(ctx, method, path, body, &v)
	return v, err
}

// GatewayInfo is the body of GET /gateway.
type GatewayInfo struct {
	ID       string          `json:"id"`
	Version  string          `json:"version"`
	Features map[string]bool `json:"features"`
	// Transport is how the gateway listens (doctor flags a network address without TLS).
	Transport *Transport `json:"transport,omitempty"`
}

// Transport is how the gateway's API listener is reached.
type Transport struct {
	// Listen is the listen address as configured.
	Listen string `json:"listen"`
	// Loopback: Listen is a loopback address.
	Loopback bool `json:"loopback"`
	// TLS: the listener serves TLS (tls.cert, tls.key).
	TLS bool `json:"tls"`
	// TrustedProxies is how many trustedProxies entries may say a request came over TLS.
	TrustedProxies int `json:"trustedProxies"`
}

// Gateway returns the gateway's identity, version and features.
func (c *Client) Gateway(ctx context.Context) (GatewayInfo, error) {
	return getAs[GatewayInfo](ctx, c, v1("gateway"))
}

// Profiles lists the profiles.
func (c *Client) Profiles(ctx context.Context) ([]providers.Profile, error) {
	return listAs[providers.Profile](ctx, c, v1("profiles"))
}

// Profile returns one profile.
func (c *Client) Profile(ctx context.Context, id string) (providers.Profile, error) {
	return getAs[providers.Profile](ctx, c, v1("profiles", id))
}

// CreateProfile creates a profile; one of the same id is a conflict.
func (c *Client) CreateProfile(ctx context.Context, p providers.Profile) (providers.Profile, error) {
	return doAs[providers.Profile](ctx, c, http.MethodPost, v1("profiles"), p)
}

// PutProfile creates or replaces a profile and reports whether it was created.
func (c *Client) PutProfile(ctx context.Context, p providers.Profile) (out providers.Profile, created bool, err error) {
	status, err := c.Do(ctx, http.MethodPut, v1("profiles", p.ID), p, &out)
	return out, status == http.StatusCreated, err
}

// DeleteProfile deletes a profile that has no live environments.
func (c *Client) DeleteProfile(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodDelete, v1("profiles", id), nil, nil)
	return err
}

// CreateEnvironment leases a machine through a profile. A repeated idempotency key (if not
// empty) returns the same environment.
func (c *Client) CreateEnvironment(ctx context.Context, profileID, idempotencyKey string) (envs.Environment, error) {
	return doAs[envs.Environment](ctx, c, http.MethodPost, v1("environments"), createEnvRequest{ProfileID: profileID, IdempotencyKey: idempotencyKey})
}

// Environments lists the environments; all includes destroyed ones.
func (c *Client) Environments(ctx context.Context, all bool) ([]envs.Environment, error) {
	return listAs[envs.Environment](ctx, c, v1("environments")+"?all="+strconv.FormatBool(all))
}

// EnvironmentView is the body of GET /environments/:id: the environment with the running totals
// of the model calls proxied for it.
type EnvironmentView struct {
	envs.Environment
	Inference *InferenceTotals `json:"inference,omitempty"`
	// Shedding, when set, says which capacity limit is refusing or pacing the environment's load.
	Shedding *Shedding `json:"shedding,omitempty"`
}

// Environment returns one environment with its running inference totals.
func (c *Client) Environment(ctx context.Context, id string) (EnvironmentView, error) {
	return getAs[EnvironmentView](ctx, c, v1("environments", id))
}

// EnvironmentEvents returns the state changes of an environment, oldest first.
func (c *Client) EnvironmentEvents(ctx context.Context, id string) ([]envs.Event, error) {
	return listAs[envs.Event](ctx, c, v1("environments", id, "events"))
}

// EnvironmentTimeline returns the timeline of an environment: its provisioning attempts,
// bootstrap and setup steps, oldest first.
func (c *Client) EnvironmentTimeline(ctx context.Context, id string) ([]envs.Step, error) {
	return getAs[[]envs.Step](ctx, c, v1("environments", id, "timeline"))
}

// EnvironmentWorker returns the worker side of an environment.
func (c *Client) EnvironmentWorker(ctx context.Context, id string) (WorkerInfo, error) {
	return getAs[WorkerInfo](ctx, c, v1("environments", id, "worker"))
}

// DestroyOptions are the options of DestroyEnvironment.
type DestroyOptions struct {
	// Force destroys from any state, even an attached environment.
	Force bool
	// Wait (at most 10m) lets the gateway wait that long for proof of teardown before it answers.
	Wait time.Duration
}

// DestroyEnvironment starts the teardown of an environment and returns it: destroyed when the
// provider proved the lease gone within o.Wait, else still destroying (the gateway keeps retrying).
func (c *Client) DestroyEnvironment(ctx context.Context, id string, o DestroyOptions) (envs.Environment, error) {
	q := url.Values{}
	if o.Force {
		q.Set("force", "true")
	}
	if o.Wait > 0 {
		q.Set("wait", o.Wait.String())
	}
	path := v1("environments", id)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return doAs[envs.Environment](ctx, c, http.MethodDelete, path, nil)
}

// Sweep runs the orphan sweep now.
func (c *Client) Sweep(ctx context.Context) (envs.SweepReport, error) {
	return doAs[envs.SweepReport](ctx, c, http.MethodPost, v1("environments", "sweep"), nil)
}

// Audit returns the newest 1000 rows of the audit log (oldest first), of one environment when
// envID is not empty.
func (c *Client) Audit(ctx context.Context, envID string) ([]store.AuditEntry, error) {
	path := v1("audit")
	if envID != "" {
		path += "?" + url.Values{"environmentId": {envID}}.Encode()
	}
	// the newest page, shown oldest first
	rows, _, err := pageAs[store.AuditEntry](ctx, c, path, PageOptions{Limit: paging.MaxLimit})
	slices.Reverse(rows)
	return rows, err
}

// WaitEnvironment polls an environment until done holds for it or ctx ends. Each state change
// after the first skip is passed to each (when set) as it is seen.
func (c *Client) WaitEnvironment(ctx context.Context, id string, skip int, each func(envs.Event), done func(envs.Environment) bool) (envs.Environment, error) {
	seen := skip
	var e envs.Environment
	for {
		if each != nil {
			evs, err := c.EnvironmentEvents(ctx, id)
			if err != nil {
				return e, err
			}
			for _, ev := range evs[min(seen, len(evs)):] {
				each(ev)
			}
			seen = len(evs)
		}
		v, err := c.Environment(ctx, id)
		if err != nil {
			return e, err
		}
		if e = v.Environment; done(e) {
			return e, nil
		}
		select {
		case <-ctx.Done():
			return e, fmt.Errorf("environment %s still %s: %w", id, e.State, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
