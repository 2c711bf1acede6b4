package local

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
)

// Provider leases local boxes: one detached `openclaw localbox` process per lease.
type Provider struct {
	cfg   Config
	log   *slog.Logger
	locks keyedMutex
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Lister    = (*Provider)(nil)
	_ providers.Renewer   = (*Provider)(nil)
	_ providers.Validator = (*Provider)(nil)
)

// Lease states reported by Inspect and List.
const (
	StateRunning      = "running"      // the box process is alive and its SSH port answers
	StateStarting     = "starting"     // the box process is alive but has not published its state yet
	StateUnresponsive = "unresponsive" // the box process is alive but its SSH port does not answer
	StateStopped      = "stopped"      // the box process is dead; its directory remains until Destroy (Gone)
	StateGone         = "gone"         // there is no box directory (Gone)
)

// Config configures a Provider.
type Config struct {
	// BoxesDir holds one directory per box, named by lease id (typically <data-dir>/boxes).
	BoxesDir string
	// Command is the argv that starts a box; the provider appends --dir, --lease-id and --label flags.
	// It defaults to [os.Executable(), "localbox"].
	Command []string
	Logger  *slog.Logger
	// StartTimeout bounds how long Provision waits for a new box to answer (default 15s).
	StartTimeout time.Duration
	// StopTimeout is how long Destroy waits after SIGTERM before it sends SIGKILL (default 5s).
	StopTimeout time.Duration
}

func (c *Config) setDefaults() error {
	if len(c.Command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable for localbox: %w", err)
		}
		c.Command = []string{exe, "localbox"}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 15 * time.Second
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 5 * time.Second
	}
	if c.BoxesDir != "" {
		abs, err := filepath.Abs(c.BoxesDir)
		if err != nil {
			return err
		}
		c.BoxesDir = abs
	}
	return nil
}

// Validate reports a configuration the provider cannot work with.
func (c Config) Validate() error {
	switch {
	case c.BoxesDir == "":
		return errors.New("local provider: boxes directory is required")
	case len(c.Command) == 0 || c.Command[0] == "":
		return errors.New("local provider: box command is required")
	case c.StartTimeout < 0 || c.StopTimeout < 0:
		return errors.New("local provider: timeouts must not be negative")
	}
	return nil
}

// New returns a Provider for cfg.
func New(cfg Config) (*Provider, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Provider{cfg: cfg, log: cfg.Logger}, nil
}

// LeaseIDFor is the lease id Provision uses for an operation id when the request carries none.
func LeaseIDFor(opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return "lb_" + hex.EncodeToString(sum[:])[:12]
}

// BoxDir is the directory (and HOME) of the box with the given lease id.
func (p *Provider) BoxDir(leaseID string) string { return BoxDir(p.cfg.BoxesDir, leaseID) }

// Warning is shown with every profile of the local box.
const Warning = "the local box is for development only: its workers run on the gateway's own machine, as the gateway's user, without isolation"

// ProfileWarnings implements providers.Warner.
func (p *Provider) ProfileWarnings(providers.Profile) []string { return []string{Warning} }

// BoxDir is the directory (and HOME) of the box with the given lease id under boxesDir.
func BoxDir(boxesDir, leaseID string) string { return filepath.Join(boxesDir, leaseID) }

// BoxesDir is where a gateway with data dir dataDir keeps its local boxes.
func BoxesDir(dataDir string) string { return filepath.Join(dataDir, "boxes") }

// ValidateSettings accepts only empty settings: the local provider has none.
func (p *Provider) ValidateSettings(settings json.RawMessage) error {
	if len(bytes.TrimSpace(settings)) == 0 || string(bytes.TrimSpace(settings)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(settings))
	dec.DisallowUnknownFields()
	var v struct{}
	if err := dec.Decode(&v); err != nil {
		return providers.Fieldf("settings", "the local provider takes no settings: %v", err)
	}
	return nil
}

// Provision starts a box for opID, or returns the live box an earlier call with the same
// operation id (or request lease id) started.
func (p *Provider) Provision(ctx context.Context, _ providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
	id := req.LeaseID
	if id == "" {
		if opID == "" {
			return providers.Lease{}, errors.New("local provider: operation id is required")
		}
		id = LeaseIDFor(opID)
	}
	if !ValidLeaseID(id) {
		return providers.Lease{}, fmt.Errorf("local provider: invalid lease id %q", id)
	}
	unlock := p.locks.lock(id)
	defer unlock()

	dir := p.BoxDir(id)
	if _, alive, err := probeBox(dir); err != nil {
		return providers.Lease{}, err
	} else if alive {
		// Adopt the box an earlier call started (it may still be coming up).
		st, err := p.waitReady(ctx, dir, nil)
		if err != nil {
			return providers.Lease{}, fmt.Errorf("adopt box %s: %w", id, err)
		}
		return p.leaseFromState(id, st), nil
	}

	st, err := p.start(ctx, id, req)
	if err != nil {
		return providers.Lease{}, fmt.Errorf("start box %s: %w", id, err)
	}
	lease := p.leaseFromState(id, st)
	p.log.Info("box provisioned", "lease", id, "port", st.Port, "pid", st.PID)
	return lease, lease.Validate()
}

// start launches a detached box process for id and waits until it answers.
func (p *Provider) start(ctx context.Context, id string, req providers.ProvisionRequest) (State, error) {
	dir := p.BoxDir(id)
	if err := os.MkdirAll(p.cfg.BoxesDir, 0o700); err != nil {
		return State{}, err
	}
	if err := prepareBoxDir(dir); err != nil {
		return State{}, err
	}
	if _, err := ensureClientKey(dir); err != nil {
		return State{}, fmt.Errorf("client key: %w", err)
	}
	// A state file left by a dead box must not be mistaken for the new box's.
	if err := os.Remove(statePath(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return State{}, err
	}
	logf, err := os.OpenFile(logPath(dir), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return State{}, err
	}
	args := append([]string{}, p.cfg.Command[1:]...)
	args = append(args, "--dir", dir, "--lease-id", id)
	if req.GatewayID != "" {
		args = append(args, "--label", providers.LabelGateway+"="+req.GatewayID)
	}
	if req.EnvironmentID != "" {
		args = append(args, "--label", providers.LabelEnvironment+"="+req.EnvironmentID)
	}
	cmd := exec.Command(p.cfg.Command[0], args...)
	cmd.Dir = dir
	cmd.Env = boxProcessEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = logf.Close()
	if err != nil {
		return State{}, err
	}
	exited := make(chan struct{})
	// Reap the box whenever it exits; it is detached and outlives this provider.
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	st, err := p.waitReady(ctx, dir, exited)
	if err != nil {
		_ = cmd.Process.Kill()
		return State{}, fmt.Errorf("%w%s", err, logTail(dir))
	}
	return st, nil
}

// boxProcessEnv is the environment of a box process: enough to run, none of the gateway's secrets.
func boxProcessEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "TZ", "GORACE", "GOCOVERDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// waitReady waits until the box in dir is alive, has published its state and answers SSH.
// exited, when not nil, reports that the process just started has died.
func (p *Provider) waitReady(ctx context.Context, dir string, exited <-chan struct{}) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if st, err := ReadState(dir); err == nil {
			if _, alive, _ := probeBox(dir); alive && sshAnswers(ctx, st) {
				return st, nil
			}
		}
		select {
		case <-exited:
			return State{}, errors.New("box process exited before it was ready")
		case <-ctx.Done():
			return State{}, fmt.Errorf("box not ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// sshAnswers reports whether an SSH server greets on the box's port.
func sshAnswers(ctx context.Context, st State) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(st.Host, strconv.Itoa(st.Port)))
	if err != nil {
		return false
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, 256), 256).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "SSH-2.0-")
}

// logTail returns the end of a box's log for an error message, bounded and on one line.
func logTail(dir string) string {
	b, err := os.ReadFile(logPath(dir))
	if err != nil || len(b) == 0 {
		return ""
	}
	const max = 512
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return ": box log: " + untrusted.Line(string(b), max)
}

func (p *Provider) leaseFromState(id string, st State) providers.Lease {
	return providers.Lease{
		ID:         id,
		SSHHost:    st.Host,
		SSHPort:    st.Port,
		SSHUser:    st.User,
		SSHKeyPath: clientKeyPath(p.BoxDir(id)),
		HostKeys:   []string{st.HostKey},
		Labels:     st.Labels,
	}
}

// Inspect reports the box of lease. A box whose process is dead is Gone.
func (p *Provider) Inspect(ctx context.Context, _ providers.Profile, lease providers.Lease) (providers.LeaseStatus, error) {
	if !ValidLeaseID(lease.ID) {
		return providers.LeaseStatus{}, fmt.Errorf("local provider: invalid lease id %q", lease.ID)
	}
	return p.status(ctx, lease.ID)
}

func (p *Provider) status(ctx context.Context, id string) (providers.LeaseStatus, error) {
	dir := p.BoxDir(id)
	ls := providers.LeaseStatus{LeaseID: id}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		ls.State, ls.Gone = StateGone, true
		return ls, nil
	} else if err != nil {
		return ls, err
	}
	st, stErr := ReadState(dir)
	if stErr == nil {
		ls.Labels = st.Labels
		ls.Lease = p.leaseFromState(id, st)
	}
	_, alive, err := probeBox(dir)
	switch {
	case err != nil:
		return ls, err
	case !alive:
		ls.State, ls.Gone = StateStopped, true
	case stErr != nil:
		ls.State = StateStarting
	case sshAnswers(ctx, st):
		ls.State, ls.Ready = StateRunning, true
	default:
		ls.State = StateUnresponsive
	}
	return ls, nil
}

// Destroy stops the box of lease (SIGTERM, then SIGKILL) and removes its directory.
func (p *Provider) Destroy(ctx context.Context, _ providers.Profile, lease providers.Lease) error {
	if !ValidLeaseID(lease.ID) {
		return fmt.Errorf("local provider: invalid lease id %q", lease.ID)
	}
	unlock := p.locks.lock(lease.ID)
	defer unlock()
	dir := p.BoxDir(lease.ID)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := p.stop(ctx, dir); err != nil {
		return fmt.Errorf("destroy box %s: %w", lease.ID, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("destroy box %s: %w", lease.ID, err)
	}
	p.log.Info("box destroyed", "lease", lease.ID)
	return nil
}

// stop ends the box process of dir and returns once it no longer holds the box lock.
func (p *Provider) stop(ctx context.Context, dir string) error {
	start := time.Now()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var termed, killed bool
	for {
		pid, alive, err := probeBox(dir)
		if err != nil {
			return err
		}
		if !alive {
			return nil
		}
		if pid > 1 && pid != os.Getpid() {
			switch {
			case !termed:
				termed = syscall.Kill(pid, syscall.SIGTERM) == nil
			case !killed && time.Since(start) > p.cfg.StopTimeout:
				killed = syscall.Kill(pid, syscall.SIGKILL) == nil
			}
		}
		if time.Since(start) > p.cfg.StopTimeout+5*time.Second {
			return fmt.Errorf("box process %d did not exit", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Renew does nothing: local boxes do not expire.
func (p *Provider) Renew(context.Context, providers.Profile, providers.Lease) error { return nil }

// List reports every box under the boxes directory, live or not.
func (p *Provider) List(ctx context.Context, _ providers.Profile) ([]providers.LeaseStatus, error) {
	entries, err := os.ReadDir(p.cfg.BoxesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []providers.LeaseStatus
	for _, e := range entries {
		if !e.IsDir() || !ValidLeaseID(e.Name()) {
			continue
		}
		if _, err := os.Stat(metaDir(p.BoxDir(e.Name()))); err != nil {
			continue
		}
		ls, err := p.status(ctx, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, ls)
	}
	return out, nil
}

// keyedMutex serialises operations on one lease id.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
