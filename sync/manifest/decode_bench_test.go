package manifest

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkDecodeGoroot decodes the manifest of $(go env GOROOT)/src: what the gateway does with a
// box's manifest of a large tree on every pull-back.
func BenchmarkDecodeGoroot(b *testing.B) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skip(err)
	}
	m, _, err := Build(context.Background(), filepath.Join(strings.TrimSpace(string(goroot)), "src"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := m.Encode(&buf); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(buf.Len())/float64(len(m.Entries)), "B/entry")
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		if _, err := Decode(bytes.NewReader(buf.Bytes()), Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
