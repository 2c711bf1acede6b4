package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// cli runs the built lease-netns binary against one state dir.
type cli struct {
	t        *testing.T
	bin, dir string
}

func (c cli) run(args ...string) (stdout, stderr string, err error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append([]string{"--state-dir", c.dir}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func (c cli) must(args ...string) string {
	c.t.Helper()
	out, errOut, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("lease-netns %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

func (c cli) inspect(id string) leaseJSON {
	c.t.Helper()
	var obj leaseJSON
	if err := json.Unmarshal([]byte(c.must("inspect", "--id", id, "--json")), &obj); err != nil {
		c.t.Fatalf("inspect output: %v", err)
	}
	return obj
}

func TestLeaseNetnsBox(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "sshd", "useradd", "userdel", "go")
	ipPath, _ := testenv.LookPath("ip")

	// The state dir holds the box user's home, so every ancestor must be o+x: t.TempDir is 0700.
	base := testenv.PublicDir(t, "ocw-lease-netns-test-")
	bin := filepath.Join(base, "lease-netns")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	c := cli{t: t, bin: bin, dir: filepath.Join(base, "state")}

	suffix := make([]byte, 6)
	rand.Read(suffix)
	id := "test-" + hex.EncodeToString(suffix)
	t.Cleanup(func() {
		if _, errOut, err := c.run("stop", id); err != nil && !strings.Contains(errOut, "no such lease") {
			t.Errorf("cleanup stop %s: %v\n%s", id, err, errOut)
		}
	})

	t.Run("unknown lease", func(t *testing.T) {
		_, errOut, err := c.run("inspect", "--id", "never-"+id, "--json")
		if err == nil || !strings.Contains(errOut, "no such lease ID") {
			t.Fatalf("inspect of unknown id: err=%v stderr=%q", err, errOut)
		}
		if _, errOut, err := c.run("stop", "never-"+id); err == nil || !strings.Contains(errOut, "no such lease") {
			t.Fatalf("stop of unknown id: err=%v stderr=%q", err, errOut)
		}
	})

	warm := []string{"warmup", "--lease-id", id, "--label", "openclaw.gateway=test", "--ttl", "10m",
		"--idle-timeout", "5m", "--provider", "netns", "--class", "small", "--crabbox-only-flag", "x"}
	if got := strings.TrimSpace(c.must(warm...)); got != id {
		t.Fatalf("warmup printed %q, want %q", got, id)
	}
	first := c.inspect(id)
	if got := strings.TrimSpace(c.must(warm...)); got != id {
		t.Fatalf("second warmup printed %q, want %q", got, id)
	}
	obj := waitReady(t, c, id)
	if obj.SSHHost != first.SSHHost || obj.SSHHostKey != first.SSHHostKey {
		t.Fatalf("second warmup made a new box: %s %s, was %s %s", obj.SSHHost, obj.SSHHostKey, first.SSHHost, first.SSHHostKey)
	}
	if obj.Labels["openclaw.gateway"] != "test" || obj.SSHPort != 22 || !filepath.IsAbs(obj.SSHKey) {
		t.Fatalf("inspect: %+v", obj)
	}
	if a, err := net.ResolveIPAddr("ip4", obj.SSHHost); err != nil || !testNet.Contains(mustAddr(t, a.IP)) {
		t.Fatalf("box address %s is outside %s", obj.SSHHost, testNet)
	}
	if _, err := time.Parse(time.RFC3339, obj.ExpiresAt); err != nil {
		t.Fatalf("expiresAt: %v", err)
	}
	if list := c.must("list", "--json"); !strings.Contains(list, `"id": "`+id+`"`) {
		t.Fatalf("list does not show the lease: %s", list)
	}

	t.Run("unpinned host key refused", func(t *testing.T) {
		other, _, _ := ed25519.GenerateKey(rand.Reader)
		wrong, _ := ssh.NewPublicKey(other)
		if cl, err := dial(t, obj, wrong); err == nil {
			cl.Close()
			t.Fatal("dial with a wrong pinned host key succeeded")
		}
	})

	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(obj.SSHHostKey))
	if err != nil {
		t.Fatal(err)
	}
	client, err := dial(t, obj, hostKey)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	out := runSSH(t, client, `id -un; echo "$HOME"; `+ipPath+` route`, "")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		t.Fatalf("box said %q", out)
	}
	if lines[0] != obj.SSHUser || lines[0] == "root" {
		t.Fatalf("box user is %q, want %q", lines[0], obj.SSHUser)
	}
	home := lines[1]
	if home != obj.Home {
		t.Fatalf("HOME is %q, want %q", home, obj.Home)
	}
	routes := strings.Join(lines[2:], "\n")
	if strings.Contains(routes, "default") || !strings.Contains(routes, obj.SSHHost) {
		t.Fatalf("box routing table must hold only its /30:\n%s", routes)
	}
	if got := runSSH(t, client, `cat > ~/x && cat ~/x`, "written through ssh"); got != "written through ssh" {
		t.Fatalf("HOME not writable: read back %q", got)
	}

	t.Run("streamlocal forward", func(t *testing.T) {
		runSSH(t, client, `mkdir -p ~/.openclaw-worker`, "")
		sock := home + "/.openclaw-worker/control.sock"
		ln, err := client.ListenUnix(sock)
		if err != nil {
			t.Fatalf("streamlocal-forward %s: %v", sock, err)
		}
		defer ln.Close()
		if mode := strings.TrimSpace(runSSH(t, client, "stat -c %a "+sock, "")); mode != "600" {
			t.Errorf("forwarded socket mode %s, want 600", mode)
		}
		if !hasUnixNetcat() {
			t.Log("nc with -U not installed: only checked that the forward was accepted")
			return
		}
		served := make(chan error, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			defer conn.Close()
			buf := make([]byte, 2)
			if _, err := io.ReadFull(conn, buf); err != nil {
				served <- err
				return
			}
			_, err = fmt.Fprintf(conn, "got %s\n", buf)
			served <- err
		}()
		if got := strings.TrimSpace(runSSH(t, client, "printf hi | nc -U "+sock, "")); got != "got hi" {
			t.Fatalf("through the forward the box read %q", got)
		}
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("link down partitions", func(t *testing.T) {
		c.must("link", "--id", id, "down")
		if conn, err := net.DialTimeout("tcp4", net.JoinHostPort(obj.SSHHost, "22"), 500*time.Millisecond); err == nil {
			conn.Close()
			t.Fatal("connect succeeded with the link down")
		}
		if c.inspect(id).Ready {
			t.Fatal("inspect says ready with the link down")
		}
		c.must("link", "--id", id, "up")
		waitReady(t, c, id)
	})

	c.must("heartbeat", "--id", id)
	c.must("stop", id)
	client.Close()
	if got := c.inspect(id); got.State != "released" || got.Ready {
		t.Fatalf("after stop inspect says %s ready=%t", got.State, got.Ready)
	}
	c.must("stop", id) // idempotent
	if nsList, _ := exec.Command(ipPath, "netns", "list").CombinedOutput(); strings.Contains(string(nsList), obj.Netns) {
		t.Errorf("netns %s survives stop:\n%s", obj.Netns, nsList)
	}
	if _, err := net.InterfaceByName(obj.HostIf); err == nil {
		t.Errorf("veth %s survives stop", obj.HostIf)
	}
	if _, err := user.Lookup(obj.SSHUser); err == nil {
		t.Errorf("user %s survives stop", obj.SSHUser)
	}
	if _, err := os.Stat(obj.Home); err == nil {
		t.Errorf("home %s survives stop", obj.Home)
	}
}

// waitReady polls inspect until the box answers; warmup already waits, so this is short.
func waitReady(t *testing.T, c cli, id string) leaseJSON {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		obj := c.inspect(id)
		if obj.Ready {
			return obj
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s not ready after 10s: %+v", id, obj)
		}
		<-tick.C
	}
}

func dial(t *testing.T, obj leaseJSON, hostKey ssh.PublicKey) (*ssh.Client, error) {
	t.Helper()
	pem, err := os.ReadFile(obj.SSHKey)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	return ssh.Dial("tcp4", net.JoinHostPort(obj.SSHHost, fmt.Sprint(obj.SSHPort)), &ssh.ClientConfig{
		User:            obj.SSHUser,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
		Timeout:         5 * time.Second,
	})
}

func runSSH(t *testing.T, client *ssh.Client, cmd, stdin string) string {
	t.Helper()
	s, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	s.Stderr = &stderr
	out, err := s.Output(cmd)
	if err != nil {
		t.Fatalf("box: %s: %v\n%s", cmd, err, stderr.String())
	}
	return string(out)
}

// hasUnixNetcat reports whether the box (which shares this filesystem) has an nc that speaks -U.
func hasUnixNetcat() bool {
	p, err := testenv.LookPath("nc")
	if err != nil {
		return false
	}
	out, _ := exec.Command(p, "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-U"))
}

func mustAddr(t *testing.T, ip net.IP) netip.Addr {
	t.Helper()
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok {
		t.Fatalf("not an IPv4 address: %s", ip)
	}
	return a
}
