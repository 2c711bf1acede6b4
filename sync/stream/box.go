package stream

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

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

// FeedTimeout bounds how long BoxUnpackParts waits for its feeders, and BoxFeed for the socket.
var FeedTimeout = 30 * time.Second

// BoxUnpackParts applies one sync sent in parts parts over as many channels: part streams other
// than stdin's arrive through `feed` commands (BoxFeed) that connect to the unix socket at
// socket, in a directory of its own that this creates (mode 0700; it must not exist, so another
// user cannot have prepared it) and removes. The parts are applied together (ApplyParts): nothing
// is committed unless every one verified.
func BoxUnpackParts(ctx context.Context, stdin io.Reader, dir string, parts int, socket string) (Stats, error) {
	if parts < 2 {
		return BoxUnpack(ctx, stdin, dir)
	}
	if parts > MaxParts {
		return Stats{}, fmt.Errorf("unpack: %d parts, at most %d", parts, MaxParts)
	}
	sdir := filepath.Dir(socket)
	if err := os.MkdirAll(filepath.Dir(sdir), 0o755); err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket directory: %w", err)
	}
	if err := os.Mkdir(sdir, 0o700); err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket directory: %w", err)
	}
	defer os.RemoveAll(sdir)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket: %w", err)
	}
	defer ln.Close()
	rs := []io.Reader{stdin}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	deadline := time.Now().Add(FeedTimeout)
	_ = ln.(*net.UnixListener).SetDeadline(deadline)
	for len(rs) < parts {
		c, err := ln.Accept()
		if err != nil {
			return Stats{}, fmt.Errorf("unpack: %d of %d parts arrived: %w", len(rs), parts, err)
		}
		conns = append(conns, c)
		rs = append(rs, c)
	}
	ln.Close()
	return ApplyParts(ctx, rs, dir, ApplyOptions{AllowEscapingSymlinks: true, UpdateCache: true})
}

// MaxParts bounds the channels of one sync.
const MaxParts = 16

// BoxFeed copies stdin to the unix socket of a BoxUnpackParts, waiting up to FeedTimeout for it to
// listen.
func BoxFeed(ctx context.Context, stdin io.Reader, socket string) error {
	deadline := time.Now().Add(FeedTimeout)
	var c net.Conn
	for {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, "unix", socket)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("feed: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer c.Close()
	if _, err := io.Copy(c, stdin); err != nil {
		return fmt.Errorf("feed: %w", err)
	}
	// The unpacking side reads to the end of the part, then closes (or exits): wait for it, so
	// that this command's exit says the part was taken.
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		return fmt.Errorf("feed: %w", err)
	}
	_, _ = io.Copy(io.Discard, c)
	return nil
}
