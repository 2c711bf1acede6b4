package stream

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// The box side of a sync, shared by `openclaw worker unpack|pack|manifest` and test binaries.

// BoxUnpack applies an archive from the gateway on stdin into dir. Like every command of the box's
// side of a sync, it first gives its pipe from or to sshd more room (growPipe).
func BoxUnpack(ctx context.Context, stdin io.Reader, dir string) (Stats, error) {
	growPipe(stdin)
	return Apply(ctx, stdin, dir, ApplyOptions{Limits: TrustedLimits, AllowEscapingSymlinks: true, UpdateCache: true})
}

// BoxPack reads a plan on stdin and writes its archive of dir to stdout.
func BoxPack(ctx context.Context, stdin io.Reader, stdout io.Writer, dir string) (Stats, error) {
	growPipe(stdout)
	p, err := ReadPlanRequest(stdin, TrustedLimits)
	if err != nil {
		return Stats{}, err
	}
	return Write(ctx, stdout, dir, *p)
}

// BoxManifest writes the manifest of dir to stdout.
func BoxManifest(ctx context.Context, stdout io.Writer, dir string, opts manifest.Options) error {
	growPipe(stdout)
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
// The gateway starts all of them at once, after opening their channels.
var FeedTimeout = 10 * time.Second

// BoxUnpackParts applies one sync sent in parts parts over as many channels: part streams other
// than stdin's arrive through `feed` commands (BoxFeed) that connect to the unix socket at
// socket, in a directory of its own that this creates (mode 0700; it must not exist, so another
// user cannot have prepared it) and removes. The parts are applied together (ApplyParts): nothing
// is committed unless every one verified.
func BoxUnpackParts(ctx context.Context, stdin io.Reader, dir string, parts int, socket string) (Stats, error) {
	if parts < 2 {
		return BoxUnpack(ctx, stdin, dir)
	}
	growPipe(stdin)
	if parts > MaxParts {
		return Stats{}, fmt.Errorf("unpack: %d parts, at most %d", parts, MaxParts)
	}
	sdir := filepath.Dir(socket)
	if err := os.MkdirAll(filepath.Dir(sdir), 0o755); err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket directory: %w", err)
	}
	sweepFeedDirs(filepath.Dir(sdir))
	if err := os.Mkdir(sdir, 0o700); err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket directory: %w", err)
	}
	defer os.RemoveAll(sdir)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return Stats{}, fmt.Errorf("unpack: feed socket: %w", err)
	}
	defer ln.Close()
	// Stopped (SIGTERM from the gateway when a feed failed): no more waiting for the feeds.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	rs := []io.Reader{stdin}
	var closers []io.Closer // the feeds' connections and the streams they handed over
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	deadline := time.Now().Add(FeedTimeout)
	_ = ln.(*net.UnixListener).SetDeadline(deadline)
	for len(rs) < parts {
		c, err := ln.Accept()
		if err == nil {
			closers = append(closers, c)
			var f *os.File
			if f, err = takeFeed(ctx, c.(*net.UnixConn), deadline); err == nil {
				growPipe(f)
				rs = append(rs, f)
				closers = append(closers, f)
				continue
			}
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Stats{}, fmt.Errorf("unpack: %d of %d parts arrived: %w", len(rs), parts, err)
	}
	ln.Close()
	return ApplyParts(ctx, rs, dir, ApplyOptions{Limits: TrustedLimits, AllowEscapingSymlinks: true, UpdateCache: true})
}

// MaxParts bounds the channels of one sync: OpenSSH's sshd allows 10 sessions per connection
// (MaxSessions), and the sync connection also runs the box's manifest.
const MaxParts = 8

// feedDirPrefix names the directories of feed sockets.
const feedDirPrefix = ".openclaw-feed-"

// sweepFeedDirs removes this user's feed socket directories in dir older than ten minutes: those
// of unpacks that were killed (their feeders connect within FeedTimeout, after which the socket is
// not used).
func sweepFeedDirs(dir string) {
	matches, _ := filepath.Glob(filepath.Join(dir, feedDirPrefix+"*"))
	for _, m := range matches {
		fi, err := os.Lstat(m)
		if err == nil && ownDir(fi) && time.Since(fi.ModTime()) > 10*time.Minute {
			_ = os.RemoveAll(m)
		}
	}
}

// ownDir reports whether fi is a real directory (not a symlink) of this user's, mode 0700.
func ownDir(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm() == 0o700 && ok && int(st.Uid) == os.Geteuid()
}

// feedHandOver is a feed's one message on the socket, sent with its stdin's descriptor (SCM_RIGHTS).
const feedHandOver = 'H'

// takeFeed reads a feed's message by deadline and returns the part's stream: the handed-over
// descriptor, read with blocking reads like the unpack's own stdin. Through the runtime's poller
// (non-blocking, woken by epoll among the busy writers) the part fell behind the one on stdin: a
// cold sync in two parts of GOROOT/src had its second part end 90–165 ms after the first, with one
// channel left to carry the rest. A read in progress ends with the part's next data or its end:
// the gateway sends a part until it is done, ends its stream when its own side fails, and closes
// every channel once the unpack has exited (see unpackRun.run); when the unpack fails, the other
// parts stop at their next entry.
func takeFeed(ctx context.Context, c *net.UnixConn, deadline time.Time) (*os.File, error) {
	_ = c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) }) // stopped: no more waiting
	defer stop()
	var b [1]byte
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	var fds []int
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if n != 1 || b[0] != feedHandOver || len(fds) != 1 {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, fmt.Errorf("feed: unexpected message (%d bytes, %d descriptors)", n, len(fds))
	}
	if err := syscall.SetNonblock(fds[0], false); err != nil {
		syscall.Close(fds[0])
		return nil, fmt.Errorf("feed: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "feed part"), nil
}

// BoxFeed hands stdin (sshd's pipe of the feed's channel) over to the BoxUnpackParts listening
// on the unix socket, waiting up to FeedTimeout for it to listen, then waits until the unpack has
// read it: the unpack reads the part straight from sshd, without this process copying every byte
// through the socket.
func BoxFeed(ctx context.Context, stdin *os.File, socket string) error {
	deadline := time.Now().Add(FeedTimeout)
	var c net.Conn
	for {
		// Only a directory of this user's, 0700, as the unpack makes it: another user's could
		// hold a listener of theirs.
		if fi, err := os.Lstat(filepath.Dir(socket)); err == nil && !ownDir(fi) {
			return fmt.Errorf("feed: %s is not a 0700 directory of this user's: not sending there", filepath.Dir(socket))
		}
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
	_, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte{feedHandOver}, syscall.UnixRights(int(stdin.Fd())), nil)
	runtime.KeepAlive(stdin)
	if err != nil {
		return fmt.Errorf("feed: hand over stdin: %w", err)
	}
	// The unpack closes the connection once it is done with the part (read to its end, or given
	// up; its own exit says whether the sync was applied): until then this command runs, and
	// sshd's side of the stream stays open.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	_, _ = io.Copy(io.Discard, c)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("feed: %w", err)
	}
	return nil
}
