package capacitybench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/testrig/netnsbox"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// bulkBytes and bulkReps size section 3: each direction, each forward.
const (
	bulkBytes = 128 << 20
	bulkReps  = 5
)

// TestTunnelThroughput is section 3: bytes per second through the gateway's reverse unix-socket
// forward (gateway/tunnel, x/crypto/ssh) against OpenSSH's own `ssh -R /path:/path` to the same
// netns sshd box, the same payload moved by the same box-side process.
func TestTunnelThroughput(t *testing.T) {
	needBench(t)
	testenv.RequireCommands(t, "ssh")
	box := netnsbox.NetnsBox(t, "bench-bulk")
	bin := boxBinary(t)
	c := netnsbox.Dial(t, box)
	ctx := testenv.Context(t, 10*time.Minute)

	// Ours: the tunnel hub forwards ~/ocw/bulk.sock on the box and hands each connection over.
	th := tunnel.NewMux(tunnel.Config{})
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = th.Close(cctx)
	})
	if err := th.Open(ctx, netnsbox.Target(box, "env-bulk", "ocw/bulk.sock")); err != nil {
		t.Fatal(err)
	}
	go serveAll(th.Listener())

	// OpenSSH: ssh -R <box path>:<local path>, to a listener here serving the same way.
	dir := testenv.PublicDir(t, "ocw-bulk")
	local := filepath.Join(dir, "ossh.sock")
	ln, err := net.Listen("unix", local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveAll(ln)
	known := netnsbox.KnownHosts(t, box)
	openssh := func(name string, cipher ...string) (string, int) {
		remote := filepath.Join(box.Home, name)
		args := []string{"-F", "/dev/null", "-N", "-v", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ExitOnForwardFailure=yes",
			"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + known, "-i", box.KeyPath, "-p", strconv.Itoa(box.Port),
			"-R", remote + ":" + local}
		args = append(args, cipher...)
		args = append(args, box.User+"@"+box.Host)
		cmd := exec.Command("ssh", args...)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		up := make(chan bool, 1)
		var logTail []string
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if strings.Contains(sc.Text(), "remote forward success") {
					up <- true
				}
				logTail = append(logTail[max(0, len(logTail)-20):], sc.Text())
			}
			close(up)
		}()
		select {
		case ok := <-up:
			if !ok {
				t.Fatalf("ssh -R exited before forwarding:\n%s", strings.Join(logTail, "\n"))
			}
		case <-ctx.Done():
			t.Fatal("ssh -R: no forward")
		}
		return remote, cmd.Process.Pid
	}

	type forward struct {
		name, sock string
		pid        int // the ssh process, whose CPU is the forward's on this side; 0 for ours (this process)
	}
	// The cipher the name gives is the one negotiated, each direction, not the one asked for first.
	am, ok := th.Client("env-bulk").Conn.(ssh.AlgorithmsConnMetadata)
	if !ok {
		t.Fatal("tunnel connection does not report its algorithms")
	}
	algs := am.Algorithms()
	forwards := []forward{{name: "ours (gateway/tunnel, " + negotiated(algs.Read.Cipher, algs.Write.Cipher) + ")", sock: filepath.Join(box.Home, "ocw/bulk.sock")}}
	for _, o := range []struct{ name, file string }{{"OpenSSH ssh -R, its default cipher", "ossh-default.sock"}, {"OpenSSH ssh -R, -c aes128-gcm@openssh.com", "ossh-gcm.sock"}} {
		var cipher []string
		if strings.Contains(o.name, "-c ") {
			cipher = []string{"-c", "aes128-gcm@openssh.com"}
		}
		sock, pid := openssh(o.file, cipher...)
		forwards = append(forwards, forward{name: o.name, sock: sock, pid: pid})
	}
	// Interleaved: each round moves the payload once per forward and direction, so that the load of
	// this shared machine changing during the run falls on every forward alike.
	times := map[string]map[bool][]time.Duration{}
	cpu := map[string]map[bool]time.Duration{} // this side's CPU: this process, plus the ssh process for OpenSSH's
	for _, f := range forwards {
		times[f.name], cpu[f.name] = map[bool][]time.Duration{}, map[bool]time.Duration{}
	}
	profile := os.Getenv(envTunnelProfile)
	for round := range bulkReps {
		for _, f := range forwards {
			for _, up := range []bool{true, false} {
				var res bulkResult
				stop := func() {}
				if profile != "" && f.pid == 0 {
					stop = cpuProfile(t, fmt.Sprintf("%s-%s-%d.pprof", profile, bulkDirection(up), round+1))
				}
				before := sideCPU(t, f.pid)
				err := onBox(c, bin, boxTask{Bulk: &bulkTask{Sock: f.sock, Up: up, Bytes: bulkBytes, Reps: 1}}, &res)
				cpu[f.name][up] += sideCPU(t, f.pid) - before
				stop()
				if err != nil {
					t.Fatalf("%s: %v", f.name, err)
				}
				times[f.name][up] = append(times[f.name][up], time.Duration(res.Ns[0]))
			}
		}
	}
	var rows []string
	// rate is by the median round, best by the fastest: on a loaded machine the fastest round is the
	// one least disturbed by others' work.
	rate, best := map[string]map[bool]float64{}, map[string]map[bool]float64{}
	cpuPer := map[string]map[bool]time.Duration{}
	for _, f := range forwards {
		rate[f.name], best[f.name], cpuPer[f.name] = map[bool]float64{}, map[bool]float64{}, map[bool]time.Duration{}
		for _, up := range []bool{true, false} {
			ds := times[f.name][up]
			slices.Sort(ds)
			med := ds[len(ds)/2]
			r := float64(bulkBytes) / med.Seconds() / (1 << 20)
			rate[f.name][up] = r
			best[f.name][up] = float64(bulkBytes) / ds[0].Seconds() / (1 << 20)
			dir := "gateway → box"
			if up {
				dir = "box → gateway"
			}
			perGiB := cpu[f.name][up] * (1 << 30) / time.Duration(bulkBytes*len(ds))
			cpuPer[f.name][up] = perGiB
			rows = append(rows, fmt.Sprintf("%s\t%s\t%.0f\t%v\t%v–%v\t%v", f.name, dir, r, med.Round(time.Millisecond),
				ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), perGiB.Round(time.Millisecond)))
		}
	}
	ours, def, gcm := forwards[0].name, forwards[1].name, forwards[2].name
	for _, up := range []bool{true, false} {
		dir := bulkDirection(up)
		rows = append(rows, fmt.Sprintf("ratio ours/OpenSSH %s\t\t%.2f× (default cipher), %.2f× (same cipher); fastest rounds %.2f×, %.2f×; CPU %.2f×, %.2f×", dir,
			rate[ours][up]/rate[def][up], rate[ours][up]/rate[gcm][up], best[ours][up]/best[def][up], best[ours][up]/best[gcm][up],
			cpuPer[ours][up].Seconds()/cpuPer[def][up].Seconds(), cpuPer[ours][up].Seconds()/cpuPer[gcm][up].Seconds()))
	}
	table(fmt.Sprintf("3. Tunnel bulk throughput (netns sshd box %s, %d MiB, median of %d interleaved rounds; %s)", box.Host, bulkBytes>>20, bulkReps, load()),
		"forward\tdirection\tMiB/s\tmedian time\trange\tthis side's CPU per GiB", rows)
	summarize("3 tunnel throughput", fmt.Sprintf("ours/OpenSSH ssh -R (medians): up %.2f×, down %.2f× vs its default cipher, up %.2f×, down %.2f× same cipher; fastest rounds %.2f×, %.2f×, %.2f×, %.2f×; this side's CPU per byte vs same cipher up %.2f×, down %.2f×",
		rate[ours][true]/rate[def][true], rate[ours][false]/rate[def][false], rate[ours][true]/rate[gcm][true], rate[ours][false]/rate[gcm][false],
		best[ours][true]/best[def][true], best[ours][false]/best[def][false], best[ours][true]/best[gcm][true], best[ours][false]/best[gcm][false],
		cpuPer[ours][true].Seconds()/cpuPer[gcm][true].Seconds(), cpuPer[ours][false].Seconds()/cpuPer[gcm][false].Seconds()), "≥ 0.9× OpenSSH")
}

// envTunnelProfile, when set, is the path prefix of CPU profiles of this process during each of our
// forward's transfers: <prefix>-up-<round>.pprof and <prefix>-down-<round>.pprof (read them
// together: go tool pprof -top <prefix>-up-*.pprof).
const envTunnelProfile = "OPENCLAW_BENCH_TUNNEL_CPUPROFILE"

// cpuProfile starts a CPU profile of this process into path; the function it returns stops it.
func cpuProfile(t *testing.T, path string) (stop func()) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}

// negotiated names the ciphers of both directions, once when they are the same.
func negotiated(read, write string) string {
	if read == write {
		return read
	}
	return "read " + read + ", write " + write
}

func bulkDirection(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

// sideCPU is the CPU time this process used so far, plus that of process pid when it is not 0
// (from /proc/PID/schedstat: nanoseconds on a CPU).
func sideCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if pid == 0 {
		return d
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return d + time.Duration(ns)
}

// serveAll serves bulk connections until ln is closed.
func serveAll(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { _ = serveBulk(c) }()
	}
}
