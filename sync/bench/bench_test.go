package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/internal/testenv"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// EnvBench turns the benchmark on; it is not part of `make test`.
const EnvBench = "OPENCLAW_BENCH"

func TestMain(m *testing.M) {
	code := m.Run()
	synctest.CleanupBinaries()
	os.Exit(code)
}

type phase struct {
	name                 string
	ours, rsyncA, rsyncZ time.Duration
	note                 string
}

// TestSyncVsRsync syncs $(go env GOROOT)/src to a netns box running OpenSSH sshd with our
// sync (manifest, tar+zstd stream into `openclaw worker unpack`), with `rsync -a` and with
// `rsync -az` over ssh on the same link, and prints the times and ratios for an initial sync, a
// no-op resync and a resync after changing 1% of the files.
func TestSyncVsRsync(t *testing.T) {
	if os.Getenv(EnvBench) != "1" {
		t.Skipf("benchmark: set %s=1 (make bench)", EnvBench)
	}
	testenv.RequireCommands(t, "rsync", "ssh")
	box := synctest.NetnsBox(t, "ocl_syncbench1")
	bin := synctest.BuildBinary(t, "github.com/openclaw/cloudworkers/cmd/openclaw")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
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
	remote := stream.Remote{Client: client, Command: bootstrap.Quote(bin) + " worker"}
	ours := filepath.Join(box.Home, "ours")
	mopts := stream.ManifestOptions{CacheFile: filepath.Join(box.Home, ".openclaw-sync-cache.json")}
	cache := manifest.NewCache() // the gateway keeps its hash cache between syncs
	var last stream.Stats
	var lastPlan stream.Plan
	var lastBuild time.Duration
	syncOurs := func() time.Duration {
		start := time.Now()
		// The local manifest is built while the box builds its own.
		var err error
		_, lastPlan, last, err = stream.PushBuild(ctx, remote, src, ours, func(ctx context.Context) (*manifest.Manifest, error) {
			m, _, err := manifest.Build(ctx, src, manifest.Options{Cache: cache})
			lastBuild = time.Since(start)
			return m, err
		}, true, mopts)
		if err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}

	known := synctest.KnownHosts(t, box)
	sshCmd := fmt.Sprintf("ssh -i %s -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o BatchMode=yes -p %d",
		box.KeyPath, known, box.Port)
	rsync := func(flags, dst string) time.Duration {
		start := time.Now()
		cmd := exec.CommandContext(ctx, "rsync", flags, "--delete", "-e", sshCmd, src+"/", box.User+"@"+box.Host+":"+dst+"/")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rsync %s: %v\n%s", flags, err, out)
		}
		return time.Since(start)
	}
	run := func(name string) phase {
		p := phase{name: name}
		p.ours = syncOurs()
		p.note = fmt.Sprintf("local manifest %s (the box made its own meanwhile), then %s more: sent %d files, %d MB, %d deletions",
			round(lastBuild), round(p.ours-lastBuild), last.Files, last.Bytes>>20, len(lastPlan.Deletes))
		p.rsyncA = rsync("-a", filepath.Join(box.Home, "rsync-a"))
		p.rsyncZ = rsync("-az", filepath.Join(box.Home, "rsync-az"))
		return p
	}

	var phases []phase
	phases = append(phases, run("initial"))
	phases = append(phases, run("no-op resync"))
	n := touchOnePercent(t, src)
	phases = append(phases, run(fmt.Sprintf("1%% changed (%d files)", n)))

	// Our copy on the box is the tree.
	want, _, err := manifest.Build(ctx, src, manifest.Options{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Manifest(ctx, ours, mopts)
	if err != nil {
		t.Fatal(err)
	}
	if c := manifest.Diff(want, got); !c.Empty() {
		t.Fatalf("box tree differs: %d added %d changed %d deleted", len(c.Added), len(c.Changed), len(c.Deleted))
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nsync of %s/src (%d files, %d MB) to a netns box with OpenSSH sshd; %d CPUs\n\n",
		strings.TrimSpace(string(goroot)), want.Files(), want.TotalSize()>>20, runtime.NumCPU())
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tours\trsync -a\trsync -az\tours/rsync -a\tours/rsync -az\t")
	for _, p := range phases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t\n", p.name, round(p.ours), round(p.rsyncA), round(p.rsyncZ),
			p.ours.Seconds()/p.rsyncA.Seconds(), p.ours.Seconds()/p.rsyncZ.Seconds())
	}
	tw.Flush()
	for _, p := range phases {
		fmt.Fprintf(&b, "ours, %s: %s\n", p.name, p.note)
	}
	t.Log(b.String())
	fmt.Println(b.String())
}

func round(d time.Duration) string { return d.Round(time.Millisecond).String() }

// touchOnePercent appends a line to every hundredth file (sorted by path) and returns how many.
func touchOnePercent(t *testing.T, root string) int {
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
	for i := 0; i < len(files); i += 100 {
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
