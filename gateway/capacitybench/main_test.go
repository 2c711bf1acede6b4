package capacitybench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"

	"github.com/openclaw/cloudworkers/internal/testrig/netnsbox"
)

// EnvBench turns the benchmarks on; without it every test here skips at once (`make test`).
const EnvBench = "OPENCLAW_BENCH"

// envChild makes the test binary a bench gateway (see gateway_test.go) instead of running tests.
const envChild = "OPENCLAW_BENCH_GATEWAY"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envChild); dir != "" {
		if err := runGateway(dir); err != nil {
			fmt.Fprintln(os.Stderr, "bench gateway:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if spec := os.Getenv(envBoxTask); spec != "" {
		if err := runBoxTask(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench box side:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	netnsbox.CleanupBinaries()
	printSummary()
	os.Exit(code)
}

func needBench(t *testing.T) {
	t.Helper()
	if os.Getenv(EnvBench) != "1" {
		t.Skipf("benchmark: set %s=1 (make bench)", EnvBench)
	}
}

var summary struct {
	mu    sync.Mutex
	lines [][3]string // section, figure, goal
}

// summarize adds one line to the summary printed after every section.
func summarize(section, figure, goal string) {
	summary.mu.Lock()
	defer summary.mu.Unlock()
	summary.lines = append(summary.lines, [3]string{section, figure, goal})
}

func printSummary() {
	summary.mu.Lock()
	defer summary.mu.Unlock()
	if len(summary.lines) == 0 {
		return
	}
	// Sections print as they run (in file order); the summary is in section order.
	slices.SortStableFunc(summary.lines, func(a, b [3]string) int { return strings.Compare(a[0], b[0]) })
	fmt.Printf("\n== Summary (%s, %d cores, %s, %s) ==\n", machine(), runtime.NumCPU(), runtime.Version(), load())
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "section\tfigure\tgoal")
	for _, l := range summary.lines {
		fmt.Fprintf(w, "%s\t%s\t%s\n", l[0], l[1], l[2])
	}
	w.Flush()
}

// machine names the CPU this ran on.
func machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// table prints a titled table: a header row then rows, tab-separated.
func table(title string, header string, rows []string) {
	fmt.Printf("\n== %s ==\n", title)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	w.Flush()
}

// load names the machine's load averages now (the machine is shared: figures are pessimistic).
func load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load unknown"
	}
	return "load " + strings.Join(f[:3], " ")
}
