package main_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

const setupProfiles = `profiles:
  - id: withsetup
    provider: local
    hygiene: {metadataRoute: warn, dockerSocket: warn}
    setup:
      steps:
        - {name: deps, run: "printf 'saw: '; cat README.md; echo prepared > .setup-done", timeout: 30s}
  - id: badsetup
    provider: local
    hygiene: {metadataRoute: warn, dockerSocket: warn}
    setup:
      steps:
        - {name: toolchain, run: "echo 'E: Unable to locate package nodejs-99' >&2; exit 100"}
        - {name: never, run: "true"}
`

func (g *gw) timeline(envID, kind string) []envs.Step {
	g.t.Helper()
	all, err := g.client.EnvironmentTimeline(g.ctx(), envID)
	if err != nil {
		g.t.Fatal(err)
	}
	var out []envs.Step
	for _, s := range all {
		if kind == "" || s.Kind == kind {
			out = append(out, s)
		}
	}
	return out
}

// TestDispatchRunsSetupBeforeTheWorker: a dispatched session's profile setup runs on the box
// after bootstrap and sync (it reads the synced workspace) and before the worker takes the session;
// the timeline (API, `env show`) has the bootstrap and setup steps; a second dispatch to the warm
// box skips setup (same cache key) and says so; a failing step fails the dispatch and the
// environment, naming the step and its output.
func TestDispatchRunsSetupBeforeTheWorker(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+dispatchModels(t, root)+setupProfiles)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	id, envID := g.activeSession(ws, "", "withsetup")

	steps := g.timeline(envID, envs.StepSetup)
	if len(steps) != 1 || steps[0].Name != "deps" || steps[0].Result != envs.ResultOK || !strings.Contains(steps[0].Output, "saw: hello") {
		t.Fatalf("setup timeline %+v: want deps ok, having read the synced README", steps)
	}
	var names []string
	for _, s := range g.timeline(envID, envs.StepBootstrap) {
		names = append(names, s.Name+"="+s.Result)
	}
	if got := strings.Join(names, " "); got != "ssh=ok platform=ok bundle=ok hygiene=ok tunnel=ok launch=ok admission=ok" {
		t.Fatalf("bootstrap timeline %s", got)
	}
	var attachedAt, setupAt int
	for i, ev := range g.events(envID) {
		if ev.Step != nil && ev.Step.Kind == envs.StepSetup {
			setupAt = i
		}
		if ev.To == envs.Attached && attachedAt == 0 {
			attachedAt = i
		}
	}
	if setupAt == 0 || attachedAt < setupAt {
		t.Fatalf("setup event %d, attach event %d: the worker took the session before setup ran", setupAt, attachedAt)
	}
	out, _, err := g.cli("env", "show", envID)
	if err != nil || !strings.Contains(out, "timeline") || !strings.Contains(out, "setup") || !strings.Contains(out, "deps") {
		t.Fatalf("env show: %v\n%s", err, out)
	}

	g.pullback(id)
	g.mustRest(id, placement.Local)
	g.dispatchTo(id, "withsetup")
	if again := g.mustRest(id, placement.Active).Placement.EnvironmentID; again != envID {
		t.Fatalf("second dispatch used %s, want the warm %s", again, envID)
	}
	steps = g.timeline(envID, envs.StepSetup)
	if len(steps) != 2 || steps[1].Result != envs.ResultSkipped {
		t.Fatalf("warm box setup timeline %+v: want the second entry skipped (cache)", steps)
	}
	g.pullback(id)
	g.mustRest(id, placement.Local)

	bad := g.newSession(ws, "")
	g.dispatchTo(bad, "badsetup")
	v := g.mustRest(bad, placement.Failed)
	if !strings.Contains(v.Placement.Error, `setup step "toolchain" failed`) || !strings.Contains(v.Placement.Error, "Unable to locate package nodejs-99") {
		t.Fatalf("failed dispatch error %q: want the step and its output", v.Placement.Error)
	}
	e := g.waitEnv(v.Placement.EnvironmentID, func(e envs.Environment) bool { return e.State == envs.Destroyed })
	if !strings.Contains(e.Error, `setup step "toolchain" failed with exit status 100`) {
		t.Fatalf("environment after a failed setup: %s %q", e.State, e.Error)
	}
	if s := g.timeline(e.ID, envs.StepSetup); len(s) != 1 || s[0].Name != "toolchain" || s[0].ExitCode != 100 {
		t.Fatalf("failed setup timeline %+v: want only toolchain, exit 100", s)
	}
}
