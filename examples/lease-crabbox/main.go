// Command lease-crabbox imitates the Crabbox lease CLI (openclaw/crabbox) as its source defines it,
// for both kinds of lease: coordinator-backed (--lease-id honoured, sshHostKey given for hetzner,
// gcp, aws and azure) and the direct static ssh provider (--lease-id refused, no host key,
// static_<host> ids, a stop that only drops the local claim). It is the harness the gateway's
// Crabbox preset is tested against; every shape below cites the Crabbox file it follows.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/boxproc"
)

const usage = `lease-crabbox: an imitation of the Crabbox CLI for tests.

  lease-crabbox --version | version
  lease-crabbox warmup [--provider P] [--lease-id cbx_<12 hex>] [--slug S] [--ttl D] [--idle-timeout D] ...
  lease-crabbox inspect [--provider P] --id ID-OR-SLUG [--json]
  lease-crabbox heartbeat [--provider P] --id ID-OR-SLUG [--json]
  lease-crabbox stop [--provider P] ID-OR-SLUG
  lease-crabbox list [--provider P] [--json]

Providers: hetzner (default), gcp, aws, azure, daytona (coordinator-backed) and ssh, static,
static-ssh (direct). Configuration as in Crabbox: CRABBOX_STATIC_HOST, CRABBOX_STATIC_PORT,
CRABBOX_STATIC_USER, CRABBOX_SSH_KEY. The imitation's own knobs:
  LEASE_CRABBOX_STATE=DIR      state (coordinator leases, local claims); required
  LEASE_CRABBOX_LOCALBOX=PATH  the openclaw binary: each coordinator lease is a real openclaw localbox
  LEASE_CRABBOX_LOG=FILE       append {"argv","cwd"} of every call
  LEASE_CRABBOX_VERSION=V      what --version prints (default 0.46.0)
  LEASE_CRABBOX_HOLD=FILE      once: after the lease exists and before "leased" is printed, write
                               the pid to FILE and wait to be killed
  LEASE_CRABBOX_STOP_FAILS=F   while file F exists, stop fails (exit 1, http 503)
`

// exitError is Crabbox's ExitError (internal/cli/errors.go): main prints Message and exits Code
// (cmd/crabbox/main.go).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func exit(code int, format string, args ...any) error {
	return &exitError{code, fmt.Sprintf(format, args...)}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	logCall(args)
	err := dispatch(args, stdout, stderr)
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(stderr, ee.msg)
		}
		return ee.code
	default:
		fmt.Fprintln(stderr, err)
		return 1
	}
}

func logCall(args []string) {
	path := os.Getenv("LEASE_CRABBOX_LOG")
	if path == "" {
		return
	}
	wd, _ := os.Getwd()
	b, _ := json.Marshal(map[string]any{"argv": args, "cwd": wd})
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\n", b)
}

func dispatch(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exit(2, "missing command")
	}
	switch args[0] {
	case "--version", "-v", "version": // kong.VersionFlag and versionKongCmd, internal/cli/cli_kong.go
		fmt.Fprintln(stdout, envOr("LEASE_CRABBOX_VERSION", "0.46.0"))
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	dir := os.Getenv("LEASE_CRABBOX_STATE")
	if dir == "" {
		return exit(2, "LEASE_CRABBOX_STATE is not set")
	}
	if err := os.MkdirAll(filepath.Join(dir, "claims"), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "coordinator"), 0o700); err != nil {
		return err
	}
	c := &cli{dir: dir, out: stdout, errw: stderr}
	switch args[0] {
	case "warmup":
		return c.warmup(args[1:])
	case "inspect":
		return c.inspect(args[1:])
	case "heartbeat":
		return c.heartbeat(args[1:])
	case "stop", "release":
		return c.stop(args[1:])
	case "list":
		return c.list(args[1:])
	}
	fmt.Fprint(stderr, usage)
	return exit(2, "unknown command %q", args[0])
}

type cli struct {
	dir       string
	out, errw io.Writer
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Providers: coordinator-backed ones (Coordinator: CoordinatorSupported in
// internal/providers/{aws,azure,daytona,gcp,hetzner}/provider.go) and the static ssh provider
// with its aliases (internal/providers/ssh/provider.go). The coordinator returns a host key only
// for hetzner, gcp, aws and azure Linux leases.
var (
	coordinated = map[string]bool{"hetzner": true, "gcp": true, "aws": true, "azure": true, "daytona": true}
	hostKeyed   = map[string]bool{"hetzner": true, "gcp": true, "aws": true, "azure": true}
	static      = map[string]bool{"ssh": true, "static": true, "static-ssh": true}
)

// newFlagSet is Crabbox's newFlagSet (internal/cli/app.go): ContinueOnError, usage on stderr; a
// parse error is exit 2 with the flag package's message (parseFlags).
func (c *cli) newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.errw)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: 0}
		}
		return exit(2, "%v", err)
	}
	return nil
}

// provider resolves the provider of a lease command: the flag, else a static_ id or a local claim
// routes to ssh (autoRouteStaticLease, internal/cli/target.go), else the default.
func (c *cli) provider(fs *flag.FlagSet, p, id string) (string, error) {
	if p == "" {
		p = "hetzner"
		if strings.HasPrefix(id, "static_") {
			p = "ssh"
		} else if cl, ok := c.findClaim(id); ok && cl.Provider == "ssh" {
			p = "ssh"
		}
	}
	if static[p] {
		return "ssh", nil
	}
	if !coordinated[p] {
		return "", exit(2, "unknown provider %q", p)
	}
	return p, nil
}

var (
	canonicalLeaseID = regexp.MustCompile(`^cbx_[a-f0-9]{12}$`) // internal/cli/slug.go
	slugAdjectives   = []string{"amber", "blue", "brisk", "coral", "crimson", "golden", "harbor", "jade", "pearl", "quick", "silver", "swift", "tidal", "violet"}
	slugNouns        = []string{"barnacle", "crab", "crayfish", "hermit", "krill", "lobster", "prawn", "shrimp"}
)

// normalizeSlug is normalizeLeaseSlug (internal/cli/slug.go).
func normalizeSlug(v string) string {
	v = strings.ToLower(strings.TrimSpace(v))
	var b strings.Builder
	dash := false
	for _, r := range v {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-")
}

func newSlug(leaseID string) string { // newLeaseSlug
	h := fnv.New32a()
	_, _ = h.Write([]byte(leaseID))
	n := h.Sum32()
	return slugAdjectives[n%uint32(len(slugAdjectives))] + "-" + slugNouns[(n/uint32(len(slugAdjectives)))%uint32(len(slugNouns))]
}

func newLeaseID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "cbx_" + hex.EncodeToString(b[:])
}

// warmup registers the flag set of registerLeaseCreateFlags (internal/cli/lease_flags.go) and
// warmupWithLeaseObserver (internal/cli/run.go), targets (internal/cli/static.go) included.
func (c *cli) warmup(args []string) error {
	fs := c.newFlagSet("warmup")
	provider := fs.String("provider", "", "provider")
	for _, f := range []string{"profile", "class", "arch", "os", "type", "ssh-port", "market", "pond", "desktop-env",
		"image-min-os", "target", "windows-mode", "static-host", "static-user", "static-port", "static-work-root", "network"} {
		fs.String(f, "", f)
	}
	for _, f := range []string{"expose", "cache-volume", "image-sdk", "image-runtime"} {
		fs.Func(f, f+"; repeatable", func(string) error { return nil })
	}
	for _, f := range []string{"desktop", "browser", "code", "image-require-browser", "image-require-webview2", "image-require-desktop",
		"actions-runner", "reclaim", "timing-json"} {
		fs.Bool(f, false, f)
	}
	slugFlag := fs.String("slug", "", "request a friendly slug for a new lease")
	ttl := fs.Duration("ttl", 90*time.Minute, "maximum lease lifetime")
	idle := fs.Duration("idle-timeout", 30*time.Minute, "idle timeout")
	leaseIDFlag := fs.String("lease-id", "", "fixed lease ID for idempotent external-provider orchestration")
	fs.Bool("keep", true, "keep server after warmup")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	slug := ""
	if strings.TrimSpace(*slugFlag) != "" { // requestedLeaseSlug
		slug = normalizeSlug(*slugFlag)
		if slug == "" {
			return exit(2, "--slug must contain at least one letter or digit")
		}
		if len(slug) > 41 {
			return exit(2, "--slug must be %d characters or fewer after normalization", 41)
		}
	}
	p, err := c.provider(fs, *provider, "")
	if err != nil {
		return err
	}
	if id := strings.TrimSpace(*leaseIDFlag); id != "" {
		if !canonicalLeaseID.MatchString(id) {
			return exit(2, "--lease-id must match cbx_<12 lowercase hex characters>")
		}
		if !coordinated[p] { // no IdempotentLeaseIDBackend
			return exit(2, "provider=%s does not support fixed idempotent lease IDs", p)
		}
	}
	if p == "ssh" {
		return c.warmupStatic(slug, *idle, *ttl)
	}
	return c.warmupCoordinator(p, strings.TrimSpace(*leaseIDFlag), slug, *idle, *ttl)
}

// coordLease is a coordinator lease record (CoordinatorLease, internal/cli/coordinator.go; states
// provisioning, active, released, expired, failed: LeaseRecord in worker/src/types.ts).
type coordLease struct {
	ID                 string `json:"id"`
	Slug               string `json:"slug,omitempty"`
	Provider           string `json:"provider"`
	TargetOS           string `json:"target,omitempty"`
	Owner              string `json:"owner"`
	Org                string `json:"org"`
	Profile            string `json:"profile"`
	Class              string `json:"class"`
	ServerType         string `json:"serverType"`
	ServerID           int64  `json:"serverID"`
	CloudID            string `json:"cloudID"`
	ServerName         string `json:"serverName"`
	Host               string `json:"host"`
	SSHUser            string `json:"sshUser"`
	SSHPort            string `json:"sshPort"`
	SSHHostKey         string `json:"sshHostKey,omitempty"`
	WorkRoot           string `json:"workRoot"`
	Keep               bool   `json:"keep"`
	State              string `json:"state"`
	TTLSeconds         int    `json:"ttlSeconds,omitempty"`
	IdleTimeoutSeconds int    `json:"idleTimeoutSeconds,omitempty"`
	CreatedAt          string `json:"createdAt,omitempty"`
	LastTouchedAt      string `json:"lastTouchedAt,omitempty"`
	ExpiresAt          string `json:"expiresAt"`
}

// stored is a coordinator lease with its private fields, as kept on disk.
type stored struct {
	coordLease
	KeyPath string `json:"keyPath"`
	BoxPID  int    `json:"boxPid"`
	BoxDir  string `json:"boxDir"`
	HostKey string `json:"hostKey"`
}

func (c *cli) coordPath(id string) string { return filepath.Join(c.dir, "coordinator", id+".json") }

func (c *cli) loadCoord(ident string) (*stored, bool) {
	entries, _ := os.ReadDir(filepath.Join(c.dir, "coordinator"))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(c.dir, "coordinator", e.Name()))
		if err != nil {
			continue
		}
		var s stored
		if json.Unmarshal(b, &s) == nil && (s.ID == ident || (s.Slug != "" && s.Slug == normalizeSlug(ident))) {
			return &s, true
		}
	}
	return nil, false
}

func (c *cli) saveCoord(s *stored) error { return saveJSON(c.coordPath(s.ID), s) }

// saveJSON writes v as indented JSON to path (temp, fsync, rename).
func saveJSON(path string, v any) error {
	b, _ := json.MarshalIndent(v, "", "  ")
	return atomicfile.Write(path, b, 0o600)
}

func terminal(state string) bool { // statusTerminalState, internal/cli/status.go
	switch strings.ToLower(strings.TrimSpace(state)) {
	case "deleting", "expired", "failed", "missing", "released", "stopped", "stopped_with_code", "terminated":
		return true
	}
	return false
}

func labelTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (c *cli) warmupCoordinator(p, leaseID, slug string, idle, ttl time.Duration) error {
	if leaseID == "" {
		leaseID = newLeaseID()
	}
	s, exists := c.loadCoord(leaseID)
	switch {
	case exists && s.ID == leaseID && terminal(s.State):
		return exit(1, "coordinator POST /v1/leases: http 409: {\"error\":\"lease_id_conflict\"}")
	case exists && s.ID == leaseID:
		// the coordinator's create attempt for a requested lease id returns the same lease
	default:
		if slug == "" {
			slug = newSlug(leaseID)
		}
		now := time.Now().UTC()
		s = &stored{coordLease: coordLease{ID: leaseID, Slug: slug, Provider: p, TargetOS: "linux", Owner: "ci@openclaw", Org: "openclaw",
			Profile: "default", Class: "standard", ServerType: "cx22", ServerID: now.UnixNano() % 1e6, CloudID: strconv.FormatInt(now.UnixNano()%1e6, 10),
			ServerName: "crabbox-" + slug, WorkRoot: "/work/crabbox", Keep: true, State: "provisioning",
			TTLSeconds: int(ttl / time.Second), IdleTimeoutSeconds: int(idle / time.Second),
			CreatedAt: labelTime(now), LastTouchedAt: labelTime(now), ExpiresAt: labelTime(expires(now, now, ttl, idle))}}
		if err := c.saveCoord(s); err != nil {
			return err
		}
		if err := c.startBox(s); err != nil {
			s.State = "failed"
			_ = c.saveCoord(s)
			return err
		}
		if !hostKeyed[p] {
			s.SSHHostKey = ""
		}
		s.State = "active"
		if err := c.saveCoord(s); err != nil {
			return err
		}
	}
	hold()
	fmt.Fprintf(c.out, "leased %s slug=%s provider=%s server=%d type=%s ip=%s idle_timeout=%s expires=%s\n",
		s.ID, s.Slug, s.Provider, s.ServerID, s.ServerType, s.Host, time.Duration(s.IdleTimeoutSeconds)*time.Second, s.ExpiresAt)
	fmt.Fprintf(c.out, "ready ssh=%s@%s:%s network=public workroot=%s\n", s.SSHUser, s.Host, s.SSHPort, s.WorkRoot)
	fmt.Fprintf(c.out, "warmup complete total=%s\n", time.Millisecond)
	return nil
}

// expires is directLeaseExpiresAtFrom (internal/cli/provider_labels.go): the idle deadline,
// capped by the TTL.
func expires(created, touched time.Time, ttl, idle time.Duration) time.Time {
	e := touched.Add(idle)
	if ttl > 0 && created.Add(ttl).Before(e) {
		e = created.Add(ttl)
	}
	return e
}

// hold implements LEASE_CRABBOX_HOLD: the lease exists, its "leased" line is not printed yet.
func hold() {
	path := os.Getenv("LEASE_CRABBOX_HOLD")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path+".done", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return // held once already
	}
	f.Close()
	_ = os.WriteFile(path+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o600)
	_ = os.Rename(path+".tmp", path)
	select {} // until killed
}

// startBox backs a coordinator lease with `openclaw localbox`, detached so it outlives this call.
func (c *cli) startBox(s *stored) error {
	bin := os.Getenv("LEASE_CRABBOX_LOCALBOX")
	if bin == "" {
		return exit(1, "LEASE_CRABBOX_LOCALBOX is not set: no machine to lease")
	}
	s.BoxDir = filepath.Join(c.dir, "boxes", s.ID)
	st, err := boxproc.Start(bin, s.BoxDir, s.ID)
	if err != nil {
		return err
	}
	s.BoxPID, s.KeyPath, s.HostKey = st.PID, st.ClientKeyPath, st.HostKey
	s.Host, s.SSHPort, s.SSHUser, s.SSHHostKey = "127.0.0.1", strconv.Itoa(st.Port), st.User, st.HostKey
	return nil
}

// reachable is probeSSHReady reduced to a TCP connect (loopback only in tests).
func reachable(host, port string) bool {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 2*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// statusView is StatusView (internal/cli/status.go): sshPort is a string for every provider.
type statusView struct {
	ID            string            `json:"id"`
	Slug          string            `json:"slug,omitempty"`
	Provider      string            `json:"provider"`
	TargetOS      string            `json:"target"`
	State         string            `json:"state"`
	ServerID      string            `json:"serverId"`
	ServerType    string            `json:"serverType"`
	Host          string            `json:"host"`
	Network       string            `json:"network"`
	SSHHost       string            `json:"sshHost"`
	SSHHostKey    string            `json:"sshHostKey,omitempty"`
	SSHUser       string            `json:"sshUser"`
	SSHPort       string            `json:"sshPort"`
	SSHKey        string            `json:"sshKey"`
	LastTouchedAt string            `json:"lastTouchedAt,omitempty"`
	IdleTimeout   string            `json:"idleTimeout,omitempty"`
	ExpiresAt     string            `json:"expiresAt,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	HasHost       bool              `json:"hasHost"`
	Ready         bool              `json:"ready"`
}

func (s *stored) view() statusView {
	return statusView{ID: s.ID, Slug: s.Slug, Provider: s.Provider, TargetOS: "linux", State: s.State,
		ServerID: strconv.FormatInt(s.ServerID, 10), ServerType: s.ServerType, Host: s.Host, Network: "public",
		SSHHost: s.Host, SSHHostKey: s.SSHHostKey, SSHUser: s.SSHUser, SSHPort: s.SSHPort, SSHKey: s.KeyPath,
		LastTouchedAt: s.LastTouchedAt, IdleTimeout: (time.Duration(s.IdleTimeoutSeconds) * time.Second).String(),
		ExpiresAt: s.ExpiresAt, Labels: map[string]string{"keep": "true"}, HasHost: s.Host != "",
		Ready: s.State == "active" && s.Host != "" && reachable(s.Host, s.SSHPort)}
}

// idFlags parses `--provider P --id X [--json]`, the id also as the first argument
// (setIDFromFirstArg).
func (c *cli) idFlags(name string, args []string) (provider, id string, jsonOut bool, err error) {
	fs := c.newFlagSet(name)
	p := fs.String("provider", "", "provider")
	idf := fs.String("id", "", "lease id or slug")
	j := fs.Bool("json", false, "print JSON")
	fs.Duration("idle-timeout", 0, "replace the lease idle timeout while heartbeating")
	if err := parseFlags(fs, args); err != nil {
		return "", "", false, err
	}
	if *idf == "" && fs.NArg() > 0 {
		*idf = fs.Arg(0)
	}
	if strings.TrimSpace(*idf) == "" {
		return "", "", false, exit(2, "usage: crabbox %s --id <lease-id-or-slug>", name)
	}
	pr, err := c.provider(fs, *p, *idf)
	return pr, *idf, *j, err
}

func notFound(method, path string) error {
	return exit(1, "coordinator %s %s: http 404: {\"error\":\"not_found\"}", method, path)
}

func (c *cli) inspect(args []string) error {
	p, id, jsonOut, err := c.idFlags("inspect", args)
	if err != nil {
		return err
	}
	var v statusView
	if p == "ssh" {
		sl, err := c.resolveStatic(id)
		if err != nil {
			return err
		}
		v = sl.view()
	} else {
		s, ok := c.loadCoord(id)
		if !ok || s.Provider != p {
			return notFound("GET", "/v1/leases/"+id)
		}
		v = s.view()
	}
	if jsonOut {
		return json.NewEncoder(c.out).Encode(v)
	}
	fmt.Fprintf(c.out, "id=%s\nslug=%s\nprovider=%s\nstate=%s\nhost=%s\nssh=%s -p %s %s@%s\nexpires=%s\n",
		v.ID, v.Slug, v.Provider, v.State, v.Host, v.SSHKey, v.SSHPort, v.SSHUser, v.SSHHost, v.ExpiresAt)
	return nil
}

func (c *cli) heartbeat(args []string) error {
	p, id, jsonOut, err := c.idFlags("heartbeat", args)
	if err != nil {
		return err
	}
	var view map[string]string
	now := time.Now().UTC()
	if p == "ssh" { // internal/cli/heartbeat.go
		sl, err := c.resolveStatic(id)
		if err != nil {
			return err
		}
		if terminal(sl.state) {
			return exit(5, "lease %s is in terminal state %s", id, sl.state)
		}
		if sl.claim == nil {
			return exit(4, "lease %s is not claimed for provider=ssh; refusing heartbeat", id)
		}
		sl.claim.LastUsedAt = labelTime(now)
		if err := c.saveClaim(sl.claim); err != nil {
			return err
		}
		view = map[string]string{"id": sl.leaseID, "slug": sl.slug, "provider": "ssh", "state": sl.state}
	} else {
		s, ok := c.loadCoord(id)
		if !ok || s.Provider != p {
			return notFound("POST", "/v1/leases/"+id+"/heartbeat")
		}
		if s.State != "active" {
			return exit(1, "coordinator POST /v1/leases/%s/heartbeat: http 409: {\"error\":\"lease_not_active\",\"state\":%q}", id, s.State)
		}
		created, _ := time.Parse(time.RFC3339, s.CreatedAt)
		s.LastTouchedAt = labelTime(now)
		s.ExpiresAt = labelTime(expires(created, now, time.Duration(s.TTLSeconds)*time.Second, time.Duration(s.IdleTimeoutSeconds)*time.Second))
		if err := c.saveCoord(s); err != nil {
			return err
		}
		view = map[string]string{"id": s.ID, "slug": s.Slug, "provider": s.Provider, "state": s.State, "expiresAt": s.ExpiresAt}
	}
	if jsonOut {
		return json.NewEncoder(c.out).Encode(view)
	}
	fmt.Fprintf(c.out, "heartbeat lease=%s slug=%s provider=%s state=%s\n", view["id"], view["slug"], view["provider"], view["state"])
	return nil
}

func (c *cli) stop(args []string) error {
	p, id, _, err := c.idFlags("stop", args)
	if err != nil {
		return err
	}
	if f := os.Getenv("LEASE_CRABBOX_STOP_FAILS"); f != "" {
		if _, err := os.Stat(f); err == nil {
			return exit(1, "coordinator POST /v1/leases/%s/release: http 503: {\"error\":\"unavailable\"}", id)
		}
	}
	if p == "ssh" { // ReleaseLease removes only the local claim (internal/providers/ssh/backend.go)
		sl, err := c.resolveStatic(id)
		if err != nil {
			return err
		}
		_ = os.Remove(c.claimPath(sl.leaseID))
		fmt.Fprintf(c.errw, "released static lease=%s host=%s\n", sl.leaseID, sl.host)
		return nil
	}
	s, ok := c.loadCoord(id)
	if !ok || s.Provider != p {
		fmt.Fprintf(c.errw, "warning: could not inspect lease before release: coordinator GET /v1/leases/%s: http 404: {\"error\":\"not_found\"}\n", id)
		return notFound("POST", "/v1/leases/"+id+"/release")
	}
	if s.State != "released" {
		boxproc.Stop(s.BoxPID, s.BoxDir)
		s.State = "released"
		if err := c.saveCoord(s); err != nil {
			return err
		}
	}
	fmt.Fprintf(c.errw, "released lease=%s server=%d\n", s.ID, s.ServerID)
	return nil
}

// server is the raw Server a direct provider's list --json prints (internal/cli/hcloud.go).
type server struct {
	CloudID   string            `json:"CloudID"`
	Provider  string            `json:"Provider"`
	HostID    string            `json:"HostID"`
	ID        int64             `json:"id"`
	Name      string            `json:"name"`
	Status    string            `json:"status"`
	Labels    map[string]string `json:"labels"`
	PublicNet struct {
		IPv4 struct {
			IP string `json:"ip"`
		} `json:"ipv4"`
	} `json:"public_net"`
	PrivateNet struct {
		IPv4 struct {
			IP string `json:"ip"`
		} `json:"ipv4"`
	} `json:"private_net"`
	ServerType struct {
		Name string `json:"name"`
	} `json:"server_type"`
}

func (c *cli) list(args []string) error {
	fs := c.newFlagSet("list")
	p := fs.String("provider", "", "provider")
	jsonOut := fs.Bool("json", false, "print JSON")
	fs.Bool("all", false, "include provider inventory outside Crabbox-owned leases where supported")
	fs.Bool("refresh", false, "refresh provider-backed state where supported")
	fs.String("pond", "", "only list leases tagged with this pond")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pr, err := c.provider(fs, *p, "")
	if err != nil {
		return err
	}
	var out any
	if pr == "ssh" { // staticLeaseBackend.List: the claimed lease, else the configured one
		sl, err := c.resolveStatic("")
		if err != nil {
			return err
		}
		out = []server{sl.server()}
	} else { // coord.Leases(ctx, "active", 1000) filtered by provider (provider_coordinator.go)
		leases := []coordLease{}
		entries, _ := os.ReadDir(filepath.Join(c.dir, "coordinator"))
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(c.dir, "coordinator", e.Name()))
			var s stored
			if json.Unmarshal(b, &s) == nil && s.Provider == pr && !terminal(s.State) {
				leases = append(leases, s.coordLease)
			}
		}
		sort.Slice(leases, func(i, j int) bool { return leases[i].ID < leases[j].ID })
		out = leases
	}
	if *jsonOut {
		return json.NewEncoder(c.out).Encode(out)
	}
	b, _ := json.Marshal(out)
	fmt.Fprintln(c.out, string(b))
	return nil
}
