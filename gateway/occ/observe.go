package occ

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// Bounds of the runtime observation methods.
const (
	MaxLogBytes      = 512 << 10 // readAgentRuntimeLogs answers at most this many bytes of log
	DefaultLogLines  = 1000
	MaxLogLines      = 10000
	maxChecks        = 32
	maxRuntimeEvents = 100
)

// Check states of diagnoseAgentDeployment.
const (
	CheckOK      = "ok"
	CheckFailed  = "failed"
	CheckPending = "pending"
	CheckUnknown = "unknown"
)

// Check is one diagnoseAgentDeployment check.
type Check struct {
	Component string  `json:"component"`
	Check     string  `json:"check"`
	State     string  `json:"state"`
	CheckedAt *string `json:"checkedAt"`
	Code      string  `json:"code,omitempty"`
}

// binding is a ComputeAgentRevisionBinding: the approved namespace, agent and revision.
type binding struct {
	Namespace Namespace     `json:"namespace"`
	Agent     Agent         `json:"agent"`
	Revision  AgentRevision `json:"revision"`
}

func (b *binding) check(field string) error {
	if err := checkID(field+".namespace.id", b.Namespace.ID); err != nil {
		return err
	}
	if err := checkID(field+".agent.id", b.Agent.ID); err != nil {
		return err
	}
	if err := checkID(field+".revision.id", b.Revision.ID); err != nil {
		return err
	}
	if b.Revision.NamespaceID == "" {
		b.Revision.NamespaceID = b.Namespace.ID
	}
	if b.Revision.AgentID == "" {
		b.Revision.AgentID = b.Agent.ID
	}
	if b.Revision.NamespaceID != b.Namespace.ID || b.Revision.AgentID != b.Agent.ID {
		return Invalid(field+".revision", "belongs to another namespace or agent than the binding names")
	}
	return nil
}

// revisionEnv returns the binding's revision and its current environment (found false when it
// has none).
func (c *Compute) revisionEnv(ctx context.Context, rev AgentRevision) (revisionRow, envs.Environment, bool, error) {
	r, err := c.lookupRevision(ctx, rev)
	if errors.Is(err, store.ErrNotFound) {
		return r, envs.Environment{}, false, Permanent("REVISION_NOT_PREPARED", "revision "+rev.ID+" was never prepared on this gateway")
	}
	if err != nil || r.EnvironmentID == "" {
		return r, envs.Environment{}, false, err
	}
	e, err := c.d.Envs.Get(ctx, r.EnvironmentID)
	if errors.Is(err, store.ErrNotFound) {
		return r, e, false, nil
	}
	return r, e, err == nil, err
}

// bindingEnv checks a binding and returns its revision and the revision's current environment.
func (c *Compute) bindingEnv(ctx context.Context, b *binding) (revisionRow, envs.Environment, bool, error) {
	if err := b.check("binding"); err != nil {
		return revisionRow{}, envs.Environment{}, false, err
	}
	return c.revisionEnv(ctx, b.Revision)
}

func (c *Compute) diagnoseAgentDeployment(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Binding binding `json:"binding"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	r, e, found, err := c.bindingEnv(ctx, &in.Binding)
	if err != nil {
		return nil, err
	}
	now := c.now().UTC().Format(time.RFC3339Nano)
	at := &now
	add := func(checks []Check, component, check, state, code string) []Check {
		ch := Check{Component: component, Check: check, State: state, CheckedAt: at, Code: code}
		if state == CheckUnknown {
			ch.CheckedAt = nil
		}
		return append(checks, ch)
	}
	var checks []Check
	state := func(ok, failed bool) string {
		switch {
		case !found:
			return CheckUnknown
		case ok:
			return CheckOK
		case failed:
			return CheckFailed
		}
		return CheckPending
	}
	dead := found && (e.State.Dead() || e.State == envs.Draining || e.State == envs.Destroying)
	leased := found && e.LeaseID != "" && e.State.HasMachine()
	serving := found && (e.State == envs.Ready || e.State == envs.Attached || e.State == envs.Idle)
	failCode := ""
	if dead {
		failCode = "ENVIRONMENT_" + strings.ToUpper(string(e.State))
	}
	checks = add(checks, "provider", "lease", state(leased, dead), failCode)
	checks = add(checks, "ssh", "hostKeyPinned", state(found && len(e.Lease.HostKeys) > 0, dead), "")
	checks = add(checks, "bundle", "installed", state(found && e.BundleHash != "", dead), "")
	checks = add(checks, "hygiene", "checked", state(serving, dead || r.State == RevFailed), "")
	tunnelUp := found && c.d.TunnelStatus != nil && c.d.TunnelStatus(e.ID) == "connected"
	checks = add(checks, "tunnel", "connected", state(tunnelUp, dead), "")
	admitted := found && c.d.Admitted(e.ID)
	workerCode := ""
	if r.State == RevFailed {
		workerCode = r.FailureCode
	}
	checks = add(checks, "worker", "admitted", state(admitted, dead || r.State == RevFailed), workerCode)
	switch {
	case r.Model == "":
		checks = add(checks, "inference", "model", CheckOK, "CATALOG_DEFAULT")
	case c.d.ModelKnown == nil || c.d.ModelKnown(r.Model):
		checks = add(checks, "inference", "model", CheckOK, "")
	default:
		checks = add(checks, "inference", "model", CheckFailed, "MODEL_UNKNOWN")
	}
	return map[string]any{"revisionId": r.ID, "checks": checks[:min(len(checks), maxChecks)]}, nil
}

// RuntimeWorkload is one workload of describeAgentRuntime: the revision's worker environment.
type RuntimeWorkload struct {
	Name       string         `json:"name"`
	Phase      string         `json:"phase"`
	Ready      bool           `json:"ready"`
	Restarts   int            `json:"restarts"`
	Events     []RuntimeEvent `json:"events"`
	LogSources []LogSource    `json:"logSources"`
}

// RuntimeEvent is one state change of the environment (newest first).
type RuntimeEvent struct {
	At     string `json:"at"`
	From   string `json:"from"`
	To     string `json:"to"`
	Reason string `json:"reason,omitempty"`
}

// LogSource names a readable log.
type LogSource struct {
	Workload  string `json:"workload"`
	Container string `json:"container"`
}

func (c *Compute) describeAgentRuntime(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Binding binding `json:"binding"`
		Options struct {
			Workload string `json:"workload,omitempty"`
		} `json:"options"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	r, e, found, err := c.bindingEnv(ctx, &in.Binding)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"revisionId": r.ID, "workloads": []RuntimeWorkload{}}
	if !found || (in.Options.Workload != "" && in.Options.Workload != e.ID) {
		return out, nil
	}
	w := RuntimeWorkload{Name: e.ID, Phase: string(e.State), Ready: c.d.Admitted(e.ID), Events: []RuntimeEvent{},
		LogSources: []LogSource{{Workload: e.ID, Container: "worker"}}}
	evs, err := c.d.Envs.Events(ctx, e.ID)
	if err != nil {
		return nil, err
	}
	launches := 0
	for i := len(evs) - 1; i >= 0; i-- {
		ev := evs[i]
		if ev.From == ev.To && strings.HasPrefix(ev.Reason, "worker: launched") {
			launches++
		}
		if len(w.Events) >= maxRuntimeEvents {
			continue
		}
		re := RuntimeEvent{At: ev.At.UTC().Format(time.RFC3339Nano), From: string(ev.From), To: string(ev.To)}
		if !ev.To.Dead() { // failure reasons may quote provider output: never shown here
			re.Reason = SafeReason(ev.Reason)
		}
		w.Events = append(w.Events, re)
	}
	w.Restarts = max(launches-1, 0)
	out["workloads"] = []RuntimeWorkload{w}
	return out, nil
}

func (c *Compute) readAgentRuntimeLogs(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Binding binding `json:"binding"`
		Request struct {
			Workload   string `json:"workload,omitempty"`
			Container  string `json:"container,omitempty"`
			TailLines  int    `json:"tailLines,omitempty"`
			LimitBytes int    `json:"limitBytes,omitempty"`
		} `json:"request"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	req := in.Request
	switch {
	case req.TailLines < 0 || req.TailLines > MaxLogLines:
		return nil, Invalidf("request.tailLines", "must be from 1 to %d (0: %d)", MaxLogLines, DefaultLogLines)
	case req.LimitBytes < 0 || req.LimitBytes > MaxLogBytes:
		return nil, Invalidf("request.limitBytes", "must be from 1 to %d (0: %d)", MaxLogBytes, MaxLogBytes)
	case req.Container != "" && req.Container != "worker":
		return nil, Invalid("request.container", "must be worker (the only log source)")
	}
	if req.TailLines == 0 {
		req.TailLines = DefaultLogLines
	}
	if req.LimitBytes == 0 {
		req.LimitBytes = MaxLogBytes
	}
	_, e, found, err := c.bindingEnv(ctx, &in.Binding)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"lines": []string{}, "truncated": false}
	if !found || (req.Workload != "" && req.Workload != e.ID) {
		if req.Workload != "" {
			return nil, Permanent("LOG_SOURCE_NOT_FOUND", "the revision has no workload "+SafeReason(req.Workload))
		}
		return out, nil
	}
	if !e.State.HasMachine() || e.WorkerHome == "" || c.d.ReadWorkerLog == nil {
		return out, nil // no box (yet, or any more): no lines
	}
	raw, err := c.d.ReadWorkerLog(ctx, e, req.LimitBytes+1)
	if err != nil {
		c.d.Log.Warn("occ read worker log", "env", e.ID, "err", err)
		return nil, Retryable(CodeDependencyUnavailable, "the worker's box did not answer the log read; repeat the call")
	}
	lines, truncated := tailLines(raw, req.TailLines, req.LimitBytes)
	out["lines"], out["truncated"] = lines, truncated
	return out, nil
}

// tailLines returns the last n whole lines of raw within limit bytes (newlines counted), valid
// UTF-8; truncated reports that anything was left out.
func tailLines(raw []byte, n, limit int) ([]string, bool) {
	truncated := false
	if len(raw) > limit {
		raw, truncated = raw[len(raw)-limit:], true
		if i := bytes.IndexByte(raw, '\n'); i >= 0 { // drop the cut line
			raw = raw[i+1:]
		} else {
			raw = nil
		}
	}
	text := strings.TrimSuffix(strings.ToValidUTF8(string(raw), "\uFFFD"), "\n")
	if text == "" {
		return []string{}, truncated
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines, truncated = lines[len(lines)-n:], true
	}
	return lines, truncated
}

// Codes this driver's own 409s carry; describePrepareRevisionFailure recognises them.
var permanentCodes = map[string]string{
	"PROVISIONING_REJECTED":  "configuration",
	"NAMESPACE_NOT_PREPARED": "namespace",
	"FOREIGN_NAMESPACE":      "namespace",
	"REVISION_RETIRED":       "revision",
}

func (c *Compute) describePrepareRevisionFailure(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	check, ok := permanentCodes[in.Error.Code]
	if !ok {
		return nil, nil // not ours: OCC keeps its generic retries
	}
	return map[string]any{"component": "compute", "check": check, "code": in.Error.Code, "retryable": false}, nil
}

// RuntimeImage is one getRuntimeImages entry: the worker bundle of the revision's environment.
type RuntimeImage struct {
	Workload       string  `json:"workload"`
	Container      string  `json:"container"`
	Image          string  `json:"image"`
	ImageID        *string `json:"imageId"`
	Commit         *string `json:"commit"`
	OpenclawCommit *string `json:"openclawCommit"`
}

var shaRe = regexp.MustCompile(`^[0-9a-f]{40}$`)

func (c *Compute) getRuntimeImages(ctx context.Context, body json.RawMessage) (any, error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return nil, err
	}
	_, e, found, err := c.revisionEnv(ctx, rev)
	if err != nil {
		return nil, err
	}
	images := []RuntimeImage{}
	if !found || !e.State.HasMachine() {
		return images, nil
	}
	img := RuntimeImage{Workload: e.ID, Container: "worker", Image: "openclaw-worker-bundle"}
	if e.BundleHash != "" {
		id := "sha256:" + e.BundleHash
		img.ImageID = &id
	}
	if shaRe.MatchString(c.d.GatewayCommit) {
		commit := c.d.GatewayCommit
		img.Commit, img.OpenclawCommit = &commit, &commit
	}
	return append(images, img), nil
}

func (c *Compute) getGatewayEndpoint(ctx context.Context, body json.RawMessage) (any, error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return nil, err
	}
	if c.d.Config.EndpointURL == "" {
		return json.RawMessage("null"), nil // gateway access is not configured
	}
	var session, ns string
	err = c.d.DB.R.QueryRowContext(ctx, `SELECT namespace_id, session_id FROM occ_agents WHERE id=?`, rev.AgentID).Scan(&ns, &session)
	if err != nil || ns != rev.NamespaceID || session == "" {
		return json.RawMessage("null"), nil
	}
	return strings.TrimRight(c.d.Config.EndpointURL, "/") + "/api/v1/sessions/" + session + "/stream", nil
}

// Warning is one preflight warning (a stable code and a log-safe message).
type Warning struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (c *Compute) preflight(ctx context.Context, body json.RawMessage) (any, error) {
	var warnings []Warning
	checkProfile := func(code, where, id string) {
		if _, err := c.d.Profiles.Get(ctx, id); errors.Is(err, store.ErrNotFound) {
			warnings = append(warnings, Warning{Code: code, Message: SafeReason(where + " names worker profile " + id + " which does not exist")})
		}
	}
	checkProfile("OCC_DEFAULT_PROFILE_MISSING", "occ.defaultProfile", c.d.Config.DefaultProfile)
	for name, ns := range c.d.Config.Namespaces {
		checkProfile("OCC_NAMESPACE_PROFILE_MISSING", "occ.namespaces."+name+".profile", ns.Profile)
		for _, p := range ns.AllowedProfiles {
			checkProfile("OCC_NAMESPACE_PROFILE_MISSING", "occ.namespaces."+name+".allowedProfiles", p)
		}
	}
	if c.d.Config.EndpointURL == "" {
		warnings = append(warnings, Warning{Code: "OCC_ENDPOINT_UNSET", Message: "occ.endpointURL is not set: getGatewayEndpoint answers null"})
	}
	if warnings == nil {
		warnings = []Warning{}
	}
	return map[string]any{"warnings": warnings}, nil
}

func (c *Compute) validateHarnessAuth(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Harness Harness `json:"harness"`
		Auth    *struct {
			Method string `json:"method"`
		} `json:"auth"`
		Configuration        json.RawMessage `json:"configuration"`
		CredentialSourceType string          `json:"credentialSourceType,omitempty"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	if in.Harness.Mode != "embedded" {
		return nil, Invalidf("harness.mode", "must be embedded (this driver runs the harness in the agent runtime on the worker), got %q", SafeReason(in.Harness.Mode))
	}
	if in.Auth == nil {
		return nil, Invalid("auth", "is required")
	}
	switch in.Auth.Method {
	case "api_key", "runtime":
	default:
		return nil, Invalidf("auth.method", "must be api_key or runtime (other logins are not supported by this driver), got %q", SafeReason(in.Auth.Method))
	}
	if in.Auth.Method == "api_key" && in.CredentialSourceType != "" && !providers.ValidArg(in.CredentialSourceType) {
		return nil, Invalid("credentialSourceType", "must be a source type name")
	}
	if _, err := parseRevisionConfig("configuration", in.Configuration); err != nil {
		return nil, err
	}
	return nil, nil
}

func (c *Compute) validateConfiguration(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Configuration json.RawMessage `json:"configuration"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	rc, err := parseRevisionConfig("configuration", in.Configuration)
	if err != nil {
		return nil, err
	}
	if rc.ProfileID != "" {
		if _, err := c.d.Profiles.Get(ctx, rc.ProfileID); errors.Is(err, store.ErrNotFound) {
			return nil, Invalidf("configuration.profileId", "worker profile %s does not exist on the gateway", rc.ProfileID)
		} else if err != nil {
			return nil, err
		}
	}
	if rc.Model != "" && c.d.ModelKnown != nil && !c.d.ModelKnown(rc.Model) {
		return nil, Invalid("configuration.model", "the gateway's model catalog has no such model")
	}
	return nil, nil
}
