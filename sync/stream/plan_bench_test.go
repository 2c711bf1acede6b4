package stream

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// BenchmarkReadPlanGoroot reads and checks the plan of a sync of $(go env GOROOT)/src: what
// the box does first with every initial sync (and the gateway with every pull-back's archive).
func BenchmarkReadPlanGoroot(b *testing.B) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skip(err)
	}
	m, _, err := manifest.Build(b.Context(), filepath.Join(strings.TrimSpace(string(goroot)), "src"), manifest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pb, err := json.Marshal(PlanFor(nil, m))
	if err != nil {
		b.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Name: headerName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(pb))})
	_, _ = tw.Write(pb)
	_ = tw.Close()
	opts := ApplyOptions{Limits: Limits{MaxEntries: 1_000_000, MaxPlanBytes: 256 << 20}}
	opts.Limits.setDefaults()
	b.SetBytes(int64(len(pb)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readPlan(tar.NewReader(bytes.NewReader(tb.Bytes())), opts); err != nil {
			b.Fatal(err)
		}
	}
}
