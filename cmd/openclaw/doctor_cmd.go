package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/command"
)

// doctorStep is one checked link of the chain.
type doctorStep struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Warning marks a step that passed with a risk the operator should know of (it does not
	// make doctor fail).
	Warning bool `json:"warning,omitempty"`
}

// fixes maps what a failure says to what the operator can do about it.
var fixes = []struct{ match, fix string }{
	{"host key mismatch", "the box presented a different host key than the provider reported: re-provision, or make the lease CLI report the box's real sshHostKey"},
	{"unpinned", "the lease CLI's inspect output has no sshHostKey: the gateway never connects unpinned"},
	{"read key", "the gateway cannot read the lease's private key file (sshKey / keyPath)"},
	{"connection refused", "nothing listens on the box's SSH port: check sshd on the box and the lease's sshHost/sshPort"},
	{"i/o timeout", "the box's SSH port is unreachable from the gateway: check routing/firewall to sshHost"},
	{"unable to authenticate", "the box refused the lease key: check the lease's sshKey and the box's authorized_keys"},
	{"box hygiene", "a hygiene check failed under policy enforce: fix the box, or set the check to warn in the profile's hygiene block"},
	{"no bundle", "the box's platform differs from the gateway's: run `make bundles` and set bundleDir in the gateway config"},
	{"not admitted", "the worker did not connect back: read the worker log in ~/.openclaw-worker/state/<env>/worker.log on the box"},
	{"sync", "the box could not take or return a workspace: check disk space and write access in the box's HOME"},
	{"crabbox", "install or upgrade Crabbox (" + command.MinCrabboxVersion + " or newer) where the gateway runs, or name its path in the profile's settings.binary"},
	{"lease CLI", "the lease CLI failed: its own message is quoted above; run the profile's provision command by hand"},
	{"capacity", "the profile is at maxEnvironments: destroy an environment or raise the limit"},
}

func fixFor(detail string) string {
	l := strings.ToLower(detail)
	for _, f := range fixes {
		if strings.Contains(l, strings.ToLower(f.match)) {
			return f.fix
		}
	}
	return ""
}

func newDoctorCmd(g *globals) *cobra.Command {
	var profile, model string
	var keep bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use: "doctor [--profile P]",
		Example: `  openclaw doctor
  openclaw doctor --profile hetzner --model anthropic/claude-sonnet-4-5`,
		Short: "Check the whole chain: gateway → inference → provider → SSH → bundle → hygiene → tunnel → worker → sync",
		Long: `doctor makes one real, minimal call through the gateway's inference proxy to the default model (or
--model): a 16-token answer to a one-line prompt, with the provider's credential; a scripted model is
reported as scripted (its answers come from a script, no provider is called). Then it leases a machine
through the profile (default: the built-in local profile), follows it to ready, and reports every link
of the chain with its result and, for a failure, what to do about it. The environment is destroyed
afterwards unless --keep is given. It exits non-zero if a step failed. A step marked "warn" passed
with a risk to know of: the credentials key beside gateway.db in --data-dir (a copy of the data dir
then decrypts every stored credential; set credentials.keyFile outside it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON := g.structured()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			steps := runDoctor(ctx, g, profile, model, keep)
			failed := 0
			if asJSON {
				if err := g.emit(stdout, steps); err != nil {
					return err
				}
			}
			for _, s := range steps {
				if !s.OK {
					failed++
				}
				if asJSON {
					continue
				}
				mark := "ok  "
				switch {
				case !s.OK:
					mark = "FAIL"
				case s.Warning:
					mark = "warn"
				}
				fmt.Fprintf(stdout, "%s  %-10s %s\n", mark, s.Name, s.Detail)
				if s.Fix != "" {
					fmt.Fprintf(stdout, "      %-10s fix: %s\n", "", s.Fix)
				}
			}
			if failed > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("%d check(s) failed", failed)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&profile, "profile", "local", "profile to lease a machine through")
	f.StringVar(&model, "model", "", "model to call, provider/model (default: the catalog's default model)")
	f.BoolVar(&keep, "keep", false, "keep the environment instead of destroying it")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	addOutput(cmd, g)
	return cmd
}

// gatewayStep reaches the gateway and, when that fails, says how to fix the gateway itself: start
// it, point the CLI at the right address, or use its token (the chain's other fixes are about boxes).
func gatewayStep(ctx context.Context, g *globals) (*api.Client, api.GatewayInfo, doctorStep) {
	step := doctorStep{Name: "gateway"}
	dataDir := g.dataDirOrDefault()
	listen := ""
	if base, err := normalizeGateway(g.gateway); err == nil && base != "" {
		if u, err := url.Parse(base); err == nil && u.Host != gateway.DefaultListen {
			listen = " --listen " + u.Host
		}
	}
	start := fmt.Sprintf("start the gateway (`openclaw gateway --data-dir %s%s`) or point the CLI at the one that runs (--gateway URL and --data-dir, or `openclaw context use`)", dataDir, listen)
	c, err := g.client()
	if err != nil {
		step.Detail = err.Error()
		step.Fix = "no gateway token: " + start
		if errors.Is(err, fs.ErrNotExist) && g.token == "" && g.tokenFile == "" {
			step.Fix = fmt.Sprintf("no gateway has run with data dir %s (it has no gateway.token): %s", dataDir, start)
		}
		return nil, api.GatewayInfo{}, step
	}
	info, err := c.Gateway(ctx)
	var ae *api.Error
	var ue *url.Error
	switch {
	case err == nil:
		step.OK = true
		return c, info, step
	case errors.As(err, &ae) && ae.Status == http.StatusUnauthorized:
		step.Fix = fmt.Sprintf("the gateway at %s refused the token: use the token of its data dir (--data-dir) or --token, or that gateway's context (`openclaw context use`)", c.BaseURL)
	case errors.As(err, &ae) && ae.Status == http.StatusMisdirectedRequest:
		step.Fix = "the gateway refused this host name: reach it by IP or localhost, or add the name to the gateway's allowedHosts"
	case errors.As(err, &ue):
		step.Fix = fmt.Sprintf("nothing answers at %s: %s", c.BaseURL, start)
	default:
		step.Fix = fmt.Sprintf("something that is not an OpenClaw gateway (or an older one) answers at %s: check --gateway", c.BaseURL)
	}
	step.Detail = err.Error()
	return nil, api.GatewayInfo{}, step
}

// credentialsKeyStep warns when the credentials' sealing key sits in the data dir beside
// gateway.db (the default layout): a copy of the data dir then decrypts every stored credential.
// It reports nothing for a data dir this machine does not hold (a remote gateway).
func credentialsKeyStep(dataDir string) (doctorStep, bool) {
	if _, err := os.Stat(filepath.Join(dataDir, "gateway.db")); err != nil {
		return doctorStep{}, false
	}
	key := filepath.Join(dataDir, credentials.KeyFile)
	if _, err := os.Stat(key); err != nil {
		return doctorStep{Name: "key", OK: true, Detail: "no credentials key in the data dir " + dataDir + " (credentials.keyFile lies elsewhere)"}, true
	}
	return doctorStep{Name: "key", OK: true, Warning: true,
		Detail: fmt.Sprintf("the credentials key %s sits beside the database: a copy of the data dir decrypts every stored credential", key),
		Fix:    "move it outside the data dir (another volume or a secrets mount) and set credentials.keyFile to its absolute path in the gateway config; see docs/operations.md → Credentials key"}, true
}

func runDoctor(ctx context.Context, g *globals, profile, model string, keep bool) (steps []doctorStep) {
	add := func(name string, ok bool, detail string) {
		s := doctorStep{Name: name, OK: ok, Detail: detail}
		if !ok {
			s.Fix = fixFor(detail)
		}
		steps = append(steps, s)
	}
	c, info, step := gatewayStep(ctx, g)
	steps = append(steps, step)
	if !step.OK {
		return steps
	}
	add("gateway", true, fmt.Sprintf("%s (%s) at %s, token accepted", info.ID, info.Version, c.BaseURL))
	if ts, ok := transportStep(info); ok {
		steps = append(steps, ts)
	}
	if s, ok := credentialsKeyStep(g.dataDirOrDefault()); ok {
		steps = append(steps, s)
	}
	steps = append(steps, inferenceStep(ctx, c, model))

	p, err := c.Profile(ctx, profile)
	if err != nil {
		add("profile", false, err.Error())
		return steps
	}
	detail := fmt.Sprintf("%s (provider %s)", p.ID, p.Provider)
	if len(p.Warnings) > 0 {
		detail += "; warning: " + strings.Join(p.Warnings, "; ")
	}
	add("profile", true, detail)

	if p.Provider == "crabbox" {
		if !doctorCrabbox(ctx, p, add) {
			return steps
		}
	}

	e, err := c.CreateEnvironment(ctx, profile, "")
	if err != nil {
		add("provider", false, err.Error())
		return steps
	}
	if !keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			d, err := c.DestroyEnvironment(dctx, e.ID, api.DestroyOptions{Wait: 90 * time.Second})
			switch {
			case err != nil:
				add("cleanup", false, err.Error())
			case d.State != envs.Destroyed:
				add("cleanup", false, fmt.Sprintf("environment %s still %s (the gateway keeps retrying)", e.ID, d.State))
			default:
				add("cleanup", true, "environment "+e.ID+" destroyed, provider confirmed")
			}
		}()
	}
	e, err = c.WaitEnvironment(ctx, e.ID, 0, nil, func(e envs.Environment) bool { return e.State == envs.Ready || e.State.Dead() })
	evs := doctorEvents(ctx, c, e.ID)
	note := func(prefix string) (string, bool) {
		for i := len(evs) - 1; i >= 0; i-- {
			if strings.HasPrefix(evs[i].Reason, prefix) {
				return evs[i].Reason, true
			}
		}
		return "", false
	}
	lease, leased := "", false
	for _, ev := range evs {
		if ev.To == envs.Bootstrapping && ev.From == envs.Provisioning {
			lease, leased = ev.Reason, true
		}
	}
	failure := e.Error
	if err != nil && failure == "" {
		failure = err.Error()
	}
	if !leased {
		add("provider", false, "no lease: "+failure)
		return steps
	}
	add("provider", true, lease)
	for _, link := range []struct{ name, prefix string }{
		{"ssh", "ssh:"}, {"bundle", "bundle:"}, {"hygiene", "check "}, {"tunnel", "tunnel:"}, {"worker", "worker: admitted"},
	} {
		if link.name == "hygiene" {
			var checks []string
			bad := false
			for _, ev := range evs {
				if strings.HasPrefix(ev.Reason, "check ") {
					checks = append(checks, strings.TrimPrefix(ev.Reason, "check "))
					bad = bad || strings.Contains(ev.Reason, ": fail")
				}
			}
			if len(checks) == 0 {
				add("hygiene", false, "not reached: "+failure)
				return steps
			}
			add("hygiene", !bad, strings.Join(checks, "; "))
			if bad {
				steps[len(steps)-1].Detail += " — " + failure
				return steps
			}
			continue
		}
		if n, ok := note(link.prefix); ok {
			add(link.name, true, n)
			continue
		}
		add(link.name, false, "not reached: "+failure)
		return steps
	}
	if wi, err := c.EnvironmentWorker(ctx, e.ID); err == nil {
		add("tunnel", wi.TunnelStatus == "connected" && wi.Admitted, fmt.Sprintf("now %s, worker admitted=%v, epoch %d", wi.TunnelStatus, wi.Admitted, wi.TunnelEpoch))
	}
	if sc, err := c.CheckSync(ctx, e.ID); err != nil {
		add("sync", false, err.Error())
	} else {
		add("sync", sc.OK, sc.Detail)
	}
	return steps
}

// inferenceStep makes one minimal real call to the model (the default when "") through the
// gateway's inference proxy and says what answered: the provider, or a script.
func inferenceStep(ctx context.Context, c *api.Client, model string) doctorStep {
	s := doctorStep{Name: "inference"}
	p, err := c.ProbeModel(ctx, model)
	if err != nil {
		s.Detail = err.Error()
		if model != "" {
			s.Detail = "model " + model + ": " + s.Detail
		}
		s.Fix = "name a model of the gateway's catalog (`openclaw models list`)"
		return s
	}
	where := fmt.Sprintf("model %s (%s", p.Model, p.API)
	if p.BaseURL != "" {
		where += " at " + p.BaseURL
	}
	where += ")"
	switch {
	case p.OK && p.Scripted:
		s.OK = true
		s.Detail = fmt.Sprintf("scripted: %s answers from a script, no model provider is called (answer %q); configure a real model under models: to check one", where, p.Reply)
	case p.OK:
		s.OK = true
		s.Detail = fmt.Sprintf("%s answered a real call in %dms: %q (%s, %d input / %d output tokens); the box holds no credential",
			where, p.Millis, p.Reply, p.StopReason, p.InputTokens, p.OutputTokens)
	default:
		s.Detail = fmt.Sprintf("%s: the call failed: %s", where, p.Error)
		l := strings.ToLower(p.Error)
		switch {
		case p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden:
			cred := "the provider's credential"
			if p.Credential != "" {
				cred = "credential " + p.Credential
			}
			s.Fix = "the provider refused " + cred + ": set it with `openclaw credential set " + dash(p.Credential) + "` (and name it in the provider's credential field)"
		case p.Status == http.StatusNotFound:
			s.Fix = "the provider does not know this model: check the model id and baseUrl in the gateway's models config"
		case strings.Contains(l, "connection refused") || strings.Contains(l, "no such host") || strings.Contains(l, "timeout"):
			s.Fix = "nothing answers at the provider's baseUrl: check models.providers." + strings.SplitN(p.Model, "/", 2)[0] + ".baseUrl and that the server runs"
		case strings.Contains(l, "credential"):
			s.Fix = "the gateway has no value for the provider's credential: `openclaw credential set " + dash(p.Credential) + "`"
		default:
			s.Fix = "the provider's own message is quoted above; check its status and the gateway's models config"
		}
	}
	return s
}

func doctorEvents(ctx context.Context, c *api.Client, id string) []envs.Event {
	evs, _ := c.EnvironmentEvents(context.WithoutCancel(ctx), id)
	return evs
}

// doctorCrabbox checks `crabbox --version` for a Crabbox profile (the same check as profile creation).
func doctorCrabbox(ctx context.Context, p providers.Profile, add func(string, bool, string)) bool {
	dir, err := os.MkdirTemp("", "openclaw-doctor-crabbox-")
	if err != nil {
		add("crabbox", false, err.Error())
		return false
	}
	defer os.RemoveAll(dir)
	v, err := command.NewCrabbox(command.Config{WorkRoot: dir}).CheckVersion(ctx, p.Settings)
	if err != nil {
		add("crabbox", false, "crabbox version: "+err.Error())
		return false
	}
	add("crabbox", true, fmt.Sprintf("crabbox %s (OpenClaw requires %s or newer)", v, command.MinCrabboxVersion))
	return true
}
