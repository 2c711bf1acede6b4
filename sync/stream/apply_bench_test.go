package stream

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// BenchmarkApplyGoroot applies an archive of $(go env GOROOT)/src into an empty directory: the
// box side of an initial sync, without the network.
func BenchmarkApplyGoroot(b *testing.B) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skip(err)
	}
	src := filepath.Join(strings.TrimSpace(string(goroot)), "src")
	ctx := context.Background()
	m, _, err := manifest.Build(ctx, src, manifest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(ctx, &buf, src, PlanFor(nil, m)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(m.TotalSize())
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		dst := filepath.Join(b.TempDir(), "dst")
		b.StartTimer()
		if _, err := BoxUnpack(ctx, bytes.NewReader(buf.Bytes()), dst); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
}
