package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/internal/version"
)

// Bundle is a worker executable for one platform, identified by its sha256.
type Bundle struct {
	Path   string
	SHA256 string
	GOOS   string
	GOARCH string
}

// Platform maps `uname -s -m` output to GOOS/GOARCH.
func Platform(uname string) (goos, goarch string, err error) {
	f := strings.Fields(uname)
	if len(f) != 2 {
		return "", "", fmt.Errorf("unexpected uname output %q", strings.TrimSpace(uname))
	}
	switch f[0] {
	case "Linux":
		goos = "linux"
	case "Darwin":
		goos = "darwin"
	default:
		return "", "", fmt.Errorf("unsupported box OS %q", f[0])
	}
	switch f[1] {
	case "x86_64", "amd64":
		goarch = "amd64"
	case "aarch64", "arm64":
		goarch = "arm64"
	default:
		return "", "", fmt.Errorf("unsupported box architecture %q", f[1])
	}
	return goos, goarch, nil
}

// SelectBundle returns the gateway's own executable when it matches the box, otherwise
// <bundleDir>/openclaw-<goos>-<goarch> (built by `make bundles`).
func SelectBundle(goos, goarch, bundleDir string) (Bundle, error) {
	if goos == runtime.GOOS && goarch == runtime.GOARCH {
		p, sum, err := version.ExecutableSHA256()
		if err != nil {
			return Bundle{}, fmt.Errorf("hash own executable: %w", err)
		}
		return Bundle{Path: p, SHA256: sum, GOOS: goos, GOARCH: goarch}, nil
	}
	name := fmt.Sprintf("openclaw-%s-%s", goos, goarch)
	if bundleDir == "" {
		return Bundle{}, fmt.Errorf("box is %s/%s, gateway is %s/%s, and no bundle directory is configured (run `make bundles` and set bundleDir)", goos, goarch, runtime.GOOS, runtime.GOARCH)
	}
	p := filepath.Join(bundleDir, name)
	sum, err := version.FileSHA256(p)
	if err != nil {
		return Bundle{}, fmt.Errorf("box is %s/%s: no bundle %s (run `make bundles`): %w", goos, goarch, p, err)
	}
	return Bundle{Path: p, SHA256: sum, GOOS: goos, GOARCH: goarch}, nil
}

// BundlesDir is where bundles live on the box, relative to HOME.
const BundlesDir = ".openclaw-worker/bundles"

// InstallResult says what Install did.
type InstallResult struct {
	RemotePath string
	Uploaded   int64 // bytes sent; 0 on a warm box
	Pruned     []string
}

// Install puts the bundle at ~/.openclaw-worker/bundles/<sha256>/openclaw unless it is already there
// with that hash: upload to a temp name over SFTP, verify the hash on the box, chmod, rename. It is
// idempotent from any interruption. It keeps the newest keep bundles and prunes older ones.
func Install(ctx context.Context, c *ssh.Client, home string, b Bundle, keep int) (InstallResult, error) {
	dir := path.Join(home, BundlesDir, b.SHA256)
	final := path.Join(dir, "openclaw")
	res := InstallResult{RemotePath: final}
	if sum, err := remoteSHA256(ctx, c, final); err == nil && sum == b.SHA256 {
		res.Pruned, _ = prune(ctx, c, path.Join(home, BundlesDir), b.SHA256, keep)
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	stop := tunnel.CloseOnDone(ctx, c) // sftp calls take no context: a silent box is cut off
	defer stop()
	sc, err := sftp.NewClient(c, sftp.UseConcurrentWrites(true))
	if err != nil {
		return res, fmt.Errorf("sftp: %w", err)
	}
	defer sc.Close()
	if err := sc.MkdirAll(dir); err != nil {
		return res, fmt.Errorf("create %s: %w", dir, err)
	}
	tmp := path.Join(dir, ".openclaw.tmp-"+ids.Hex(6))
	n, err := upload(ctx, sc, b.Path, tmp)
	res.Uploaded = n
	if err != nil {
		_ = sc.Remove(tmp)
		return res, err
	}
	sum, err := remoteSHA256(ctx, c, tmp)
	if err != nil || sum != b.SHA256 {
		_ = sc.Remove(tmp)
		if err == nil {
			err = fmt.Errorf("hash on box is %s, expected %s", sum, b.SHA256)
		}
		return res, fmt.Errorf("verify uploaded bundle: %w", err)
	}
	if err := sc.Chmod(tmp, 0o755); err != nil {
		return res, fmt.Errorf("chmod bundle: %w", err)
	}
	if err := sc.PosixRename(tmp, final); err != nil {
		if _, err2 := RunOK(ctx, c, "install bundle", "mv -f "+untrusted.Quote(tmp)+" "+untrusted.Quote(final)); err2 != nil {
			return res, err2
		}
	}
	res.Pruned, _ = prune(ctx, c, path.Join(home, BundlesDir), b.SHA256, keep)
	return res, nil
}

func upload(ctx context.Context, sc *sftp.Client, local, remote string) (int64, error) {
	src, err := os.Open(local)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := sc.OpenFile(remote, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return 0, fmt.Errorf("create %s on box: %w", remote, err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			dst.Close()
		case <-done:
		}
	}()
	n, err := dst.ReadFrom(src)
	close(done)
	if cerr := dst.Close(); err == nil && cerr != nil && !errors.Is(cerr, os.ErrClosed) {
		err = cerr
	}
	if ctx.Err() != nil {
		return n, ctx.Err()
	}
	if err != nil {
		return n, fmt.Errorf("upload bundle: %w", err)
	}
	return n, nil
}

func remoteSHA256(ctx context.Context, c *ssh.Client, p string) (string, error) {
	out, err := RunOK(ctx, c, "hash "+p, "sha256sum "+untrusted.Quote(p))
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) == 0 || len(f[0]) != 64 {
		return "", fmt.Errorf("unexpected sha256sum output %q", out)
	}
	return f[0], nil
}

// prune removes bundle directories beyond the newest keep (never the current one).
func prune(ctx context.Context, c *ssh.Client, dir, current string, keep int) ([]string, error) {
	if keep < 1 {
		keep = 1
	}
	out, err := RunOK(ctx, c, "list bundles", "cd "+untrusted.Quote(dir)+" && ls -1t")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Fields(out) {
		if len(n) == 64 && strings.Trim(n, "0123456789abcdef") == "" && n != current { // a bundle's sha256, nothing else
			names = append(names, n)
		}
	}
	if len(names) <= keep-1 {
		return nil, nil
	}
	old := names[keep-1:]
	args := make([]string, len(old))
	for i, n := range old {
		args[i] = untrusted.Quote(path.Join(dir, n))
	}
	_, err = RunOK(ctx, c, "prune bundles", "rm -rf "+strings.Join(args, " "))
	return old, err
}
