package stream

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// The box side of a sync, shared by `openclaw worker unpack|pack|manifest` and test binaries.

// BoxUnpack applies an archive from the gateway on stdin into dir.
func BoxUnpack(ctx context.Context, stdin io.Reader, dir string) (Stats, error) {
	return Apply(ctx, stdin, dir, ApplyOptions{AllowEscapingSymlinks: true, UpdateCache: true})
}

// BoxPack reads a plan on stdin and writes its archive of dir to stdout.
func BoxPack(ctx context.Context, stdin io.Reader, stdout io.Writer, dir string) (Stats, error) {
	p, err := ReadPlanRequest(stdin, Limits{})
	if err != nil {
		return Stats{}, err
	}
	return Write(ctx, stdout, dir, *p)
}

// BoxManifest writes the manifest of dir to stdout.
func BoxManifest(ctx context.Context, stdout io.Writer, dir string, opts manifest.Options) error {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		// A cold box: an empty tree.
		if os.IsNotExist(err) {
			return (&manifest.Manifest{Version: manifest.Version, Entries: []manifest.Entry{}}).Encode(stdout)
		}
		return fmt.Errorf("manifest of %s: not a directory", dir)
	}
	m, _, err := manifest.Build(ctx, dir, opts)
	if err != nil {
		return err
	}
	if m.Entries == nil {
		m.Entries = []manifest.Entry{}
	}
	return m.Encode(stdout)
}
