// Command lease-dir is a Crabbox-shaped lease CLI whose machines are JSON files in a directory, for demos and tests.
package main

import (
	"cmp"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/boxproc"
)

const usage = `usage: lease-dir <command> [flags]

  warmup --lease-id ID [--label k=v]... [--delay 2s] [--fail "message"]
         [--provider P] [--class C] [--ttl 24h] [--idle-timeout 30m]
  inspect --id ID [--json]
  heartbeat --id ID
  stop ID
  list [--json]

State: one JSON file per lease in $LEASE_DIR (default ./.lease-dir); warmup calls are
logged to $LEASE_DIR/calls.log. No machine exists: sshHost 127.0.0.1:22 is a placeholder.

Fault injection:
  LEASE_DIR_WARMUP_DELAY=2s    warmup sleeps before creating the lease (like --delay)
  LEASE_DIR_WARMUP_FAIL=msg    warmup exits 3 with this message (like --fail)
  LEASE_DIR_INSPECT_GARBAGE=1  inspect prints malformed JSON
  LEASE_DIR_NO_HOSTKEY=1       inspect and list omit the host key
  LEASE_DIR_LOCALBOX=PATH      back each lease with a real machine: PATH is the openclaw binary,
                               whose localbox serves SSH for the lease (stop ends it)
  LEASE_DIR_STOP_FAILS=N       the first N stop calls exit 1 with "temporary error"
  LEASE_DIR_HEARTBEAT_FAIL=msg heartbeat exits 4 with this message (a provider refusing renewal)
  LEASE_DIR_TTL=15s            the default of warmup's --ttl

heartbeat calls are logged to calls.log too.
`

// lease is the state file of one lease.
type lease struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels,omitempty"`
	Provider    string            `json:"provider,omitempty"`
	Class       string            `json:"class,omitempty"`
	TTL         string            `json:"ttl"`
	WarmupCalls int               `json:"warmupCalls"`
	HostKey     string            `json:"hostKey,omitempty"`
	KeyPath     string            `json:"keyPath,omitempty"`
	// A lease backed by `openclaw localbox` (LEASE_DIR_LOCALBOX) is a real SSH machine.
	BoxDir    string    `json:"boxDir,omitempty"`
	BoxPID    int       `json:"boxPid,omitempty"`
	Port      int       `json:"port,omitempty"`
	User      string    `json:"user,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

var leaseIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// exitError carries an exit status and the message printed on stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	dir := os.Getenv("LEASE_DIR")
	if dir == "" {
		dir = ".lease-dir"
	}
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	if err == nil {
		d := &leaseDir{dir: dir, out: stdout}
		err = d.dispatch(args[0], args[1:])
	}
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		fmt.Fprintln(stderr, ee.msg)
		return ee.code
	default:
		fmt.Fprintln(stderr, "lease-dir:", err)
		return 1
	}
}

type leaseDir struct {
	dir string
	out io.Writer
}

type labelFlag map[string]string

func (l labelFlag) String() string { return "" }
func (l labelFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q must be key=value", s)
	}
	l[k] = v
	return nil
}

// warmupArgs are the flags of warmup; provider, class and idle timeout are only recorded.
type warmupArgs struct {
	labels                labelFlag
	fail, provider, class string
	ttl, delay            time.Duration
}

func (d *leaseDir) dispatch(cmd string, args []string) error {
	if !strings.Contains(" warmup inspect heartbeat stop list ", " "+cmd+" ") {
		return &exitError{2, fmt.Sprintf("unknown command %q\n\n%s", cmd, usage)}
	}
	fs := flag.NewFlagSet("lease-dir "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	id := fs.String("id", "", "lease id")
	fs.Bool("json", true, "print JSON (always on)")
	w := warmupArgs{labels: labelFlag{}}
	if cmd == "warmup" {
		envDelay, _ := time.ParseDuration(os.Getenv("LEASE_DIR_WARMUP_DELAY"))
		fs.StringVar(id, "lease-id", "", "lease id (idempotency key)")
		fs.Var(w.labels, "label", "k=v label, repeatable")
		fs.DurationVar(&w.delay, "delay", envDelay, "sleep before creating the lease")
		fs.StringVar(&w.fail, "fail", os.Getenv("LEASE_DIR_WARMUP_FAIL"), "fail with this message")
		fs.StringVar(&w.provider, "provider", "", "recorded only")
		fs.StringVar(&w.class, "class", "", "recorded only")
		ttl := 24 * time.Hour
		if d, err := time.ParseDuration(os.Getenv("LEASE_DIR_TTL")); err == nil {
			ttl = d
		}
		fs.DurationVar(&w.ttl, "ttl", ttl, "lease lifetime")
		fs.String("idle-timeout", "30m", "ignored")
	}
	if err := fs.Parse(args); err != nil {
		return &exitError{2, fmt.Sprintf("%v\n\n%s", err, usage)}
	}
	if cmd == "stop" && *id == "" {
		*id = fs.Arg(0)
	}
	if cmd != "list" && !leaseIDRE.MatchString(*id) {
		return &exitError{2, fmt.Sprintf("%s: a valid lease id is required (got %q)\n\n%s", cmd, *id, usage)}
	}
	switch cmd {
	case "warmup":
		if w.ttl <= 0 {
			return &exitError{2, "warmup: --ttl must be positive"}
		}
		return d.warmup(*id, w)
	case "inspect":
		return d.inspect(*id)
	case "heartbeat":
		return d.heartbeat(*id)
	case "stop":
		return d.stop(*id)
	default:
		return d.list()
	}
}

// lock serialises commands on one directory; the returned func unlocks.
func (d *leaseDir) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(d.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func (d *leaseDir) path(id string) string { return filepath.Join(d.dir, id+".json") }

func (d *leaseDir) load(id string) (*lease, error) {
	b, err := os.ReadFile(d.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, &exitError{1, "no such lease " + id}
	}
	if err != nil {
		return nil, err
	}
	var l lease
	return &l, json.Unmarshal(b, &l)
}

func (d *leaseDir) save(l *lease) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(d.path(l.ID), b, 0o600)
}

func (d *leaseDir) warmup(id string, w warmupArgs) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	line, _ := json.Marshal(map[string]any{"at": time.Now().UTC(), "command": "warmup", "leaseId": id, "labels": w.labels})
	f, err := os.OpenFile(filepath.Join(d.dir, "calls.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s\n", line)
		f.Close()
	}
	unlock()
	if err != nil {
		return err
	}
	time.Sleep(w.delay) // lets tests kill a gateway mid-provision
	if w.fail != "" {
		return &exitError{3, w.fail}
	}
	if unlock, err = d.lock(); err != nil {
		return err
	}
	defer unlock()
	l, err := d.load(id)
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		l = &lease{ID: id}
	case err != nil:
		return err
	}
	l.WarmupCalls++
	if l.State != "ready" {
		if err := d.create(l, w); err != nil {
			return err
		}
	}
	if err := d.save(l); err != nil {
		return err
	}
	return json.NewEncoder(d.out).Encode(map[string]any{"id": id, "state": l.State})
}

// create makes a fresh fake machine: a host key to pin and a private key file to log in with.
func (d *leaseDir) create(l *lease, w warmupArgs) error {
	hostPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	hk, err := ssh.NewPublicKey(hostPub)
	if err != nil {
		return err
	}
	_, userPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(userPriv, "lease-dir "+l.ID)
	if err != nil {
		return err
	}
	l.KeyPath = filepath.Join(d.dir, l.ID+".key")
	if err := atomicfile.Write(l.KeyPath, pem.EncodeToMemory(block), 0o600); err != nil {
		return err
	}
	if bin := os.Getenv("LEASE_DIR_LOCALBOX"); bin != "" {
		if err := d.startBox(l, w, bin); err != nil {
			return err
		}
		hk = nil
	}
	now := time.Now().UTC().Truncate(time.Second)
	l.State, l.Labels, l.Provider, l.Class = "ready", w.labels, w.provider, w.class
	if hk != nil {
		l.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(hk)))
	}
	l.TTL, l.CreatedAt, l.ExpiresAt = w.ttl.String(), now, now.Add(w.ttl)
	return nil
}

// startBox starts `openclaw localbox` for the lease, detached so it outlives this command, and
// takes its port, user, host key and client key from the state file it writes.
func (d *leaseDir) startBox(l *lease, w warmupArgs, bin string) error {
	l.BoxDir = filepath.Join(d.dir, l.ID+".box")
	var labels []string
	for k, v := range w.labels {
		labels = append(labels, "--label", k+"="+v)
	}
	st, err := boxproc.Start(bin, l.BoxDir, l.ID, labels...)
	if err != nil {
		return err
	}
	l.BoxPID, l.Port, l.User, l.HostKey, l.KeyPath = st.PID, st.Port, st.User, st.HostKey, st.ClientKeyPath
	return nil
}

// view is what inspect and list print, in Crabbox's inspect --json shape.
func view(l *lease) map[string]any {
	if l.State != "ready" {
		return map[string]any{"id": l.ID, "state": l.State}
	}
	v := map[string]any{
		"id": l.ID, "state": l.State, "ready": true,
		"sshHost": "127.0.0.1", "sshPort": cmp.Or(l.Port, 22), "sshUser": cmp.Or(l.User, "box"), "sshKey": l.KeyPath,
		"expiresAt": l.ExpiresAt.Format(time.RFC3339), "labels": l.Labels,
	}
	if os.Getenv("LEASE_DIR_NO_HOSTKEY") != "1" {
		v["sshHostKey"] = l.HostKey
	}
	return v
}

func (d *leaseDir) inspect(id string) error {
	l, err := d.load(id)
	if err != nil {
		return err
	}
	if os.Getenv("LEASE_DIR_INSPECT_GARBAGE") == "1" {
		_, err := fmt.Fprintf(d.out, "{\"id\": %q, \"state\": ", id)
		return err
	}
	return json.NewEncoder(d.out).Encode(view(l))
}

func (d *leaseDir) heartbeat(id string) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	line, _ := json.Marshal(map[string]any{"at": time.Now().UTC(), "command": "heartbeat", "leaseId": id})
	f, err := os.OpenFile(filepath.Join(d.dir, "calls.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s\n", line)
	f.Close()
	if err != nil {
		return err
	}
	if msg := os.Getenv("LEASE_DIR_HEARTBEAT_FAIL"); msg != "" {
		return &exitError{4, msg}
	}
	l, err := d.load(id)
	if err != nil {
		return err
	}
	if l.State != "ready" {
		return &exitError{1, "no such lease " + id + " (" + l.State + ")"}
	}
	ttl, err := time.ParseDuration(l.TTL)
	if err != nil {
		ttl = 24 * time.Hour
	}
	l.ExpiresAt = time.Now().UTC().Truncate(time.Second).Add(ttl)
	return d.save(l)
}

func (d *leaseDir) stop(id string) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if n, _ := strconv.Atoi(os.Getenv("LEASE_DIR_STOP_FAILS")); n > 0 {
		counter := filepath.Join(d.dir, "stop-failures")
		b, _ := os.ReadFile(counter)
		done, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if done < n {
			if err := atomicfile.Write(counter, []byte(strconv.Itoa(done+1)), 0o600); err != nil {
				return err
			}
			return &exitError{1, "temporary error"}
		}
	}
	l, err := d.load(id)
	if err != nil {
		return err
	}
	if l.BoxPID != 0 {
		boxproc.Stop(l.BoxPID, l.BoxDir)
		if err := os.RemoveAll(l.BoxDir); err != nil {
			return err
		}
	} else if l.KeyPath != "" {
		if err := os.Remove(l.KeyPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	l.State, l.HostKey, l.KeyPath, l.BoxPID = "released", "", "", 0
	return d.save(l)
}

func (d *leaseDir) list() error {
	paths, err := filepath.Glob(filepath.Join(d.dir, "*.json"))
	if err != nil {
		return err
	}
	sort.Strings(paths)
	out := []map[string]any{}
	for _, p := range paths {
		l, err := d.load(strings.TrimSuffix(filepath.Base(p), ".json"))
		if err != nil {
			return err
		}
		out = append(out, view(l))
	}
	return json.NewEncoder(d.out).Encode(out)
}
