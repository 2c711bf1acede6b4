package stream

import (
	"context"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// TestRemoteHonoursContextOnHostileBox: a box that never answers a channel open, and one whose
// commands never end and ignore signals and close, cannot hold a sync past its context: the
// operation returns once the context ends (the connection is closed under it if need be).
func TestRemoteHonoursContextOnHostileBox(t *testing.T) {
	for _, c := range []struct {
		name string
		mode tunneltest.Mode
	}{{"no channel answers", tunneltest.NoChannels}, {"command never ends", tunneltest.Hung}} {
		t.Run(c.name, func(t *testing.T) {
			s, ep := tunneltest.StartLoopback(t, c.mode)
			tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl, err := tunnel.DialBox(tctx, tunnel.Target{EnvironmentID: "env_x", Host: ep.Host, Port: ep.Port, User: "u",
				KeyPath: ep.KeyPath, HostKeys: []string{ep.HostKey}, SocketPath: "s"}, 5*time.Second, tunnel.KeepaliveConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			r := Remote{Client: cl}
			ctx, cancel2 := context.WithTimeout(tctx, 300*time.Millisecond)
			defer cancel2()
			errc := make(chan error, 1)
			go func() {
				_, err := r.Manifest(ctx, "/work", ManifestOptions{Mode: manifest.ModePlain})
				errc <- err
			}()
			select {
			case err = <-errc:
			case <-tctx.Done():
				t.Fatal("Manifest from a hostile box did not return after its context ended")
			}
			if err == nil || ctx.Err() == nil || s.Opens.Load() != 1 {
				t.Fatalf("Manifest: %v (ctx %v, opens %d)", err, ctx.Err(), s.Opens.Load())
			}
		})
	}
}
