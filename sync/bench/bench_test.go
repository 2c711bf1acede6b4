package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// EnvBench turns the benchmark on; it is not part of `make test`.
const EnvBench = "OPENCLAW_BENCH"

// EnvRounds sets how many times each phase is measured (default 3).
const EnvRounds = "OPENCLAW_BENCH_ROUNDS"

// EnvChannels sets stream.Remote.Channels for our sync (default stream.DefaultChannels).
const EnvChannels = "OPENCLAW_BENCH_CHANNELS"

func TestMain(m *testing.M) {
	code := m.Run()
	synctest.CleanupBinaries()
	os.Exit(code)
}

// tool is one way of syncing the tree to a directory on the box.
type tool struct {
	name string
	sync func(dst string) time.Duration
}

// phase holds every round's time of every tool, in tool order.
type phase struct {
	name  string
	times [][]time.Duration // [tool][round]
	cpu   [][]time.Duration // the machine's busy CPU time during each run: [tool][round]
	note  string
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// TestSyncVsRsync syncs $(go env GOROOT)/src to a netns box running OpenSSH sshd with our
// sync (stream.PushTree: the tree listed while the box lists its copy; a cold box gets one
// tar+zstd stream whose files are hashed as they are sent; a warm one only the difference), with
// `rsync -a` and with `rsync -az` over ssh on the same link, and prints the times and ratios for
// an initial sync, a no-op resync and a resync after changing 1% of the files.
//
// Every phase is measured in several rounds (OPENCLAW_BENCH_ROUNDS, default 3), after one
// uncounted round that warms every tool, and the order of the tools rotates from round to round, so
// that none always runs first or last; each run starts after sync(2); the table shows medians, and
// each round's ratios are printed too. Initial
// syncs go to a fresh directory each round; nothing is deleted on the box until the end (a burst of
// deletions slows the next file creations on ext4 for a minute or more, and would penalise
// whichever tool comes next).
func TestSyncVsRsync(t *testing.T) {
	if os.Getenv(EnvBench) != "1" {
		t.Skipf("benchmark: set %s=1 (make bench)", EnvBench)
	}
	rounds := 3
	if v := os.Getenv(EnvRounds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 20 {
			t.Fatalf("%s=%q: want a number of rounds from 1 to 20", EnvRounds, v)
		}
		rounds = n
	}
	testenv.RequireCommands(t, "rsync", "ssh")
	box := synctest.NetnsBox(t, "ocl_syncbench1")
	bin := synctest.BuildBinary(t, "github.com/openclaw/cloudworkers/cmd/openclaw")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	// A private copy of the tree, so that 1% of it can be changed.
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("cp", "-a", filepath.Join(strings.TrimSpace(string(goroot)), "src"), src).CombinedOutput(); err != nil {
		t.Fatalf("copy tree: %v %s", err, out)
	}

	client := synctest.Dial(t, box)
	remote := stream.Remote{Client: client, Command: untrusted.Quote(bin) + " worker"}
	if v := os.Getenv(EnvChannels); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > stream.MaxParts {
			t.Fatalf("%s=%q: want a number of channels from 1 to %d", EnvChannels, v, stream.MaxParts)
		}
		remote.Channels = n
	}
	var cache *manifest.Cache // the gateway's hash cache of src, kept between syncs of one directory
	var last stream.Result
	ours := func(dst string) time.Duration {
		start := time.Now()
		res, err := stream.PushTree(ctx, remote, src, dst, stream.TreeOptions{
			Cache: cache, Manifest: stream.ManifestOptions{CacheFile: dst + ".openclaw-sync-cache.json"}})
		if err != nil {
			t.Fatal(err)
		}
		last = res
		return time.Since(start)
	}

	known := synctest.KnownHosts(t, box)
	sshCmd := fmt.Sprintf("ssh -i %s -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o BatchMode=yes -p %d",
		box.KeyPath, known, box.Port)
	rsync := func(flags string) func(string) time.Duration {
		return func(dst string) time.Duration {
			start := time.Now()
			cmd := exec.CommandContext(ctx, "rsync", flags, "--delete", "-e", sshCmd, src+"/", box.User+"@"+box.Host+":"+dst+"/")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("rsync %s: %v\n%s", flags, err, out)
			}
			return time.Since(start)
		}
	}
	tools := []tool{{"ours", ours}, {"rsync -a", rsync("-a")}, {"rsync -az", rsync("-az")}}
	// dir is where a tool's copy of one round goes on the box (round -1: the warm-up's).
	dir := func(ti, round int) string {
		name := strings.NewReplacer(" ", "", "-", "").Replace(tools[ti].name)
		if round < 0 {
			return filepath.Join(box.Home, "warmup-"+name)
		}
		return filepath.Join(box.Home, fmt.Sprintf("%s-%d", name, round))
	}
	// measure runs every tool once per round, rotating the order, into dst(tool, round).
	measure := func(name string, before func(round int), dst func(ti, round int) string, fresh bool) phase {
		p := phase{name: name, times: make([][]time.Duration, len(tools)), cpu: make([][]time.Duration, len(tools))}
		var notes []string
		for r := 0; r < rounds; r++ {
			if before != nil {
				before(r)
			}
			for k := range tools {
				ti := (r + k) % len(tools)
				if ti == 0 && fresh {
					cache = manifest.NewCache() // an initial sync: the gateway has never seen the tree
				}
				// The previous run's files are written back first, so that no run pays (in CPU
				// and disk time) for the writeback of the one before it.
				syscall.Sync()
				c0 := busyCPU(t)
				d := tools[ti].sync(dst(ti, r))
				p.times[ti] = append(p.times[ti], d)
				p.cpu[ti] = append(p.cpu[ti], busyCPU(t)-c0)
				if ti == 0 {
					notes = append(notes, fmt.Sprintf("%s (%s: sent %d files, %d MB, %d deletions; listed %s, box listed %s, hashed %s, transfer %s)",
						round(d), last.Kind, last.Stats.Files, last.Stats.Bytes>>20, len(last.Plan.Deletes),
						round(last.List), round(last.BoxList), round(last.Hash), round(last.Transfer)))
				}
			}
		}
		p.note = strings.Join(notes, "; ")
		return p
	}

	// One round before the measured ones, not counted: each tool's first run pays for what is cold
	// then (its programs' pages, the box's first process start, the filesystem right after the
	// set-up) — in the table it was whichever tool the rotation put first.
	for ti := range tools {
		if ti == 0 {
			cache = manifest.NewCache()
		}
		syscall.Sync()
		tools[ti].sync(dir(ti, -1))
	}
	var phases []phase
	phases = append(phases, measure("initial", nil, dir, true))
	// Resyncs go to the last round's copies, each tool to its own.
	lastDir := func(ti, _ int) string { return dir(ti, rounds-1) }
	phases = append(phases, measure("no-op resync", nil, lastDir, false))
	var changed int
	phases = append(phases, measure("1% changed", func(r int) { changed = touchOnePercent(t, src, r) }, lastDir, false))
	phases[2].name = fmt.Sprintf("1%% changed (%d files)", changed)

	// Our copy on the box is the tree.
	want, _, err := manifest.Build(ctx, src, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Manifest(ctx, lastDir(0, 0), stream.ManifestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := manifest.Diff(want, got); !c.Empty() {
		t.Fatalf("box tree differs: %d added %d changed %d deleted", len(c.Added), len(c.Changed), len(c.Deleted))
	}

	var b strings.Builder
	channels := remote.Channels
	if channels == 0 {
		channels = stream.DefaultChannels
	}
	fmt.Fprintf(&b, "\nsync of %s/src (%d files, %d MB) to a netns box with OpenSSH sshd; %d CPUs; median of %d rounds; ours with up to %d channels\n\n",
		strings.TrimSpace(string(goroot)), want.Files(), want.TotalSize()>>20, runtime.NumCPU(), rounds, channels)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tours\trsync -a\trsync -az\tours/rsync -a\tours/rsync -az\t")
	for _, p := range phases {
		o, a, z := median(p.times[0]), median(p.times[1]), median(p.times[2])
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t\n", p.name, round(o), round(a), round(z), o.Seconds()/a.Seconds(), o.Seconds()/z.Seconds())
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nCPU time used by the whole machine during the run (both ends of the link share its CPUs), median:\n\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tours\trsync -a\trsync -az\t")
	for _, p := range phases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", p.name, round(median(p.cpu[0])), round(median(p.cpu[1])), round(median(p.cpu[2])))
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nper round (ours/rsync -a):\n")
	for _, p := range phases {
		var rs []string
		for r := range p.times[0] {
			rs = append(rs, fmt.Sprintf("%.2f (%s vs %s)", p.times[0][r].Seconds()/p.times[1][r].Seconds(), round(p.times[0][r]), round(p.times[1][r])))
		}
		fmt.Fprintf(&b, "  %s: %s\n", p.name, strings.Join(rs, ", "))
	}
	fmt.Fprintf(&b, "\nours per round:\n")
	for _, p := range phases {
		fmt.Fprintf(&b, "  %s: %s\n", p.name, p.note)
	}
	t.Log(b.String())
	fmt.Println(b.String())
}

func round(d time.Duration) string { return d.Round(time.Millisecond).String() }

// busyCPU is the CPU time the machine has spent busy (user, nice, system, irq, softirq: the first
// line of /proc/stat, in USER_HZ ticks of 10 ms).
func busyCPU(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	if len(f) < 8 || f[0] != "cpu" {
		t.Fatalf("/proc/stat: unexpected first line %q", f)
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %v", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// touchOnePercent appends a line to every hundredth file (sorted by path), starting at the
// offset-th one, and returns how many.
func touchOnePercent(t *testing.T, root string, offset int) int {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	n := 0
	for i := offset % 100; i < len(files); i += 100 {
		f, err := os.OpenFile(files[i], os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "\n// changed by the sync benchmark\n")
		f.Close()
		n++
	}
	return n
}
