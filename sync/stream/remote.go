package stream

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/capbuf"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// DefaultCommand is how the worker executable is invoked on a box.
const DefaultCommand = "openclaw worker"

// Remote runs the box side of a sync (`openclaw worker unpack|pack|manifest`) through exec
// channels of the sync connection.
type Remote struct {
	Client *ssh.Client
	// Command invokes the worker executable (already shell-quoted as needed); DefaultCommand when
	// empty. Tests point it at a test binary.
	Command string
	// ManifestLimits bound manifests read from the box; defaults when zero.
	ManifestLimits manifest.Limits
	// Progress, when set, is called every ProgressInterval (DefaultProgressInterval when zero)
	// while Unpack (and so Push) sends files, and once more when the transfer ends, with Done set.
	// It is called from one goroutine at a time and never after Unpack returns.
	Progress         func(Progress)
	ProgressInterval time.Duration
	// Compression encodes what is sent to the box (CompressAuto when empty).
	Compression Compression
	// Channels is how many exec channels a cold sync of a large tree uses at once (one archive
	// each, applied together by one box process): 0 means DefaultChannels, 1 one channel.
	Channels int
	// Wire, when set, is told what each exec channel carried once it ends: the bytes sent to the
	// box (its stdin) and received from it (its stdout), as they crossed the connection (after
	// compression; SSH framing excluded).
	Wire func(sent, received int64)

	progressTick <-chan time.Time // tests: ticks instead of a ticker
	// tests: PushTree calls beforeList before listing the tree, and boxAnswered once it has the
	// box's manifest (with whether it started the unpack early).
	beforeList  func()
	boxAnswered func(prestarted bool)
}

func (r Remote) command(sub string, args ...string) string {
	c := r.Command
	if c == "" {
		c = DefaultCommand
	}
	parts := []string{c, sub}
	for _, a := range args {
		parts = append(parts, untrusted.Quote(a))
	}
	return strings.Join(parts, " ")
}

// RemoteError is a box command that exited non-zero.
type RemoteError struct {
	Command string
	Exit    int
	Stderr  string // bounded
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("box command %q: exit %d: %s", e.Command, e.Exit, e.Stderr)
}

// run runs cmd on the box, feeding stdin from in (when set) and handing stdout to out (when set).
func (r Remote) run(ctx context.Context, cmd string, in func(io.Writer) error, out func(io.Reader) error) error {
	sess, err := r.newSession(ctx)
	if err != nil {
		return err
	}
	return r.runOn(ctx, sess, cmd, in, out)
}

// newSession opens an exec channel, honouring ctx: a box that never answers the open has the
// connection closed when ctx ends (the caller's operation is over then).
func (r Remote) newSession(ctx context.Context) (*ssh.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open sync channel: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = r.Client.Close() })
	defer stop()
	sess, err := r.Client.NewSession()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("open sync channel: %w", err)
	}
	return sess, nil
}

// stopGrace is how long a stopped box command has, after its signals and its channel's close,
// to end before the whole connection is closed under it.
const stopGrace = 2 * time.Second

// runOn is run on a session already open; it closes it.
func (r Remote) runOn(ctx context.Context, sess *ssh.Session, cmd string, in func(io.Writer) error, out func(io.Reader) error) error {
	_, err := r.runOnAt(ctx, sess, cmd, in, out)
	return err
}

// runOnAt is runOn, also returning when the command exited.
func (r Remote) runOnAt(ctx context.Context, sess *ssh.Session, cmd string, in func(io.Writer) error, out func(io.Reader) error) (exited time.Time, _ error) {
	defer sess.Close()
	stdin, err := sess.StdinPipe()
	if err != nil {
		return time.Now(), err
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return time.Now(), err
	}
	if r.Wire != nil {
		cw, cr := &wireWriter{w: stdin}, &wireReader{r: stdout}
		stdin, stdout = cw, cr
		defer func() { r.Wire(cw.n.Load(), cr.n.Load()) }()
	}
	errb := capbuf.New(4 << 10)
	sess.Stderr = errb
	if err := sess.Start(cmd); err != nil {
		return time.Now(), fmt.Errorf("start %q: %w", cmd, err)
	}
	ended := make(chan struct{})
	defer close(ended)
	stop := context.AfterFunc(ctx, func() {
		signalUntil(sess, ssh.SIGKILL, ended)
		_ = sess.Close()
		// A box that ignores both (never sends exit or close) cannot hold the caller: the
		// connection goes, and every read and wait on it returns.
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-ended:
		case <-t.C:
			_ = r.Client.Close()
		}
	})
	defer stop()

	inErr := make(chan error, 1)
	go func() {
		var err error
		if in != nil {
			err = in(stdin)
		}
		if cerr := stdin.Close(); err == nil && cerr != nil && !errors.Is(cerr, io.EOF) {
			err = cerr
		}
		if err != nil {
			_ = sess.Close() // the box must not apply a partial stream
		}
		inErr <- err
	}()
	var outErr error
	if out != nil {
		outErr = out(stdout)
		if outErr != nil {
			_ = sess.Close()
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := sess.Wait()
	exited = time.Now()
	werr := <-inErr
	if err := ctx.Err(); err != nil {
		return exited, err
	}
	if outErr != nil {
		return exited, outErr
	}
	var ee *ssh.ExitError
	if errors.As(waitErr, &ee) {
		return exited, &RemoteError{Command: cmd, Exit: ee.ExitStatus(), Stderr: strings.TrimSpace(errb.String())}
	}
	if werr != nil {
		return exited, werr
	}
	if waitErr != nil {
		return exited, fmt.Errorf("box command %q: %w", cmd, waitErr)
	}
	return exited, nil
}

// signalUntil sends sig to the command of sess until done is closed: every 50 ms, for 2 s at
// most, or until the channel no longer takes requests. OpenSSH's sshd delivers a "signal" request
// with killpg(2) on the command's process group, which exists only once the forked command has
// called setsid(2): a signal sent right after the command started (a sync stopped at once, a
// loaded box) was lost, and the command ran on — a feed for FeedTimeout (10 s), holding the sync
// up until it gave up.
func signalUntil(sess *ssh.Session, sig ssh.Signal, done <-chan struct{}) {
	for range 40 {
		if sess.Signal(sig) != nil {
			return
		}
		select {
		case <-done:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ManifestOptions select the box manifest; they mirror manifest.Options.
type ManifestOptions struct {
	Mode             manifest.Mode
	Exclude, Include []string
	// CacheFile, when set, is a hash cache file on the box (`--cache`), so that a warm box does
	// not re-hash files that did not change.
	CacheFile string
	// RulePrefix: where the tree sits in the tree Exclude and Include were written for
	// (manifest.Options.RulePrefix).
	RulePrefix string
}

func (o ManifestOptions) args(dir string) []string {
	var a []string
	if o.Mode == manifest.ModeGit {
		a = append(a, "--git")
	}
	for _, x := range o.Exclude {
		a = append(a, "--exclude", x)
	}
	for _, x := range o.Include {
		a = append(a, "--include", x)
	}
	if o.CacheFile != "" {
		a = append(a, "--cache", o.CacheFile)
	}
	if o.RulePrefix != "" {
		a = append(a, "--rule-prefix", o.RulePrefix)
	}
	return append(a, dir)
}

// Manifest runs `manifest DIR` on the box and strictly decodes its output.
func (r Remote) Manifest(ctx context.Context, dir string, opts ManifestOptions) (*manifest.Manifest, error) {
	var m *manifest.Manifest
	err := r.run(ctx, r.command("manifest", opts.args(dir)...), nil, func(rd io.Reader) error {
		var err error
		m, err = manifest.Decode(rd, r.ManifestLimits)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("box manifest of %s: %w", dir, err)
	}
	return m, nil
}

// Unpack runs `unpack --dir DIR` on the box and streams the plan's archive of root into it.
func (r Remote) Unpack(ctx context.Context, dir, root string, plan Plan) (Stats, error) {
	return r.unpack(ctx, dir, root, plan, nil)
}

// unpack is Unpack calling sent (when set) for every file sent, with its stat and sha256. A
// streamed plan of a large tree goes over several channels (Remote.Channels): part 0 to
// `unpack --parts N --socket S`, the others to `feed --socket S` commands that hand their part to
// it; the box commits only when every part verified.
func (r Remote) unpack(ctx context.Context, dir, root string, plan Plan, sent func(string, fs.FileInfo, string, time.Time)) (Stats, error) {
	return r.startUnpack(ctx, dir, r.channels(plan), sent).send(root, plan)
}

// unpackRun is an unpack whose box commands are started (channels open, processes running,
// waiting for their streams) before its plan is given: PushTree starts one as soon as the box
// reports an empty directory, while the tree is still being listed, so that the box's start-up
// (a channel open and an exec, round trips on a real link, and the process's start) is not on the
// sync's path. send gives it the plan; abort ends it with nothing sent.
type unpackRun struct {
	r   Remote
	dir string
	n   int // parts
	c   counter

	ready   chan struct{} // closed by send or abort
	root    string
	parts   []Plan // nil: aborted
	done    chan struct{}
	stats   []Stats
	err     error
	started bool // send or abort was called
}

// startUnpack opens the channels of an unpack of n parts into dir and starts its commands.
// Every channel is open before any command starts: a box that refuses one more session
// (OpenSSH's MaxSessions) gets the sync over one channel instead of an unpack waiting for a feed
// that never comes.
func (r Remote) startUnpack(ctx context.Context, dir string, n int, sent func(string, fs.FileInfo, string, time.Time)) *unpackRun {
	u := &unpackRun{r: r, dir: dir, c: counter{sent: sent, compression: r.Compression}, ready: make(chan struct{}), done: make(chan struct{})}
	var sessions []*ssh.Session
	for range max(n, 1) {
		sess, err := r.newSession(ctx)
		if err != nil {
			if len(sessions) == 0 {
				u.finish(nil, err)
				return u
			}
			for _, s := range sessions[1:] {
				s.Close()
			}
			sessions = sessions[:1]
			break
		}
		sessions = append(sessions, sess)
	}
	u.n = len(sessions)
	cmds := []string{r.command("unpack", "--dir", dir)}
	if u.n > 1 {
		socket, err := feedSocket(dir)
		if err != nil {
			for _, s := range sessions {
				s.Close()
			}
			u.finish(nil, err)
			return u
		}
		cmds[0] = r.command("unpack", "--dir", dir, "--parts", strconv.Itoa(u.n), "--socket", socket)
		for range u.n - 1 {
			cmds = append(cmds, r.command("feed", "--socket", socket))
		}
	}
	go u.run(ctx, sessions, cmds)
	return u
}

// errAborted ends the stream of an unpack that is not going to be sent anything.
var errAborted = errors.New("sync not sent")

// run runs the commands, each fed its part once send gave them.
func (u *unpackRun) run(ctx context.Context, sessions []*ssh.Session, cmds []string) {
	source := func(e manifest.Entry) string { return filepath.Join(u.root, filepath.FromSlash(e.Path)) }
	stats := make([]Stats, u.n)
	if u.n == 1 {
		err := u.r.runOn(ctx, sessions[0], cmds[0], func(w io.Writer) error {
			<-u.ready
			if u.parts == nil {
				return errAborted
			}
			var err error
			stats[0], err = writeFrom(ctx, w, u.parts[0], source, &u.c)
			return err
		}, nil)
		u.finish(stats, err)
		return
	}
	// When one part's writer fails, every writer stops and ends its stream early, but no channel
	// is closed or killed: each box command sees its stream end, the unpack refuses the sync,
	// removes its staging and socket, and all exit. Once the unpack has exited (nothing can be
	// committed any more), the feeds are stopped: they hold nothing.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	var mu sync.Mutex
	var first error // the first writer failure
	note := func(e *error, err error) {
		mu.Lock()
		if *e == nil {
			*e = err
		}
		mu.Unlock()
	}
	// Each command's failure and when it exited: the commands only return once their writers
	// did (after send), so the order they return in says nothing; the one that exited first is
	// the cause.
	type result struct {
		at  time.Time
		err error
	}
	results := make([]result, u.n)
	unpackEnded := make(chan struct{})
	var g errgroup.Group
	for k := range u.n {
		g.Go(func() error {
			rctx := fctx
			if k == 0 {
				rctx = ctx
				defer close(unpackEnded)
			}
			at, err := u.r.runOnAt(rctx, sessions[k], cmds[k], func(w io.Writer) error {
				<-u.ready
				if u.parts == nil {
					note(&first, errAborted)
					return nil
				}
				var err error
				stats[k], err = writeFrom(wctx, w, u.parts[k], source, &u.c)
				if err != nil {
					note(&first, err)
					wcancel()
				}
				return nil
			}, nil)
			results[k] = result{at, err}
			if err != nil {
				wcancel()
				if k == 0 {
					fcancel()
				} else if !errors.Is(err, context.Canceled) {
					// A feed that failed before it connected would leave the unpack waiting for
					// it (FeedTimeout): tell the unpack to stop; it refuses and cleans up.
					go signalUntil(sessions[0], ssh.SIGTERM, unpackEnded)
				}
			}
			return err
		})
	}
	err := g.Wait()
	var firstRun *result // the command that exited first with a failure of its own
	for k := range results {
		r := &results[k]
		if r.err != nil && !errors.Is(r.err, context.Canceled) && (firstRun == nil || r.at.Before(firstRun.at)) {
			firstRun = r
		}
	}
	switch {
	case first != nil && !errors.Is(first, io.EOF) && !errors.Is(first, context.Canceled) && !errors.Is(first, errAborted):
		err = first // a file changed or could not be read here: the cause of the box's refusal
	case firstRun != nil:
		err = firstRun.err // the unpack's refusal, or a feed's failure
	case first != nil:
		err = first
	}
	u.finish(stats, err)
}

func (u *unpackRun) finish(stats []Stats, err error) {
	u.stats, u.err = stats, err
	close(u.done)
}

// send gives the run its plan (cut into its number of parts) and the root its files are read
// from, and waits for the box's commands.
func (u *unpackRun) send(root string, plan Plan) (Stats, error) {
	if u.n > 1 && len(plan.Entries) < u.n {
		u.abort()
		return Stats{}, fmt.Errorf("send to %s: %d entries for %d channels", u.dir, len(plan.Entries), u.n)
	}
	u.started = true
	u.root, u.parts = root, splitPlan(plan, u.n)
	stop := reportProgress(u.r.Progress, u.r.ProgressInterval, u.r.progressTick, plan, &u.c)
	close(u.ready)
	<-u.done
	stop()
	var st Stats
	for _, x := range u.stats {
		st.add(x)
	}
	if u.err != nil {
		return st, fmt.Errorf("send to %s: %w", u.dir, u.err)
	}
	return st, nil
}

// abort ends a run that will not be sent anything: its streams end before a plan, so the box
// refuses them with nothing written, and it waits for the box's commands to exit.
func (u *unpackRun) abort() {
	if u == nil || u.started {
		return
	}
	u.started = true
	close(u.ready)
	<-u.done
}

// DefaultChannels is Remote.Channels when unset.
const DefaultChannels = 2

// parallelMin: a streamed sync of fewer entries, or fewer bytes, uses one channel.
var parallelMin = struct {
	entries int
	bytes   int64
}{2000, 16 << 20}

// channels is how many channels the plan's archive is sent over: several only for a streamed
// (cold) sync of a large tree.
func (r Remote) channels(plan Plan) int {
	n := r.maxChannels()
	if n < 2 || !plan.SumsLast || len(plan.Deletes) > 0 || (len(plan.Entries) < parallelMin.entries && plan.Bytes() < parallelMin.bytes) {
		return 1
	}
	return min(n, len(plan.Entries))
}

// maxChannels is what a large cold tree gets: Remote.Channels (DefaultChannels when unset), at
// most MaxParts.
func (r Remote) maxChannels() int { return min(cmp.Or(r.Channels, DefaultChannels), MaxParts) }

// splitPlan cuts a plan of at least n entries into n parts of contiguous entries, balanced by an
// estimate of what applying them costs (their bytes, plus 8 KiB per entry for creating it). The parts' entries are
// sub-slices of the plan's, so the hashes a streamed writer fills in land in the whole plan.
func splitPlan(plan Plan, n int) []Plan {
	if n < 2 {
		return []Plan{plan}
	}
	cost := func(e manifest.Entry) int64 { return e.Size + 8<<10 }
	var total int64
	for _, e := range plan.Entries {
		total += cost(e)
	}
	var parts []Plan
	start := 0
	var acc int64
	for i, e := range plan.Entries {
		acc += cost(e)
		// Cut at the part's share of the cost, or where the entries left are just enough to give
		// every part still to come one: a plan of at least n entries gives n parts.
		need, left := n-1-len(parts), len(plan.Entries)-(i+1)
		if need > 0 && left >= need && (acc >= total*int64(len(parts)+1)/int64(n) || left == need) {
			parts = append(parts, Plan{Version: PlanVersion, Entries: plan.Entries[start : i+1 : i+1], SumsLast: plan.SumsLast})
			start = i + 1
		}
	}
	parts = append(parts, Plan{Version: PlanVersion, Entries: plan.Entries[start:], SumsLast: plan.SumsLast})
	for k := range parts {
		parts[k].Part, parts[k].Parts = k, len(parts)
	}
	parts[0].Cache, parts[0].Deletes = plan.Cache, plan.Deletes
	return parts
}

// feedSocket names the unix socket an `unpack --parts` listens on for its feeders: in a new
// directory next to the target when the path is short enough for a socket, else in /tmp.
func feedSocket(dir string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	name := feedDirPrefix + hex.EncodeToString(b[:])
	s := filepath.Join(filepath.Dir(dir), name, "s")
	if len(s) > 100 { // sun_path holds 108 bytes
		s = filepath.Join("/tmp", name, "s")
	}
	return s, nil
}

// Pack runs `pack --dir DIR` on the box with plan on stdin and applies the archive it sends back
// below root, requiring exactly the plan (opts.Expect is set to it).
func (r Remote) Pack(ctx context.Context, dir string, plan Plan, root string, opts ApplyOptions) (Stats, error) {
	plan.Version = PlanVersion
	req, err := json.Marshal(plan)
	if err != nil {
		return Stats{}, err
	}
	opts.Expect = &plan
	opts.AllowEscapingSymlinks = false
	var st Stats
	err = r.run(ctx, r.command("pack", "--dir", dir), func(w io.Writer) error {
		_, err := w.Write(req)
		return err
	}, func(rd io.Reader) error {
		var err error
		st, err = Apply(ctx, rd, root, opts)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("fetch from %s: %w", dir, err)
	}
	return st, nil
}

// Push sends the tree of root described by base to dir on the box. A warm box (one that holds an
// earlier sync) is asked for its manifest first and gets only the difference, deletions included.
func Push(ctx context.Context, r Remote, root, dir string, base *manifest.Manifest, warm bool, mopts ManifestOptions) (Plan, Stats, error) {
	var from *manifest.Manifest
	if warm {
		var err error
		from, err = r.Manifest(ctx, dir, mopts)
		if err != nil {
			return Plan{}, Stats{}, err
		}
	}
	return pushPlan(ctx, r, root, dir, PlanFor(from, base), mopts)
}

// TreeOptions configure PushTree.
type TreeOptions struct {
	// Manifest selects the tree on both sides (mode, profile rules) and names the box's hash
	// cache file.
	Manifest ManifestOptions
	// Cache is the gateway's hash cache of root (kept between syncs), or nil.
	Cache *manifest.Cache
}

// Result is what PushTree did.
type Result struct {
	// Kind is "cold" (the box had nothing: one streamed archive of the whole tree), "warm" (the
	// box got the difference with its copy) or "unchanged".
	Kind string
	// Base is the tree the box now holds: the base manifest of this sync.
	Base  *manifest.Manifest
	Plan  Plan
	Stats Stats
	// Skipped names what the listing left out because no sync can carry it (submodules, devices,
	// FIFOs, sockets, names that are not UTF-8): not on the box, so worth telling the user.
	Skipped []string
	// List and BoxList are how long the local listing and the box's manifest took (in parallel);
	// Hash how long hashing the changed files took (warm); Transfer the archive, from the first
	// byte to the box's exit.
	List, BoxList, Hash, Transfer time.Duration
}

// PushTree syncs the tree of root to dir on the box. It lists root while the box lists dir. A box
// with nothing there gets a streamed archive (Plan.SumsLast): files are hashed as they are sent,
// so the first bytes leave as soon as the tree is listed, and the box checks every file against
// the sums at the end of the stream before it commits anything. A warm box gets only the
// difference, deletions included, with hashes computed first (from opts.Cache where files did
// not change).
func PushTree(ctx context.Context, r Remote, root, dir string, opts TreeOptions) (Result, error) {
	mo := opts.Manifest
	var listing *manifest.Listing
	var from *manifest.Manifest
	var res Result
	var pre *unpackRun // started while the tree was still being listed
	start := time.Now()
	listed := make(chan struct{})
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(listed)
		if r.beforeList != nil {
			r.beforeList()
		}
		var err error
		listing, err = manifest.List(gctx, root, manifest.Options{Mode: mo.Mode, Exclude: mo.Exclude, Include: mo.Include, RulePrefix: mo.RulePrefix, Cache: opts.Cache})
		res.List = time.Since(start)
		return err
	})
	g.Go(func() error {
		var err error
		from, err = r.Manifest(gctx, dir, mo)
		res.BoxList = time.Since(start)
		if err != nil || len(from.Entries) > 0 {
			if r.boxAnswered != nil {
				r.boxAnswered(false)
			}
			return err
		}
		select {
		case <-listed:
		default:
			// A cold box, and a tree that takes longer to list than the box took to answer (a
			// large one): its unpack starts now, on as many channels as a large tree gets.
			pre = r.startUnpack(ctx, dir, r.maxChannels(), opts.Cache.Record)
		}
		if r.boxAnswered != nil {
			r.boxAnswered(pre != nil)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		pre.abort()
		return Result{}, err
	}
	res.Skipped = listing.Stats().Skipped
	if len(from.Entries) == 0 {
		plan := Plan{Version: PlanVersion, Entries: listing.Unhashed().Entries, SumsLast: true, Cache: mo.CacheFile}
		if len(plan.Entries) == 0 {
			pre.abort()
			return Result{Kind: "unchanged", Base: &manifest.Manifest{Version: manifest.Version, Entries: []manifest.Entry{}}}, nil
		}
		t := time.Now()
		var st Stats
		var err error
		if pre != nil && len(plan.Entries) >= pre.n {
			st, err = pre.send(listing.Root(), plan)
		} else {
			pre.abort()
			st, err = r.unpack(ctx, dir, listing.Root(), plan, opts.Cache.Record)
		}
		if err != nil {
			return Result{}, err
		}
		res.Transfer = time.Since(t)
		// writeFrom filled in the hashes as it sent the files.
		res.Kind, res.Base, res.Plan, res.Stats = "cold", &manifest.Manifest{Version: manifest.Version, Entries: plan.Entries}, plan, st
		return res, nil
	}
	t := time.Now()
	base, _, err := listing.Hash(ctx)
	if err != nil {
		return Result{}, err
	}
	res.Hash = time.Since(t)
	t = time.Now()
	plan, st, err := pushPlan(ctx, r, root, dir, PlanFor(from, base), mo)
	res.Transfer = time.Since(t)
	res.Kind, res.Base, res.Plan, res.Stats = "warm", base, plan, st
	if plan.Empty() {
		res.Kind, res.Transfer = "unchanged", 0
	}
	return res, err
}

func pushPlan(ctx context.Context, r Remote, root, dir string, plan Plan, mopts ManifestOptions) (Plan, Stats, error) {
	if plan.Empty() {
		return plan, Stats{}, nil
	}
	// The box records what it writes in its hash cache, so that its next manifest (warm resync)
	// does not re-hash the files it was just sent.
	plan.Cache = mopts.CacheFile
	st, err := r.Unpack(ctx, dir, root, plan)
	return plan, st, err
}

// ReadPlanRequest strictly decodes the plan a `pack` command receives on stdin.
func ReadPlanRequest(rd io.Reader, lim Limits) (*Plan, error) {
	p, err := decodePlan(rd, lim, nil)
	if err != nil {
		return nil, err
	}
	lim.setDefaults()
	if err := ValidatePlan(p, lim, true); err != nil {
		return nil, err
	}
	return p, nil
}

// ErrOutputTooLarge is returned by Exec when a box command writes more than allowed.
var ErrOutputTooLarge = errors.New("box command output over limit")

// Exec runs a shell command on the box (not a worker subcommand) and copies its stdout to w,
// failing with ErrOutputTooLarge past max bytes (the box is not trusted to bound it).
func (r Remote) Exec(ctx context.Context, cmd string, w io.Writer, max int64) error {
	return r.run(ctx, cmd, nil, func(rd io.Reader) error {
		n, err := io.Copy(w, io.LimitReader(rd, max+1))
		if err != nil {
			return err
		}
		if n > max {
			return fmt.Errorf("%q: %w (%d bytes)", cmd, ErrOutputTooLarge, max)
		}
		return nil
	})
}

// wireWriter counts the bytes written through it (to a channel's stdin).
type wireWriter struct {
	w interface {
		io.Writer
		io.Closer
	}
	n atomic.Int64
}

func (c *wireWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *wireWriter) Close() error { return c.w.Close() }

// wireReader counts the bytes read through it (from a channel's stdout).
type wireReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *wireReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
