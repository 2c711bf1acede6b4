// Package version reports the build identity of the openclaw binary.
package version

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
)

// Set at link time with -ldflags "-X github.com/openclaw/cloudworkers/internal/version.Version=…".
var (
	Version = "dev"
	Commit  = ""
)

// Info is what `openclaw version` prints.
type Info struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"`
	Executable string `json:"executable"`
	SHA256     string `json:"sha256"`
}

var (
	hashOnce sync.Once
	hashPath string
	hashSum  string
	hashErr  error
)

// ExecutableSHA256 returns the path and sha256 of the running executable (computed once).
func ExecutableSHA256() (path, sum string, err error) {
	hashOnce.Do(func() {
		hashPath, hashErr = os.Executable()
		if hashErr != nil {
			return
		}
		hashSum, hashErr = FileSHA256(hashPath)
	})
	return hashPath, hashSum, hashErr
}

// FileSHA256 hashes a file.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Get returns the build identity, including the executable hash.
func Get() (Info, error) {
	commit := Commit
	if commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					commit = s.Value
				}
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	path, sum, err := ExecutableSHA256()
	return Info{Version: Version, Commit: commit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Executable: path, SHA256: sum}, err
}
