package protocol

import (
	"errors"
	"path/filepath"
)

// LaunchDescriptor is what the gateway hands a worker it starts, as JSON on stdin or in a 0600
// file of the worker's state dir.
type LaunchDescriptor struct {
	EnvironmentID string `json:"environmentId"`
	Credential    string `json:"credential"`
	OwnerEpoch    uint64 `json:"ownerEpoch"`
	// BundleHash is the bundle the gateway pushed; the worker reports its own executable's hash.
	BundleHash string `json:"bundleHash"`
	SocketPath string `json:"socketPath"`
	StateDir   string `json:"stateDir"`
	// Version is the gateway's build version, reported back for logs and audit.
	Version string `json:"version"`
}

// Validate names the first field the worker cannot start without.
func (d *LaunchDescriptor) Validate() error {
	switch {
	case d.EnvironmentID == "":
		return errors.New("launch descriptor: environmentId is required")
	case d.Credential == "":
		return errors.New("launch descriptor: credential is required")
	case d.SocketPath == "":
		return errors.New("launch descriptor: socketPath is required")
	case d.StateDir == "" || !filepath.IsAbs(d.StateDir):
		return errors.New("launch descriptor: stateDir must be an absolute path")
	}
	return nil
}
