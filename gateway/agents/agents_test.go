package agents

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/worker/tools"
)

func TestConfigValidateNamesField(t *testing.T) {
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{MaxSpawnDepth: 6}, "agents.maxSpawnDepth"},
		{Config{MaxSpawnDepth: -1}, "agents.maxSpawnDepth"},
		{Config{RunTimeout: providers.Duration(48 * time.Hour)}, "agents.runTimeout"},
	} {
		c.cfg.SetDefaults()
		var fe *providers.FieldError
		if err := c.cfg.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.field)
		}
	}
	var ok Config
	ok.SetDefaults()
	if err := ok.Validate(); err != nil || ok.MaxSpawnDepth != 1 {
		t.Fatalf("defaults: %+v %v", ok, err)
	}
}

// newTestSpawner is a spawner over a real session store and nothing else: enough for every
// refusal that must come before a placement or a lease.
func newTestSpawner(t *testing.T, cfg Config) (*Spawner, *sessions.Store) {
	t.Helper()
	db := storetest.Open(t)
	st, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.Start(Deps{DB: db, Sessions: st, Placements: placement.NewPlacements(db), DataDir: t.TempDir()})
	return s, st
}

func countSessions(t *testing.T, st *sessions.Store) int {
	t.Helper()
	list, err := st.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// Bad arguments, a missing default profile and a spawn past the depth bound are refused naming
// what is wrong, before any session is created (and so before anything is leased).
func TestSpawnRefusalsComeFirst(t *testing.T) {
	s, st := newTestSpawner(t, Config{DefaultProfile: "kids"})
	ctx := testenv.Context(t, 30*time.Second)
	parent, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	deep, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir(), Parent: parent.ID, ToolCallID: "call_0_0", Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	before := countSessions(t, st)
	for _, c := range []struct {
		name   string
		parent string
		args   string
		want   string
	}{
		{"no task", parent.ID, `{}`, "task: is required"},
		{"blank task", parent.ID, `{"task":"   "}`, "task: is required"},
		{"task not a string", parent.ID, `{"task":5}`, "task: expected string"},
		{"bad workspace", parent.ID, `{"task":"x","workspace":"../etc"}`, `workspace: must be "fork" or "empty"`},
		{"bad cleanup", parent.ID, `{"task":"x","cleanup":"shred"}`, `cleanup: must be "keep" or "delete"`},
		{"negative timeout", parent.ID, `{"task":"x","runTimeoutSeconds":-1}`, "runTimeoutSeconds: must be"},
		{"huge timeout", parent.ID, `{"task":"x","runTimeoutSeconds":999999999}`, "runTimeoutSeconds: must be"},
		{"long label", parent.ID, `{"task":"x","label":"` + strings.Repeat("l", MaxLabelBytes+1) + `"}`, "label: is"},
		{"wait not a bool", parent.ID, `{"task":"x","wait":"no"}`, "wait: expected bool"},
		{"past the depth", deep.ID, `{"task":"x"}`, "depth 2 is past agents.maxSpawnDepth 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := DecodeSpawn(json.RawMessage(c.args))
			if err == nil {
				_, err = s.Spawn(ctx, c.parent, req)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	s2, st2 := newTestSpawner(t, Config{})
	p2, _ := st2.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if _, err := s2.Spawn(ctx, p2.ID, SpawnRequest{Task: "x"}); !errors.Is(err, ErrNoDefaultProfile) || !strings.Contains(err.Error(), "agents.defaultProfile") {
		t.Fatalf("no profile and no default: %v, want an error naming agents.defaultProfile", err)
	}
	if n := countSessions(t, st); n != before {
		t.Fatalf("%d sessions after the refusals, want %d: a refused spawn created one", n, before)
	}
	if _, pe := s.WorkerSpawn(ctx, tools.Call{SessionID: parent.ID, ToolCallID: "a\nb"}, json.RawMessage(`{"task":"x"}`)); pe != nil {
		t.Fatalf("a control character in the tool call id: protocol error %+v, want an error result", pe)
	}
	if n := countSessions(t, st); n != before {
		t.Fatal("a spawn with a control character in its tool call id created a session")
	}
	// the worker's door answers a depth refusal with its protocol code
	if _, pe := s.WorkerSpawn(ctx, tools.Call{SessionID: deep.ID, ToolCallID: "c"}, json.RawMessage(`{"task":"x"}`)); pe == nil || pe.Code != "spawn-depth-exceeded" {
		t.Fatalf("worker door: %+v, want spawn-depth-exceeded", pe)
	}
}

// A parent sees and drives only its own children: another session's child, and an unknown id,
// get the same refusal.
func TestParentDrivesOnlyItsChildren(t *testing.T) {
	s, st := newTestSpawner(t, Config{DefaultProfile: "kids"})
	ctx := testenv.Context(t, 30*time.Second)
	a, _ := st.Create(ctx, sessions.CreateParams{})
	b, _ := st.Create(ctx, sessions.CreateParams{})
	kidOfB, _ := st.Create(ctx, sessions.CreateParams{Parent: b.ID, Depth: 1})
	for _, id := range []string{kidOfB.ID, b.ID, "ses_nope"} {
		if _, err := s.Status(ctx, a.ID, id); !errors.Is(err, ErrNotChild) {
			t.Errorf("status of %s from %s: %v, want ErrNotChild", id, a.ID, err)
		}
		if _, err := s.Send(ctx, a.ID, id, "hi", false); !errors.Is(err, ErrNotChild) {
			t.Errorf("send to %s from %s: %v, want ErrNotChild", id, a.ID, err)
		}
		if _, err := s.Pullback(ctx, a.ID, id, ""); !errors.Is(err, ErrNotChild) {
			t.Errorf("pullback of %s from %s: %v, want ErrNotChild", id, a.ID, err)
		}
	}
}

// The tools act only inside a session's turn (the runner names the calling session).
func TestToolsNeedACallingSession(t *testing.T) {
	s, _ := newTestSpawner(t, Config{DefaultProfile: "kids"})
	for _, tl := range s.Tools() {
		r, err := tl.Run(context.Background(), json.RawMessage(`{"task":"x","sessionId":"y","message":"z"}`))
		if err != nil || !r.IsError || !strings.Contains(r.Text(), "no calling session") {
			t.Errorf("%s without a calling session: %+v %v", tl.Name(), r, err)
		}
		var schema map[string]any
		if err := json.Unmarshal(tl.Schema().Parameters, &schema); err != nil {
			t.Errorf("%s schema: %v", tl.Name(), err)
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A git fork is the parent's current commit plus its uncommitted, staged and untracked work (not
// its ignored files), and leaves the parent's repository as it was.
func TestForkGit(t *testing.T) {
	testenv.RequireCommands(t, "git")
	ctx := testenv.Context(t, 30*time.Second)
	src := filepath.Join(t.TempDir(), "src")
	head := testenv.InitRepo(t, src, "base", map[string]string{"a.txt": "a\n", "b.txt": "b\n", ".gitignore": "*.log\n"})
	write(t, filepath.Join(src, "a.txt"), "a edited\n")
	write(t, filepath.Join(src, "staged.txt"), "staged\n")
	testenv.Git(t, src, "add", "staged.txt")
	if err := os.Remove(filepath.Join(src, "b.txt")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "dir", "new.txt"), "untracked\n")
	write(t, filepath.Join(src, "debug.log"), "ignored\n")
	statusBefore := testenv.Git(t, src, "status", "--porcelain")

	dst := filepath.Join(t.TempDir(), "fork", "workspace")
	mode, err := fork(ctx, src, dst)
	if err != nil || mode != "git" {
		t.Fatalf("fork: %s %v", mode, err)
	}
	if testenv.Git(t, dst, "rev-parse", "HEAD~1") != head {
		t.Fatal("the fork's snapshot commit is not on top of the parent's commit")
	}
	if s := testenv.Git(t, dst, "status", "--porcelain"); s != "" {
		t.Fatalf("the fork has uncommitted work %q: it would not reach the worker", s)
	}
	for path, want := range map[string]string{"a.txt": "a edited\n", "staged.txt": "staged\n", "dir/new.txt": "untracked\n"} {
		b, err := os.ReadFile(filepath.Join(dst, path))
		if err != nil || string(b) != want {
			t.Errorf("fork %s = %q %v, want %q", path, b, err, want)
		}
	}
	for _, gone := range []string{"b.txt", "debug.log"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); err == nil {
			t.Errorf("fork has %s", gone)
		}
	}
	if testenv.Git(t, src, "rev-parse", "HEAD") != head || testenv.Git(t, src, "status", "--porcelain") != statusBefore {
		t.Fatal("forking changed the parent's repository")
	}
}

// A plain fork copies files, directories and symlinks as they are (a symlink is not followed).
func TestForkPlain(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	src := filepath.Join(t.TempDir(), "src")
	write(t, filepath.Join(src, "x", "y.txt"), "y\n")
	outside := filepath.Join(t.TempDir(), "secret")
	write(t, outside, "secret\n")
	if err := os.Symlink(outside, filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "fork", "workspace")
	if mode, err := fork(ctx, src, dst); err != nil || mode != "plain" {
		t.Fatalf("fork: %s %v", mode, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "x", "y.txt")); string(b) != "y\n" {
		t.Fatalf("y.txt = %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dst, "link"))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("link: %v %v, want a symlink", fi, err)
	}
}

// A child's spawn options (cleanup, profile, timeout, the parent's repository) are recorded in
// SQLite: a Spawner started anew on the same database (a restarted gateway) recalls them, so a
// "delete" child still has its environment destroyed after its pull-back.
func TestSpawnOptionsSurviveARestart(t *testing.T) {
	ctx := testenv.Context(t, 20*time.Second)
	db := storetest.Open(t)
	d := &Deps{DB: db}
	wait := false
	req := SpawnRequest{Task: "secret task text", Profile: "kids", MachineClass: "big", RunTimeoutSeconds: 90,
		Cleanup: CleanupDelete, Wait: &wait, parentRepo: "/home/u/repo", ToolCallID: "call_1"}
	first, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.remember(ctx, d, "ses_child", req); err != nil {
		t.Fatal(err)
	}
	first.Close()
	again, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got := again.recalled(ctx, d, "ses_child")
	if got.Cleanup != CleanupDelete || got.Profile != "kids" || got.MachineClass != "big" || got.RunTimeoutSeconds != 90 ||
		got.parentRepo != "/home/u/repo" || got.Wait == nil || *got.Wait {
		t.Fatalf("recalled %+v after a restart", got)
	}
	if got.Task != "" {
		t.Fatalf("the task text was stored with the options: %q", got.Task)
	}
	if none := again.recalled(ctx, d, "ses_other"); none.Cleanup != "" || none.Profile != "" {
		t.Fatalf("a session spawned by nobody recalls %+v", none)
	}
}
