package tools

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// containment finds every process a tool set started, the detached ones included (a command that
// calls setsid, or `( cmd & )`, leaves its process group):
//
//   - a cgroup v2 of its own, when the box lets the worker make one next to its own cgroup
//     (the worker runs as root, or its cgroup is delegated to it): every command starts in it
//     (clone3 CLONE_INTO_CGROUP), nothing it forks can leave it without write access to another
//     cgroup, and cgroup.kill ends them all at once;
//   - otherwise, and in any case after the cgroup, the environment marker: every command starts
//     with ScopeEnv set to the set's scope, which its children inherit, and the stop kills every
//     process of the worker's user whose initial environment carries it, round after round until
//     a scan finds none (a process that forks meanwhile is found by the next round). A process
//     that clears its environment and leaves its process group escapes this one.
type containment struct {
	scope string

	cgTried bool
	cgDir   string // "" when the set has no cgroup
	cgFD    int
}

func newContainment(scope string) *containment { return &containment{scope: scope, cgFD: -1} }

// how names the way the set's processes are found.
func (c *containment) how() string {
	if c.cgDir != "" {
		return "cgroup v2"
	}
	return "environment marker"
}

// prepare sets attr so the command starts in the set's cgroup, making the cgroup at the first
// command (shell is what the set runs commands with: the probe that the kernel can start a
// process into the cgroup runs it).
func (c *containment) prepare(attr *syscall.SysProcAttr, shell string) {
	if !c.cgTried {
		c.cgTried = true
		c.cgDir, c.cgFD = makeCgroup("openclaw-tools-" + c.scope)
		if c.cgFD >= 0 && !canStartInto(c.cgFD, shell) {
			_ = syscall.Close(c.cgFD)
			_ = os.Remove(c.cgDir)
			c.cgDir, c.cgFD = "", -1
		}
	}
	if c.cgFD >= 0 {
		attr.UseCgroupFD, attr.CgroupFD = true, c.cgFD
	}
}

// canStartInto reports whether a process can be started into the cgroup (clone3
// CLONE_INTO_CGROUP needs Linux 5.7 and a kernel that allows it here).
func canStartInto(fd int, shell string) bool {
	cmd := exec.Command(shell, "-c", "exit 0")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	return cmd.Run() == nil
}

// stop kills every process of the set and returns how many it killed. The scan of /proc is
// bounded by ctx (a process can make reading its environment block).
func (c *containment) stop(ctx context.Context) (int, error) {
	if !c.cgTried { // the set started no command
		return 0, nil
	}
	killed := map[int]bool{}
	var errs []error
	if c.cgDir != "" {
		pids, err := killCgroup(c.cgDir)
		for _, p := range pids {
			killed[p] = true
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := sweepMarked(ctx, []byte(ScopeEnv+"="+c.scope), false, killed); err != nil {
		errs = append(errs, err)
	}
	if c.cgDir != "" {
		_ = syscall.Close(c.cgFD)
		if err := removeCgroup(c.cgDir); err != nil {
			errs = append(errs, err)
		}
		c.cgDir, c.cgFD = "", -1
	}
	return len(killed), errors.Join(errs...)
}

// cgroupRoot is where the worker's own cgroup v2 is: the cgroup2 mount plus the path of
// /proc/self/cgroup's unified line ("" when there is none).
func cgroupRoot() string {
	mount := ""
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			// id parent major:minor root mountpoint options... - fstype source superoptions
			pre, post, ok := strings.Cut(s.Text(), " - ")
			fields := strings.Fields(pre)
			if ok && strings.HasPrefix(post, "cgroup2 ") && len(fields) >= 5 {
				mount = fields[4]
				break
			}
		}
		f.Close()
	}
	if mount == "" {
		return ""
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(mount, filepath.Clean("/"+path))
		}
	}
	return ""
}

// makeCgroup makes a cgroup named name next to the worker's own and opens it; ("", -1) when
// the box does not allow it.
func makeCgroup(name string) (string, int) {
	root := cgroupRoot()
	if root == "" {
		return "", -1
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", -1
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(dir)
		return "", -1
	}
	return dir, fd
}

// cgroupPids lists the processes of the cgroup and of every cgroup below it (a command may make
// child cgroups in the set's own, which it owns, and move into them).
func cgroupPids(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// populated reads the cgroup's cgroup.events: whether a process is left in it or below it.
func populated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return len(cgroupPids(dir)) > 0
	}
	return strings.Contains(string(b), "populated 1")
}

// killCgroup kills every process in the cgroup and below it (cgroup.kill, or SIGKILL one by one on
// a kernel before 5.14) and waits until none is left; it returns the processes it found.
func killCgroup(dir string) ([]int, error) {
	seen := map[int]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := cgroupPids(dir)
		for _, p := range pids {
			seen[p] = true
		}
		// written even when the top level looks empty: cgroup.kill takes the whole subtree
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if !populated(dir) {
			break
		}
		if time.Now().After(deadline) {
			return keys(seen), fmt.Errorf("cgroup %s still holds %d processes", dir, len(cgroupPids(dir)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return keys(seen), nil
}

// removeCgroup removes the emptied cgroup and any a command made below it, deepest first (the last
// processes may take a moment to leave).
func removeCgroup(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var err error
	for i := len(dirs) - 1; i >= 0; i-- {
		for range 100 {
			if err = os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}

// markedRounds bounds the scans of killMarked: a process that forks faster than the scans is
// still found, unless it outpaces this many rounds.
const markedRounds = 50

// sweepMarked runs killMarked under ctx (a process can make reading its environment block) and
// adds what it killed to killed.
func sweepMarked(ctx context.Context, want []byte, prefix bool, killed map[int]bool) error {
	marked := map[int]bool{}
	done := make(chan error, 1)
	go func() { done <- killMarked(want, prefix, marked) }()
	select {
	case err := <-done:
		for p := range marked {
			killed[p] = true
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("find the processes marked %s: %w", want, ctx.Err())
	}
}

// killMarked kills every process of the worker's own user (but the worker) whose initial
// environment holds the entry want (with prefix, an entry that starts with it), scanning /proc
// until a scan finds none; killed gathers them. Only that user's processes are read, root's
// included only when the worker is root: another user's process is never read.
func killMarked(want []byte, prefix bool, killed map[int]bool) error {
	self := os.Getpid()
	uid := os.Getuid()
	marker := string(want)
	for range markedRounds {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return fmt.Errorf("find the turn's processes: %w", err)
		}
		found := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			if info, err := e.Info(); err != nil {
				continue
			} else if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid {
				continue
			}
			env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			if err != nil || !hasEntry(env, want, prefix) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil && !killed[pid] {
				found++
				killed[pid] = true
			}
		}
		if found == 0 {
			return nil
		}
		time.Sleep(5 * time.Millisecond) // the killed leave; a forked child shows in the next scan
	}
	return fmt.Errorf("processes marked %s kept appearing after %d rounds of kills", marker, markedRounds)
}

// hasEntry reports whether a NUL-separated environment holds entry exactly, or, when prefix, an
// entry that starts with it.
func hasEntry(env, entry []byte, prefix bool) bool {
	for len(env) > 0 {
		var e []byte
		e, env, _ = bytes.Cut(env, []byte{0})
		if bytes.Equal(e, entry) || (prefix && bytes.HasPrefix(e, entry)) {
			return true
		}
	}
	return false
}

// StopLeftovers stops what the tool sets of an earlier process of the same owner (Config.Owner)
// left running when that process died in the middle of a turn: every process in one of the
// owner's cgroups, and every process of this user whose environment carries one of the owner's
// scopes. A worker calls it when it starts, before it takes a turn; so does the gateway.
func StopLeftovers(ctx context.Context, owner string) (Stopped, error) {
	if owner == "" || strings.ContainsAny(owner, "-/.") {
		return Stopped{}, fmt.Errorf("stop leftovers: owner %q is not an OwnerOf name", owner)
	}
	killed := map[int]bool{}
	var errs []error
	if root := cgroupRoot(); root != "" {
		dirs, _ := filepath.Glob(filepath.Join(root, "openclaw-tools-"+owner+"-*"))
		for _, dir := range dirs {
			pids, err := killCgroup(dir)
			for _, p := range pids {
				killed[p] = true
			}
			if err == nil {
				err = removeCgroup(dir)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := sweepMarked(ctx, []byte(ScopeEnv+"="+owner+"-"), true, killed); err != nil {
		errs = append(errs, err)
	}
	return Stopped{Processes: len(killed), By: "leftovers of " + owner}, errors.Join(errs...)
}

func keys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
