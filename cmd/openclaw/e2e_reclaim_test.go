package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/providers/local"
)

// TestReclaimRestoresFromCheckpoint: the box is killed behind the gateway's back mid-session; the
// placement becomes reclaimed, the transcript says what was lost, and the next message runs on a fresh
// box restored from the last checkpoint; the conversation is complete.
func TestReclaimRestoresFromCheckpoint(t *testing.T) {
	root := t.TempDir()
	script := filepath.Join(root, "script.json")
	if err := os.WriteFile(script, []byte(`[
  {"toolCalls":[{"name":"write","arguments":{"path":"notes.txt","content":"made on the first box\n"}}]},
  {"text":"saved"},
  {"toolCalls":[{"name":"read","arguments":{"path":"notes.txt"}}]},
  {"text":"still there"}
]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorkerConfig + "sync: {checkpointKeep: 1}\n" + fmt.Sprintf(`models:
  default: demo/demo
  providers:
    demo: {api: scripted, script: %s, models: [{id: demo}]}
`, script)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	// a FIFO no sync can carry: the dispatch says it was left out
	if err := syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws}})
	if err != nil {
		t.Fatal(err)
	}
	placementOf := func() (placement.Placement, []placement.Event) {
		v, err := g.client.Placement(g.ctx(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		return v.Placement, v.Events
	}
	waitPlacement := func(what string, cond func(placement.Placement, []placement.Event) bool) placement.Placement {
		t.Helper()
		var p placement.Placement
		waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("placement never %s: %+v", what, p) }, func() bool {
			var evs []placement.Event
			p, evs = placementOf()
			return cond(p, evs)
		})
		return p
	}
	if _, err := g.client.Dispatch(g.ctx(), s.ID, placement.DispatchRequest{ProfileID: "local"}); err != nil {
		t.Fatal(err)
	}
	first := waitPlacement("active", func(p placement.Placement, _ []placement.Event) bool { return p.State == placement.Active })
	if _, evs := placementOf(); !slices.ContainsFunc(evs, func(ev placement.Event) bool {
		return strings.HasPrefix(ev.Reason, "not synced to the box: 1 path(s)") && strings.HasSuffix(ev.Reason, ": pipe")
	}) {
		t.Errorf("no event says the FIFO was not synced: %+v", evs)
	}
	send := func(text string) turns.Turn {
		turn, err := g.client.SendMessage(g.ctx(), s.ID, turns.SendRequest{Text: text})
		if err != nil {
			t.Fatal(err)
		}
		return waitTurn(t, g, turn.RunID)
	}
	if got := send("write it down"); got.Status != turns.TurnDone {
		t.Fatalf("first turn %+v", got)
	}
	waitPlacement("checkpointed", func(_ placement.Placement, evs []placement.Event) bool {
		for _, ev := range evs {
			if strings.HasPrefix(ev.Reason, "checkpoint 1:") {
				return true
			}
		}
		return false
	})
	// the machine disappears: kill the box process behind the gateway's back
	e, err := g.envByID(first.EnvironmentID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := local.ReadState(filepath.Join(g.dataDir, "boxes", e.LeaseID))
	if err != nil {
		t.Fatal(err)
	}
	cleanupSocketDir(t, e)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	reclaimed := waitPlacement("reclaimed", func(p placement.Placement, _ []placement.Event) bool { return p.State == placement.Reclaimed })
	if !strings.Contains(reclaimed.Error, "after checkpoint 1 were lost") {
		t.Fatalf("reclaim reason %q does not say what was lost", reclaimed.Error)
	}
	// the next message is queued, runs on a fresh box restored from the checkpoint
	turn, err := g.client.SendMessage(g.ctx(), s.ID, turns.SendRequest{Text: "read it back"})
	if err != nil {
		t.Fatal(err)
	}
	if turn.Status != turns.TurnQueued {
		t.Fatalf("message on a reclaimed session: %+v", turn)
	}
	second := waitPlacement("active again", func(p placement.Placement, _ []placement.Event) bool { return p.State == placement.Active })
	if second.EnvironmentID == first.EnvironmentID || second.EnvironmentID == "" {
		t.Fatalf("not a fresh box: %s then %s", first.EnvironmentID, second.EnvironmentID)
	}
	var got turns.Turn
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("queued turn never ran: %+v", got) }, func() bool {
		got, _ = g.client.Turn(g.ctx(), turn.RunID)
		return got.Status == turns.TurnDone || got.Status == turns.TurnFailed
	})
	if got.Status != turns.TurnDone || got.Placement != "worker" {
		t.Fatalf("second turn %+v", got)
	}
	// the turn on the new box is checkpointed too; with checkpointKeep 1 only that checkpoint and
	// the base manifest the placement names are left
	// (the checkpoint prunes before it releases its claim on the session)
	now := waitPlacement("checkpointed again", func(p placement.Placement, evs []placement.Event) bool {
		return p.TurnRunID == "" && slices.ContainsFunc(evs, func(ev placement.Event) bool { return strings.HasPrefix(ev.Reason, "checkpoint 2:") })
	})
	if cps, _ := filepath.Glob(filepath.Join(g.dataDir, "checkpoints", "*", "*.json")); len(cps) != 1 || filepath.Base(cps[0]) != "2.json" {
		t.Errorf("checkpoints kept: %v, want checkpoint 2 alone", cps)
	}
	if bases, _ := filepath.Glob(filepath.Join(filepath.Dir(now.BaseManifestID), "base-*.json")); len(bases) != 1 || bases[0] != now.BaseManifestID {
		t.Errorf("base manifests kept: %v, want %s alone", bases, now.BaseManifestID)
	}
	tr, err := g.client.Transcript(g.ctx(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(tr)
	for _, want := range []string{"write it down", "saved", "openclaw.placement", "read it back", "made on the first box", "still there"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
	if strings.Contains(string(raw), `"isError":true`) {
		t.Errorf("a tool failed on the restored box: %s", raw)
	}
	_, _ = g.destroy(second.EnvironmentID, true, 30*time.Second)
	g.stop()
}

// TestCreateSessionWithWorkerTarget: POST /api/v1/sessions with target {kind: profile} creates the
// session and dispatches it; bad targets are refused with the field named.
func TestCreateSessionWithWorkerTarget(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig)
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	for body, field := range map[string]string{
		`{"workspace":"` + ws + `","target":{"kind":"moon"}}`:                       "target.kind",
		`{"workspace":"` + ws + `","target":{"kind":"profile"}}`:                    "target.profileId",
		`{"target":{"kind":"profile","profileId":"local"}}`:                         "workspace",
		`{"workspace":"` + ws + `","target":{"kind":"profile","profileId":"nope"}}`: "nope",
	} {
		var raw json.RawMessage
		_, err := g.do("POST", "/api/v1/sessions", json.RawMessage(body), &raw)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", body, err, field)
		}
	}
	s, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws}, Target: &sessions.Target{Kind: "profile", ProfileID: "local"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		v, err := g.client.Placement(g.ctx(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.Placement.State == placement.Active {
			_, _ = g.destroy(v.Placement.EnvironmentID, true, 30*time.Second)
			break
		}
		if v.Placement.State == placement.Failed || time.Now().After(deadline) {
			t.Fatalf("placement %+v", v.Placement)
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.stop()
}

// TestMachineClassTarget: target.machineClass overrides the profile's class for that session's
// machine ({class} reaches the lease CLI); a provider without classes refuses one, naming the field.
func TestMachineClassTarget(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	prof := strings.Replace(leaseDirProfile("ld", leaseDir, nil),
		`--label, "openclaw.environment={envId}"]`, `--label, "openclaw.environment={envId}", --class, "{class}"]`, 1)
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+"profiles:\n"+prof)
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws},
		Target: &sessions.Target{Kind: "profile", ProfileID: "local", MachineClass: "big"}}); err == nil || !strings.Contains(err.Error(), "machineClass") {
		t.Fatalf("class on the local provider: %v", err)
	}
	s, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws},
		Target: &sessions.Target{Kind: "profile", ProfileID: "ld", MachineClass: "cx42"}})
	if err != nil {
		t.Fatal(err)
	}
	var p placement.Placement
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("placement %+v", p) }, func() bool {
		p = g.placement(s.ID).Placement
		return p.State == placement.Active || p.State == placement.Failed
	})
	if p.State != placement.Active || p.MachineClass != "cx42" {
		t.Fatalf("placement %+v", p)
	}
	e, err := g.envByID(p.EnvironmentID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(leaseDir, e.LeaseID+".json"))
	if err != nil || !strings.Contains(string(b), `"class": "cx42"`) {
		t.Fatalf("the lease CLI did not get the class: %v %s", err, b)
	}
	_, _ = g.destroy(e.ID, true, 30*time.Second)
	g.stop()
}
