package bootstrap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/protocol"
)

// Recorder is the part of the environment manager bootstrap reports to.
type Recorder interface {
	Note(ctx context.Context, id, text string)
	SetWorker(ctx context.Context, id, bundleHash, socket, home string) error
	// RecordStep adds an entry to the environment's timeline.
	RecordStep(ctx context.Context, id string, s envs.Step)
	// SetSetupKey records the cache key of a setup phase that succeeded; Fail fails the
	// environment (and releases its lease) when one did not.
	SetSetupKey(ctx context.Context, id, key string) error
	Fail(ctx context.Context, id, reason string)
	// Hold keeps the environment counted as in use (not idle) until release is called.
	Hold(id string) (release func())
}

// Config configures a Bootstrapper.
type Config struct {
	Tunnels     *tunnel.Mux
	Workers     *hub.Server
	Credentials *hub.Credentials
	Envs        Recorder
	// Audit writes an audit row (host key mismatches, worker launches).
	Audit func(ctx context.Context, kind, envID, detail string)
	// BundleDir holds cross-built bundles (openclaw-linux-arm64, …) for boxes of another platform.
	BundleDir string
	// KeepBundles is how many bundles stay on a box (default 3).
	KeepBundles int
	// AdmitTimeout bounds the wait for a launched worker to be admitted (default 60s).
	AdmitTimeout time.Duration
	// CredentialTTL is the lifetime of a minted worker credential (default 72h; workers refresh it).
	CredentialTTL time.Duration
	// RelaunchGrace is how long a disconnected worker has to come back before it is checked and
	// relaunched (default 5s).
	RelaunchGrace time.Duration
	DialTimeout   time.Duration
	// CommandTimeout bounds one short command on a box (platform, hygiene, launch, pidfile)
	// (default 1m); BootstrapTimeout bounds a whole bootstrap, bundle upload included (default
	// 15m); ReleaseTimeout bounds the box-side cleanup at destroy, which is best effort: the
	// provider's destroy follows whether it finished or not (default 15s).
	CommandTimeout, BootstrapTimeout, ReleaseTimeout time.Duration
	// Keepalive is the keepalive of the sync and bootstrap connections (the tunnel's defaults).
	Keepalive tunnel.KeepaliveConfig
	Log       *slog.Logger
	// Clock paces the worker supervisors and times uploads; the real clock when nil. It is the
	// keepalive's clock too unless Keepalive names one.
	Clock clock.Clock
}

// Bootstrapper brings leased machines to ready: bundle, hygiene, tunnel, worker, admission.
type Bootstrapper struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	watchers map[string]context.CancelFunc // env id → worker supervisor
	wg       sync.WaitGroup
}

var (
	_ envs.Bootstrapper = (*Bootstrapper)(nil)
	_ envs.Resumer      = (*Bootstrapper)(nil)
	_ envs.Releaser     = (*Bootstrapper)(nil)
)

// New returns a Bootstrapper.
func New(cfg Config) *Bootstrapper {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepBundles == 0 {
		cfg.KeepBundles = 3
	}
	if cfg.AdmitTimeout == 0 {
		cfg.AdmitTimeout = 60 * time.Second
	}
	if cfg.CredentialTTL == 0 {
		cfg.CredentialTTL = 72 * time.Hour
	}
	if cfg.RelaunchGrace == 0 {
		cfg.RelaunchGrace = 5 * time.Second
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 20 * time.Second
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = time.Minute
	}
	if cfg.BootstrapTimeout == 0 {
		cfg.BootstrapTimeout = 15 * time.Minute
	}
	if cfg.ReleaseTimeout == 0 {
		cfg.ReleaseTimeout = 15 * time.Second
	}
	if cfg.Audit == nil {
		cfg.Audit = func(context.Context, string, string, string) {}
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Keepalive.Clock == nil {
		cfg.Keepalive.Clock = cfg.Clock
	}
	return &Bootstrapper{cfg: cfg, log: cfg.Log, watchers: map[string]context.CancelFunc{}}
}

// Close stops the worker supervisors and waits for them until ctx ends.
func (b *Bootstrapper) Close(ctx context.Context) error {
	b.mu.Lock()
	for _, c := range b.watchers {
		c()
	}
	b.mu.Unlock()
	return shutdown.Wait(ctx, &b.wg, "worker supervisors")
}

// Target is how the gateway reaches an environment's box.
func Target(env envs.Environment) tunnel.Target {
	return tunnel.Target{EnvironmentID: env.ID, Host: env.Lease.SSHHost, Port: env.Lease.SSHPort, User: env.Lease.SSHUser,
		KeyPath: env.Lease.SSHKeyPath, HostKeys: env.Lease.HostKeys, SocketPath: env.WorkerSocket}
}

// Dial opens the second (sync/bootstrap) SSH connection with the same pinned trust and its own
// keepalive (a box that stops answering has the connection closed); a host key mismatch is
// audited.
func (b *Bootstrapper) Dial(ctx context.Context, env envs.Environment) (*ssh.Client, error) {
	c, err := tunnel.DialBox(ctx, Target(env), b.cfg.DialTimeout, b.cfg.Keepalive)
	var hk *tunnel.HostKeyMismatchError
	if errors.As(err, &hk) {
		b.cfg.Audit(ctx, "ssh.hostkey-mismatch", env.ID, hk.Error())
	}
	return c, err
}

// StateDir is the worker's state directory on the box, relative to HOME.
func StateDir(envID string) string { return ".openclaw-worker/state/" + envID }

// socketPath chooses the forwarded socket path: inside the state dir when it fits the unix socket
// path limit, else in tmpSocketDir.
func socketPath(home, envID string) string {
	if dir := tmpSocketDir(home, envID); dir != "" {
		return dir + "/gateway.sock"
	}
	return path.Join(home, StateDir(envID), "gateway.sock")
}

// tmpSocketDir is the short private directory under /tmp (/tmp/ocw-<12 hex>) that holds the
// forwarded socket of an environment whose state dir is too deep for a unix socket path, or ""
// when the socket fits in the state dir. The tunnel creates it; release removes it.
func tmpSocketDir(home, envID string) string {
	if len(path.Join(home, StateDir(envID), "gateway.sock")) <= 100 {
		return ""
	}
	sum := sha256.Sum256([]byte(home + "\x00" + envID))
	return "/tmp/ocw-" + hex.EncodeToString(sum[:6])
}

// maxHome bounds the HOME a box reports: it is stored with the environment and shown by the API.
const maxHome = 1024

// validHome reports whether a box's HOME is an absolute path of at most maxHome printable bytes.
func validHome(h string) bool {
	if len(h) > maxHome || !strings.HasPrefix(h, "/") {
		return false
	}
	for _, r := range h {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Bootstrap installs the bundle, checks hygiene, opens the tunnel, launches the worker and waits
// for its admission. Each step is recorded as a note on the environment.
func (b *Bootstrapper) Bootstrap(ctx context.Context, env envs.Environment) (err error) {
	ctx, cancel := context.WithTimeoutCause(ctx, b.cfg.BootstrapTimeout,
		fmt.Errorf("bootstrap took longer than %s (box.bootstrapTimeout)", b.cfg.BootstrapTimeout))
	defer cancel()
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
	}()
	note := func(format string, args ...any) { b.cfg.Envs.Note(ctx, env.ID, fmt.Sprintf(format, args...)) }
	defer func() {
		if err != nil {
			b.cfg.Tunnels.CloseEnv(env.ID)
		}
	}()
	// Each step is a timeline entry: its name, start, duration and result.
	stepName, stepStart := "ssh", b.cfg.Clock.Now()
	step := func(next string, err error) {
		st := envs.Step{Kind: envs.StepBootstrap, Name: stepName, StartedAt: stepStart, Result: envs.ResultOK}
		st.DurationMs = b.cfg.Clock.Now().Sub(stepStart).Milliseconds()
		if err != nil {
			st.Result, st.Detail = envs.ResultFailed, err.Error()
		}
		b.cfg.Envs.RecordStep(context.WithoutCancel(ctx), env.ID, st)
		stepName, stepStart = next, b.cfg.Clock.Now()
	}
	defer func() {
		if err != nil && stepName != "" {
			step("", err)
		}
	}()
	c, err := b.Dial(ctx, env)
	if err != nil {
		return fmt.Errorf("ssh %s@%s:%d: %w", env.Lease.SSHUser, env.Lease.SSHHost, env.Lease.SSHPort, err)
	}
	defer c.Close()
	note("ssh: connected to %s:%d, host key pinned", env.Lease.SSHHost, env.Lease.SSHPort)
	step("platform", nil)

	out, err := b.runOK(ctx, c, "detect platform", `uname -s -m; printf '%s\n' "$HOME"`)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !validHome(lines[1]) {
		return fmt.Errorf("detect platform: unexpected output %.300q (want uname -s -m, then an absolute HOME of at most %d printable bytes)", out, maxHome)
	}
	goos, goarch, err := Platform(lines[0])
	if err != nil {
		return err
	}
	home := lines[1]
	bundle, err := SelectBundle(goos, goarch, b.cfg.BundleDir)
	if err != nil {
		return err
	}
	step("bundle", nil)
	start := b.cfg.Clock.Now()
	inst, err := Install(ctx, c, home, bundle, b.cfg.KeepBundles)
	if err != nil {
		return err
	}
	if inst.Uploaded == 0 {
		note("bundle: %s/%s %s already installed (0 bytes uploaded)", goos, goarch, bundle.SHA256[:12])
	} else {
		note("bundle: %s/%s %s uploaded, %d bytes in %s", goos, goarch, bundle.SHA256[:12], inst.Uploaded, b.cfg.Clock.Now().Sub(start).Round(time.Millisecond))
	}
	step("hygiene", nil)

	hctx, hcancel := b.command(ctx)
	checks, herr := CheckHygiene(hctx, c, env.Profile)
	hcancel()
	for _, ch := range checks {
		note("check %s: %s (%s; policy %s)", ch.Name, ch.Result(), ch.Detail, ch.Policy)
	}
	if herr != nil {
		return herr
	}
	step("tunnel", nil)

	sock := socketPath(home, env.ID)
	if err := b.cfg.Envs.SetWorker(ctx, env.ID, bundle.SHA256, sock, home); err != nil {
		return err
	}
	env.BundleHash, env.WorkerSocket, env.WorkerHome = bundle.SHA256, sock, home
	if err := b.cfg.Tunnels.Open(ctx, Target(env)); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	note("tunnel: reverse forward of %s connected", sock)
	step("launch", nil)

	if err := b.launch(ctx, c, env, inst.RemotePath); err != nil {
		return err
	}
	step("admission", nil)
	actx, cancel := context.WithTimeout(ctx, b.cfg.AdmitTimeout)
	defer cancel()
	if err := b.cfg.Workers.WaitAdmitted(actx, env.ID); err != nil {
		tail, _ := b.runOK(ctx, c, "worker log", "tail -c 600 "+untrusted.Quote(path.Join(home, StateDir(env.ID), "worker.log"))+" 2>/dev/null || true")
		return fmt.Errorf("worker not admitted within %s: %v; worker log: %s", b.cfg.AdmitTimeout, err, strings.TrimSpace(tail))
	}
	note("worker: admitted")
	step("", nil)
	b.supervise(env)
	return nil
}

// launch starts the worker unless it still runs (liveWorkerPID); a fresh credential is minted for
// every launch, and those of earlier launches are revoked.
func (b *Bootstrapper) launch(ctx context.Context, c *ssh.Client, env envs.Environment, bundlePath string) error {
	state := path.Join(env.WorkerHome, StateDir(env.ID))
	actx, acancel := b.command(ctx)
	pid, alive := workerAlive(actx, c, env.WorkerHome, env.ID)
	acancel()
	if alive {
		b.cfg.Envs.Note(ctx, env.ID, "worker: already running (pid "+strconv.Itoa(pid)+")")
		return nil
	}
	cred, err := b.cfg.Credentials.MintSole(ctx, env.ID, env.BundleHash, b.cfg.CredentialTTL, nil)
	if err != nil {
		return fmt.Errorf("mint worker credential: %w", err)
	}
	d := protocol.LaunchDescriptor{EnvironmentID: env.ID, Credential: cred, BundleHash: env.BundleHash, SocketPath: env.WorkerSocket,
		StateDir: state, Version: version.Version}
	raw, _ := json.Marshal(d)
	wctx, wcancel := b.command(ctx)
	err = writeRemote(wctx, c, state, "launch.json", raw)
	wcancel()
	if err != nil {
		return fmt.Errorf("write launch descriptor: %w", err)
	}
	script := `set -e
state=` + untrusted.Quote(state) + `
cd "$state"
S=; command -v setsid >/dev/null 2>&1 && S=setsid
$S env -i PATH=` + WorkerPath + ` HOME="$HOME" LANG=C.UTF-8 ` + untrusted.Quote(bundlePath) + ` worker --descriptor "$state/launch.json" --log-file "$state/worker.log" </dev/null >"$state/worker.out" 2>&1 &
echo $! > "$state/worker.pid"
echo $!`
	out, err := b.runOK(ctx, c, "launch worker", script)
	if err != nil {
		return err
	}
	newPID := strings.TrimSpace(out)
	if _, err := strconv.ParseUint(newPID, 10, 31); err != nil {
		return fmt.Errorf("launch worker: the box answered %.64q, not a pid", newPID)
	}
	b.cfg.Audit(ctx, "worker.launch", env.ID, "pid "+newPID+" bundle "+env.BundleHash)
	b.cfg.Envs.Note(ctx, env.ID, "worker: launched (pid "+newPID+")")
	return nil
}

// workerAlive returns the pid of the worker of envID on the box while it runs (liveWorkerPID).
func workerAlive(ctx context.Context, c *ssh.Client, home, envID string) (int, bool) {
	res, err := Run(ctx, c, liveWorkerPID(home, envID)+` && echo "$p"`)
	if err != nil || res.ExitCode != 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	return pid, err == nil
}

// writeRemote writes a 0600 file in dir (created 0700) through a temp name and a rename.
func writeRemote(ctx context.Context, c *ssh.Client, dir, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := tunnel.CloseOnDone(ctx, c) // sftp calls take no context: a silent box is cut off
	defer stop()
	sc, err := sftp.NewClient(c)
	if err != nil {
		return err
	}
	defer sc.Close()
	if err := sc.MkdirAll(dir); err != nil {
		return err
	}
	_ = sc.Chmod(dir, 0o700)
	tmp := path.Join(dir, "."+name+".tmp-"+ids.Hex(4))
	f, err := sc.OpenFile(tmp, 0x1|0x40|0x200) // O_WRONLY|O_CREATE|O_TRUNC
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := sc.PosixRename(tmp, path.Join(dir, name)); err != nil {
		return sc.Rename(tmp, path.Join(dir, name))
	}
	return nil
}

// Resume re-attaches to a ready environment after a gateway restart: re-open the tunnel, and
// relaunch the worker if it is not re-admitted.
func (b *Bootstrapper) Resume(ctx context.Context, env envs.Environment) error {
	if env.WorkerSocket == "" {
		return errors.New("no worker recorded for this environment")
	}
	if err := b.cfg.Tunnels.Open(ctx, Target(env)); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	b.cfg.Envs.Note(ctx, env.ID, "tunnel: re-opened after gateway restart")
	if err := b.ensureWorker(ctx, env); err != nil {
		return err
	}
	b.supervise(env)
	return nil
}

// ensureWorker waits for the worker to be admitted, relaunching it if its process is gone.
func (b *Bootstrapper) ensureWorker(ctx context.Context, env envs.Environment) error {
	gctx, cancel := context.WithTimeout(ctx, b.cfg.RelaunchGrace)
	err := b.cfg.Workers.WaitAdmitted(gctx, env.ID)
	cancel()
	if err == nil {
		b.cfg.Envs.Note(ctx, env.ID, "worker: re-admitted")
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c, err := b.Dial(ctx, env)
	if err != nil {
		return err
	}
	defer c.Close()
	bundlePath := path.Join(env.WorkerHome, BundlesDir, env.BundleHash, "openclaw")
	if err := b.launch(ctx, c, env, bundlePath); err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, b.cfg.AdmitTimeout)
	defer cancel()
	if err := b.cfg.Workers.WaitAdmitted(actx, env.ID); err != nil {
		return fmt.Errorf("worker not re-admitted: %w", err)
	}
	b.cfg.Envs.Note(ctx, env.ID, "worker: re-admitted")
	return nil
}

// supervise watches an admitted worker and relaunches it when it stays away past the grace period.
func (b *Bootstrapper) supervise(env envs.Environment) {
	b.mu.Lock()
	if cancel, ok := b.watchers[env.ID]; ok {
		cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.watchers[env.ID] = cancel
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		for {
			if clock.Sleep(ctx, b.cfg.Clock, b.cfg.RelaunchGrace) != nil {
				return
			}
			if b.cfg.Workers.Admitted(env.ID) || !b.cfg.Tunnels.Status(env.ID).Up() {
				continue // fine, or the tunnel is reconnecting and the worker will follow it
			}
			b.log.Warn("worker not connected; checking it", "env", env.ID)
			if err := b.ensureWorker(ctx, env); err != nil && ctx.Err() == nil {
				b.cfg.Envs.Note(ctx, env.ID, "worker: "+err.Error())
			}
		}
	}()
}

// Release stops the worker and its tunnel before the machine goes away. The box-side part (ask
// the worker to shut down, kill its pidfile's process) is best effort, bounded by ReleaseTimeout
// and skipped when boxSide is false (a forced destroy); the gateway-side part (supervisor,
// tunnel, credentials) always happens. The error says why the box-side part did not finish.
func (b *Bootstrapper) Release(ctx context.Context, env envs.Environment, boxSide bool) error {
	b.mu.Lock()
	if cancel, ok := b.watchers[env.ID]; ok {
		cancel()
		delete(b.watchers, env.ID)
	}
	b.mu.Unlock()
	var err error
	if boxSide {
		rctx, cancel := context.WithTimeoutCause(ctx, b.cfg.ReleaseTimeout,
			fmt.Errorf("box did not finish its cleanup within %s (box.releaseTimeout)", b.cfg.ReleaseTimeout))
		err = b.releaseBox(rctx, env)
		if rctx.Err() != nil {
			err = context.Cause(rctx)
		}
		cancel()
	}
	b.cfg.Tunnels.CloseEnv(env.ID)
	if _, rerr := b.cfg.Credentials.RevokeEnv(ctx, env.ID); rerr != nil {
		b.log.Warn("revoke worker credentials", "env", env.ID, "err", rerr)
	}
	return err
}

// releaseBox asks the worker to shut down, kills its process and removes its socket directory
// under /tmp, if it has one.
func (b *Bootstrapper) releaseBox(ctx context.Context, env envs.Environment) error {
	if b.cfg.Workers.Admitted(env.ID) {
		_ = b.cfg.Workers.Shutdown(ctx, env.ID, "environment destroyed")
	}
	if env.WorkerHome == "" {
		return nil
	}
	c, err := b.Dial(ctx, env)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := Run(ctx, c, liveWorkerPID(env.WorkerHome, env.ID)+` && kill "$p" 2>/dev/null; true`); err != nil {
		return err
	}
	return b.removeSocketDir(ctx, c, env)
}

// removeSocketDir removes the environment's socket directory under /tmp (its socket, then the
// directory, which must then be empty), so that a box serving many environments does not gather
// one per environment. The path is the gateway's own (tmpSocketDir of the recorded home, and only
// if the recorded socket lies in it); on the box, a symlink there, or anything but a directory
// of the box user, is left alone. What it leaves is logged, not an error: the worker is gone.
func (b *Bootstrapper) removeSocketDir(ctx context.Context, c *ssh.Client, env envs.Environment) error {
	dir := tmpSocketDir(env.WorkerHome, env.ID)
	if dir == "" || env.WorkerSocket != dir+"/gateway.sock" {
		return nil
	}
	out, err := RunOK(ctx, c, "remove socket directory", `d=`+untrusted.Quote(dir)+`
if [ -L "$d" ] || { [ -e "$d" ] && { [ ! -d "$d" ] || [ ! -O "$d" ]; }; }; then echo not-ours; exit 0; fi
[ ! -e "$d" ] || { rm -f -- "$d/gateway.sock" && rmdir -- "$d"; }`)
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		b.log.Warn("socket directory left on the box", "env", env.ID, "dir", dir, "err", err)
	case strings.TrimSpace(out) == "not-ours":
		b.log.Warn("socket directory left on the box: not a directory of the box user", "env", env.ID, "dir", dir)
	}
	return nil
}

// command bounds one short box command.
func (b *Bootstrapper) command(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, b.cfg.CommandTimeout,
		fmt.Errorf("box did not answer within %s (box.commandTimeout)", b.cfg.CommandTimeout))
}

// runOK is RunOK bounded by CommandTimeout, naming the deadline when it passed.
func (b *Bootstrapper) runOK(ctx context.Context, c *ssh.Client, what, cmd string) (string, error) {
	cctx, cancel := b.command(ctx)
	defer cancel()
	out, err := RunOK(cctx, c, what, cmd)
	if err != nil && cctx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("%s: %w", what, context.Cause(cctx))
	}
	return out, err
}

// SetEnvs sets the recorder (the environment manager, which is built after the bootstrapper).
func (b *Bootstrapper) SetEnvs(r Recorder) { b.cfg.Envs = r }
