package turns

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

type namedTool string

func (n namedTool) Name() string          { return string(n) }
func (n namedTool) Schema() protocol.Tool { return protocol.Tool{Name: string(n)} }
func (n namedTool) Run(context.Context, json.RawMessage) (tools.Result, error) {
	return tools.Result{}, nil
}

// The spawn tools are offered, to local and worker turns alike, only while a worker profile
// exists: an install without one offers no way to lease a machine.
func TestSpawnToolsNeedAWorkerProfile(t *testing.T) {
	has := false
	s := &Service{cfg: Config{ExtraTools: []tools.Tool{namedTool("web_search")}, SpawnTools: []tools.Tool{namedTool("sessions_spawn")},
		WorkerProfiles: func(context.Context) bool { return has }}}
	names := func() []string {
		var out []string
		for _, t := range s.gatewayToolSchemas(context.Background()) {
			out = append(out, t.Name)
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"web_search"}) {
		t.Fatalf("without a worker profile: %v, want only web_search", got)
	}
	has = true
	if got := names(); !slices.Equal(got, []string{"web_search", "sessions_spawn"}) {
		t.Fatalf("with a worker profile: %v, want web_search and sessions_spawn", got)
	}
	if n := len(s.cfg.ExtraTools); n != 1 {
		t.Fatalf("offering the spawn tools changed the extra tools (%d)", n)
	}
}
