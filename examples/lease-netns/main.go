// Command lease-netns is a Crabbox-shaped lease CLI whose boxes are network namespaces running OpenSSH sshd.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const usage = `usage: lease-netns [--state-dir DIR] COMMAND [flags]

commands:
  warmup --lease-id ID [--label k=v]... [--ttl D] [--idle-timeout D] [--provider X] [--class C] [--json]
  inspect --id ID [--json]
  heartbeat --id ID [--json]
  list [--json]
  link --id ID down|up
  stop ID

State lives in --state-dir, $LEASE_NETNS_DIR or ` + defaultStateDir + `.
`

// ErrNoSuchLease is returned for a lease id this state dir has never seen.
var ErrNoSuchLease = errors.New("no such lease ID")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease-netns:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	global, rest, err := parseFlags(args, map[string]flagKind{"state-dir": flagString}, false, true)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return fmt.Errorf("missing command\n%s", usage)
	}
	cmd, args := rest[0], rest[1:]
	if cmd == "help" || cmd == "-h" || cmd == "--help" {
		_, err := io.WriteString(stdout, usage)
		return err
	}
	cmdSpecs, ok := commandFlags[cmd]
	if !ok {
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
	specs := map[string]flagKind{"state-dir": flagString}
	for k, v := range cmdSpecs {
		specs[k] = v
	}
	f, pos, err := parseFlags(args, specs, cmd == "warmup", false)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	stateDir := f.last("state-dir")
	if stateDir == "" {
		stateDir = global.last("state-dir")
	}
	if stateDir == "" {
		stateDir = os.Getenv("LEASE_NETNS_DIR")
	}
	if stateDir == "" {
		stateDir = defaultStateDir
	}
	if os.Geteuid() != 0 {
		return errors.New("lease-netns needs root (network namespaces)")
	}
	tools, err := findTools()
	if err != nil {
		return err
	}
	m, err := openManager(stateDir, tools)
	if err != nil {
		return err
	}
	defer m.close()

	switch cmd {
	case "warmup":
		return cmdWarmup(ctx, m, f, stdout)
	case "inspect":
		return withID(f, pos, "inspect", func(id string) error {
			obj, err := m.inspect(ctx, id)
			if err != nil {
				return err
			}
			return printLease(stdout, obj, true)
		})
	case "heartbeat":
		return withID(f, pos, "heartbeat", func(id string) error {
			obj, err := m.heartbeat(ctx, id)
			if err != nil {
				return err
			}
			return printLease(stdout, obj, f.bool("json"))
		})
	case "list":
		objs, err := m.list(ctx)
		if err != nil {
			return err
		}
		if f.bool("json") {
			return writeJSON(stdout, objs)
		}
		for _, o := range objs {
			fmt.Fprintf(stdout, "%s\t%s\tready=%t\t%s@%s\n", o.ID, o.State, o.Ready, o.SSHUser, o.SSHHost)
		}
		return nil
	case "stop":
		return withID(f, pos, "stop", func(id string) error { return m.stop(ctx, id) })
	case "link":
		if len(pos) != 1 || (pos[0] != "up" && pos[0] != "down") {
			return errors.New("link: want --id ID down|up")
		}
		return withID(f, nil, "link", func(id string) error { return m.link(ctx, id, pos[0] == "up") })
	case "hang":
		// Fault injection: from now on every new command on the box (exec, sftp) hangs.
		return withID(f, pos, "hang", func(id string) error { return m.hang(ctx, id) })
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// commandFlags lists each command's flags; "json" is accepted everywhere for Crabbox compatibility.
var commandFlags = map[string]map[string]flagKind{
	"warmup": {
		"lease-id": flagString, "label": flagMulti, "ttl": flagString, "idle-timeout": flagString,
		"provider": flagString, "class": flagString, "json": flagBool,
	},
	"inspect":   {"id": flagString, "json": flagBool},
	"heartbeat": {"id": flagString, "json": flagBool},
	"list":      {"json": flagBool},
	"stop":      {"id": flagString, "json": flagBool},
	"link":      {"id": flagString},
	"hang":      {"id": flagString},
}

func withID(f flagValues, pos []string, cmd string, fn func(id string) error) error {
	id := f.last("id")
	switch {
	case id == "" && len(pos) == 1:
		id = pos[0]
	case len(pos) > 0:
		return fmt.Errorf("%s: unexpected arguments %q", cmd, pos)
	}
	if id == "" {
		return fmt.Errorf("%s: missing lease id", cmd)
	}
	return fn(id)
}

func cmdWarmup(ctx context.Context, m *manager, f flagValues, stdout io.Writer) error {
	req := warmupRequest{
		LeaseID:  f.last("lease-id"),
		Provider: f.last("provider"),
		Class:    f.last("class"),
		Labels:   map[string]string{},
		Extra:    f.unknown,
	}
	if err := validateLeaseID(req.LeaseID); err != nil {
		return fmt.Errorf("warmup: %w", err)
	}
	for _, kv := range f.all("label") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("warmup: label %q is not k=v", kv)
		}
		req.Labels[k] = v
	}
	var err error
	if req.TTL, err = parseDuration("ttl", f.last("ttl"), defaultTTL); err != nil {
		return err
	}
	if req.IdleTimeout, err = parseDuration("idle-timeout", f.last("idle-timeout"), 0); err != nil {
		return err
	}
	obj, err := m.warmup(ctx, req)
	if err != nil {
		return err
	}
	return printLease(stdout, obj, f.bool("json"))
}

func printLease(w io.Writer, obj leaseJSON, asJSON bool) error {
	if asJSON {
		return writeJSON(w, obj)
	}
	_, err := fmt.Fprintln(w, obj.ID)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseDuration accepts Go durations and bare seconds; empty or zero means def.
func parseDuration(name, s string, def time.Duration) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		var secs int64
		if _, serr := fmt.Sscanf(s, "%d", &secs); serr == nil && fmt.Sprint(secs) == s {
			d, err = time.Duration(secs)*time.Second, nil
		}
	}
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--%s %q is not a duration", name, s)
	}
	if d == 0 {
		return def, nil
	}
	return d, nil
}

func validateLeaseID(id string) error {
	if id == "" {
		return errors.New("missing --lease-id")
	}
	if len(id) > 128 {
		return errors.New("lease id longer than 128 bytes")
	}
	for _, r := range id {
		if r < 0x21 || r > 0x7e {
			return fmt.Errorf("lease id %q has a character outside printable ASCII", id)
		}
	}
	return nil
}

type flagKind int

const (
	flagString flagKind = iota
	flagBool
	flagMulti
)

type flagValues struct {
	vals    map[string][]string
	unknown map[string][]string
}

func (f flagValues) last(name string) string {
	v := f.vals[name]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func (f flagValues) all(name string) []string { return f.vals[name] }

func (f flagValues) bool(name string) bool {
	v := f.last(name)
	return v != "" && v != "false" && v != "0"
}

// parseFlags parses --name value, --name=value and -name forms. With allowUnknown, unknown
// flags are recorded (taking the next argument as value unless it looks like a flag). With
// stopAtPositional, parsing stops at the first positional argument (the command).
func parseFlags(args []string, specs map[string]flagKind, allowUnknown, stopAtPositional bool) (flagValues, []string, error) {
	f := flagValues{vals: map[string][]string{}, unknown: map[string][]string{}}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if stopAtPositional {
				return f, append(pos, args[i:]...), nil
			}
			pos = append(pos, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		kind, known := specs[name]
		if !known {
			if !allowUnknown {
				return f, nil, fmt.Errorf("unknown flag %s", a)
			}
			if !hasVal && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				val = args[i]
			}
			f.unknown[name] = append(f.unknown[name], val)
			continue
		}
		if kind == flagBool {
			if !hasVal {
				val = "true"
			}
			f.vals[name] = append(f.vals[name], val)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return f, nil, fmt.Errorf("flag %s needs a value", a)
			}
			i++
			val = args[i]
		}
		f.vals[name] = append(f.vals[name], val)
	}
	return f, pos, nil
}
