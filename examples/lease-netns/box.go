package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// guardRoute keeps traffic to 198.18.0.0/15 on this host while any box exists: when a box's
// veth is down (link down) its connected /30 route disappears, and without the guard a connect
// to the box address would follow the default route off the machine.
var guardRoute = []string{"unreachable", "198.18.0.0/15", "metric", "4000"}

// tools are the absolute paths of the external programs a box needs.
type tools struct {
	ipPath, sshd, useradd, userdel string
}

func findTools() (tools, error) {
	var t tools
	var missing []string
	for _, c := range []struct {
		dst       *string
		name, pkg string
	}{
		{&t.ipPath, "ip", "iproute2"},
		{&t.sshd, "sshd", "openssh-server"},
		{&t.useradd, "useradd", "passwd"},
		{&t.userdel, "userdel", "passwd"},
	} {
		p, err := lookPath(c.name)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s (install package %s)", c.name, c.pkg))
			continue
		}
		*c.dst = p
	}
	if len(missing) > 0 {
		return t, fmt.Errorf("lease-netns needs %s", strings.Join(missing, ", "))
	}
	return t, nil
}

func lookPath(name string) (string, error) {
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

func (t tools) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, trimOutput(out))
	}
	return out, nil
}

func (t tools) ip(ctx context.Context, args ...string) error {
	_, err := t.run(ctx, t.ipPath, args...)
	return err
}

// inNetns runs a command inside the box's network namespace.
func (t tools) inNetns(ctx context.Context, ns string, args ...string) error {
	_, err := t.run(ctx, t.ipPath, append([]string{"netns", "exec", ns}, args...)...)
	return err
}

func netnsExists(ns string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", ns))
	return err == nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// checkFree refuses to provision over host objects this state dir did not record.
func (t tools) checkFree(ctx context.Context, l *lease) error {
	var busy []string
	if netnsExists(l.Netns) {
		busy = append(busy, "netns "+l.Netns)
	}
	if linkExists(l.HostIf) {
		busy = append(busy, "interface "+l.HostIf)
	}
	if _, err := user.Lookup(l.User); err == nil {
		busy = append(busy, "user "+l.User)
	}
	if len(busy) > 0 {
		return fmt.Errorf("warmup %s: %s already exist on this host (another state dir, or a leftover: "+
			"remove by hand)", l.ID, strings.Join(busy, ", "))
	}
	return nil
}

// provision creates the box: keys, user, namespace, veth, sshd. Callers tear down on error.
func (m *manager) provision(ctx context.Context, l *lease) error {
	t := m.tools
	if err := os.MkdirAll(l.Dir, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(l.Dir, 0o711); err != nil {
		return err
	}
	hostKeyPath := filepath.Join(l.Dir, "ssh_host_ed25519_key")
	hostPub, err := writeKeyPair(hostKeyPath, "lease-netns host "+l.ID)
	if err != nil {
		return err
	}
	l.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(hostPub)))
	clientPub, err := writeKeyPair(l.ClientKey, "lease-netns client "+l.ID)
	if err != nil {
		return err
	}
	// sshd reads authorized_keys as the box user: world-readable, root-owned, public only.
	if err := writeFileAtomic(filepath.Join(l.Dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientPub), 0o644); err != nil {
		return err
	}

	// The box user: a system user whose home is under the state dir. "*" (not "!") as the
	// password keeps the account unlocked for public-key logins with UsePAM no.
	if _, err := t.run(ctx, t.useradd, "--system", "--user-group", "--no-create-home",
		"--home-dir", l.Home, "--shell", "/bin/sh", "--password", "*", l.User); err != nil {
		return err
	}
	u, err := user.Lookup(l.User)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.MkdirAll(l.Home, 0o700); err != nil {
		return err
	}
	if err := os.Chown(l.Home, uid, gid); err != nil {
		return err
	}

	if err := t.ip(ctx, append([]string{"route", "replace"}, guardRoute...)...); err != nil {
		return err
	}
	if err := t.ip(ctx, "netns", "add", l.Netns); err != nil {
		return err
	}
	// No IPv6 in the box: nothing but the IPv4 /30 ever leaves its veth.
	_ = t.inNetns(ctx, l.Netns, "/bin/sh", "-c",
		"echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6")
	if err := t.ip(ctx, "link", "add", l.HostIf, "type", "veth", "peer", "name", l.BoxIf, "netns", l.Netns); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", l.HostIf, "disable_ipv6"), []byte("1\n"), 0o644)
	for _, args := range [][]string{
		{"addr", "add", l.HostAddr + "/30", "dev", l.HostIf},
		{"link", "set", l.HostIf, "up"},
		{"-n", l.Netns, "link", "set", "lo", "up"},
		{"-n", l.Netns, "addr", "add", l.BoxAddr + "/30", "dev", l.BoxIf},
		{"-n", l.Netns, "link", "set", l.BoxIf, "up"},
	} {
		if err := t.ip(ctx, args...); err != nil {
			return err
		}
	}
	return m.startSSHD(ctx, l, hostKeyPath)
}

func (m *manager) startSSHD(ctx context.Context, l *lease, hostKeyPath string) error {
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // privilege separation dir
		return err
	}
	cfgPath := filepath.Join(l.Dir, "sshd_config")
	pidPath := filepath.Join(l.Dir, "sshd.pid")
	logPath := filepath.Join(l.Dir, "sshd.log")
	cfg := fmt.Sprintf(`# written by lease-netns for lease %s
ListenAddress %s
Port 22
AddressFamily inet
HostKey %s
PidFile %s
AuthorizedKeysFile %s
AllowUsers %s
PermitRootLogin no
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
StreamLocalBindUnlink yes
StreamLocalBindMask 0177
GatewayPorts no
X11Forwarding no
PermitTunnel no
PermitUserEnvironment no
ClientAliveInterval 15
ClientAliveCountMax 4
MaxSessions 64
MaxStartups 64:30:128
PrintMotd no
LogLevel VERBOSE
Subsystem sftp internal-sftp
`, l.ID, l.BoxAddr, hostKeyPath, pidPath, filepath.Join(l.Dir, "authorized_keys"), l.User)
	if m.sshdAtLeast(ctx, 9, 8) {
		// Readiness probes connect and close before authenticating; OpenSSH 9.8+ would
		// penalise the gateway's address for that ("noauth") and then refuse it.
		cfg += "PerSourcePenalties no\n"
	}
	if err := writeFileAtomic(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	// sshd binds, daemonizes, and then writes its pid file.
	if err := m.tools.inNetns(ctx, l.Netns, m.tools.sshd, "-f", cfgPath, "-E", logPath); err != nil {
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("start sshd: %w (log: %s)", err, trimOutput(log))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(pidPath)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			l.SSHDPid = pid
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("sshd wrote no pid file in 5s (log: %s)", trimOutput(log))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for !probe(ctx, l.BoxAddr, time.Second) {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("sshd does not answer on %s:22 (log: %s)", l.BoxAddr, trimOutput(log))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// sshdAtLeast reports whether `sshd -V` names OpenSSH major.minor or newer.
func (m *manager) sshdAtLeast(ctx context.Context, major, minor int) bool {
	out, _ := exec.CommandContext(ctx, m.tools.sshd, "-V").CombinedOutput()
	s := string(out)
	i := strings.Index(s, "OpenSSH_")
	if i < 0 {
		return false
	}
	var maj, min int
	if _, err := fmt.Sscanf(s[i+len("OpenSSH_"):], "%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj > major || (maj == major && min >= minor)
}

// teardown removes everything a box may own. It is idempotent and keeps going past errors.
func (m *manager) teardown(ctx context.Context, l *lease) error {
	t := m.tools
	var errs []error
	uid := -1
	if u, err := user.Lookup(l.User); err == nil {
		uid, _ = strconv.Atoi(u.Uid)
	}
	// Everything in the namespace (sshd, sessions, workers) and anything the box user runs.
	if err := killAll(ctx, func() []int { return boxPids(ctx, t, l.Netns, uid) }); err != nil {
		errs = append(errs, err)
	}
	if linkExists(l.HostIf) {
		if err := t.ip(ctx, "link", "del", l.HostIf); err != nil {
			errs = append(errs, err)
		}
	}
	if netnsExists(l.Netns) {
		if err := t.ip(ctx, "netns", "del", l.Netns); err != nil {
			errs = append(errs, err)
		}
	}
	if uid >= 0 {
		if _, err := t.run(ctx, t.userdel, l.User); err != nil {
			errs = append(errs, err)
		}
	}
	if l.Dir != "" && strings.HasPrefix(l.Dir, m.dir+string(os.PathSeparator)) {
		if err := os.RemoveAll(l.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if !anyBoxLinks() {
		_ = t.ip(ctx, append([]string{"route", "del"}, guardRoute...)...)
	}
	return errors.Join(errs...)
}

// anyBoxLinks reports whether any box's host-side veth (of any state dir) still exists.
func anyBoxLinks() bool {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, "ocwh-") {
			return true
		}
	}
	return false
}

// boxPids lists the live processes in the namespace plus those owned by uid (if >= 0).
func boxPids(ctx context.Context, t tools, ns string, uid int) []int {
	seen := map[int]bool{}
	var pids []int
	add := func(pid int) {
		if pid > 1 && pid != os.Getpid() && !seen[pid] && alive(pid) {
			seen[pid] = true
			pids = append(pids, pid)
		}
	}
	if netnsExists(ns) {
		if out, err := t.run(ctx, t.ipPath, "netns", "pids", ns); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					add(pid)
				}
			}
		}
	}
	if uid >= 0 {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if fi, err := os.Stat(filepath.Join("/proc", e.Name())); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid {
					add(pid)
				}
			}
		}
	}
	return pids
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// killAll sends SIGTERM, waits up to 2s, then SIGKILLs what is left and waits again.
func killAll(ctx context.Context, list func() []int) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		pids := list()
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = syscall.Kill(p, sig)
		}
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if len(list()) == 0 {
				return nil
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	if left := list(); len(left) > 0 {
		return fmt.Errorf("processes survive SIGKILL: %v", left)
	}
	return nil
}

// writeKeyPair writes a fresh ed25519 private key in OpenSSH format (0600) and its .pub.
func writeKeyPair(path, comment string) (ssh.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	line := bytes.TrimSpace(ssh.MarshalAuthorizedKey(sshPub))
	line = append(line, ' ')
	line = append(line, comment...)
	line = append(line, '\n')
	return sshPub, writeFileAtomic(path+".pub", line, 0o644)
}
