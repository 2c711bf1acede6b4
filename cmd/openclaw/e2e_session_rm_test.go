package main_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// testSessionArchive: an archived session leaves session list (--archived and --all show it),
// keeps its transcript, refuses messages naming unarchive, and takes them again once unarchived.
func testSessionArchive(t *testing.T, r *cliRig) {
	r.sub(t)
	id := r.session("hello/m")
	r.mustCLI("session", "send", id, "hi", "--follow")
	if out := r.mustCLI("session", "archive", id); !strings.Contains(out, "archived") {
		t.Errorf("archive: %s", out)
	}
	if out := r.mustCLI("session", "list"); strings.Contains(out, id) {
		t.Errorf("session list shows an archived session:\n%s", out)
	}
	for _, flag := range []string{"--archived", "--all"} {
		if out := r.mustCLI("session", "list", flag); !strings.Contains(out, id) || !strings.Contains(out, "(archived)") {
			t.Errorf("session list %s does not show the archived session:\n%s", flag, out)
		}
	}
	if out := r.mustCLI("session", "list", "--archived"); strings.Contains(out, r.session("hello/m")) {
		t.Errorf("session list --archived shows a session that is not archived:\n%s", out)
	}
	if e := r.failCLI("session", "send", id, "more"); !strings.Contains(e, "openclaw session unarchive "+id) {
		t.Errorf("a message to an archived session is not refused naming unarchive: %s", e)
	}
	if e := r.failCLI("session", "dispatch", id, "--profile", "local"); !strings.Contains(e, "unarchive") {
		t.Errorf("a dispatch of an archived session is not refused naming unarchive: %s", e)
	}
	if show := r.mustCLI("session", "show", id); !strings.Contains(show, "openclaw session unarchive "+id) {
		t.Errorf("session show of an archived session does not say so:\n%s", show)
	}
	if !strings.Contains(r.transcriptText(id), "Hello") {
		t.Errorf("the archived session's transcript is gone: %s", r.transcriptText(id))
	}
	r.mustCLI("session", "unarchive", id)
	if out := r.mustCLI("session", "list"); !strings.Contains(out, id) {
		t.Errorf("session list does not show an unarchived session:\n%s", out)
	}
	r.mustCLI("session", "send", id, "more", "--follow")
	if e := r.failCLI("session", "archive", "ses_doesnotexist"); !strings.Contains(e, "not-found") {
		t.Errorf("archive of a missing session: %s", e)
	}
}

// testSessionRmLocal: rm of an unknown session is not-found; rm of a session running a local turn
// cancels the turn first, then removes the session and its rows.
func testSessionRmLocal(t *testing.T, r *cliRig) {
	r.sub(t)
	if e := r.failCLI("session", "rm", "ses_doesnotexist"); !strings.Contains(e, "not-found") {
		t.Errorf("rm of a missing session: %s", e)
	}
	if e := r.failCLI("session", "rm", "ses_x", "--force"); !strings.Contains(e, "--pull-back") || !strings.Contains(e, "--discard") {
		t.Errorf("rm --force alone does not ask for --pull-back or --discard: %s", e)
	}
	if e := r.failCLI("session", "rm", "ses_x", "--force", "--pull-back", "--discard"); !strings.Contains(e, "exclude each other") {
		t.Errorf("rm --force --pull-back --discard: %s", e)
	}
	if code, e := r.deleteRaw("/api/v1/sessions/" + r.session("hello/m") + "?force=later"); code != 400 || e.Field != "force" {
		t.Errorf("DELETE ?force=later: %d %+v, want 400 naming force", code, e)
	}
	id := r.session("slow/m")
	cmd, done, errText := r.startFollow(id)
	out := r.mustCLI("session", "rm", id)
	if !strings.Contains(out, "canceled the running turn") || !strings.Contains(out, "session "+id+" removed") {
		t.Errorf("rm of a session running a turn:\n%s", out)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("send --follow did not end once its session was removed:\n%s", errText)
	}
	if e := r.failCLI("session", "show", id); !strings.Contains(e, "not-found") {
		t.Errorf("session show after rm: %s", e)
	}
	if list, err := r.client.Turns(r.ctx(), id); err == nil && len(list) > 0 {
		t.Errorf("the removed session's turns are still there: %+v", list)
	}
	if out := r.mustCLI("session", "list", "--all"); strings.Contains(out, id) {
		t.Errorf("session list --all shows a removed session:\n%s", out)
	}
}

// testSessionRmWorker: rm of a session a worker holds is refused naming --force --pull-back and
// --discard; --force --pull-back brings the work home (the branch keeps it), removes the managed
// worktree and the refs and releases the environment; --force --discard drops the work. Then
// prune: it never deletes an unmerged branch (nor a session's that still exists, nor a branch
// the gateway did not name), and deletes a merged one.
func testSessionRmWorker(t *testing.T, r *cliRig) {
	r.sub(t)
	ws := filepath.Join(r.root, "repo-rm")
	userWorkspace(t, ws, true)
	testenv.Git(t, ws, "branch", "openclaw/feature") // the user's own, merged: never the gateway's
	id := strings.TrimSpace(r.mustCLI("session", "new", "--workspace", ws, "--git", "--profile", "local", "--model", "fresh/m"))
	name := strings.TrimPrefix(id, "ses_")
	r.mustCLI("session", "send", id, "edit the readme", "--follow")
	if e := r.failCLI("session", "rm", id); !strings.Contains(e, "openclaw session rm "+id+" --force --pull-back") || !strings.Contains(e, "--force --discard") {
		t.Fatalf("rm of a worker-held session is not refused naming --force --pull-back and --discard: %s", e)
	}
	if out := r.mustCLI("session", "prune", "--repo", ws, "--dry-run"); strings.Contains(out, name) || strings.Contains(out, "feature") {
		t.Errorf("prune looks at a session that still exists, or at the user's own branch:\n%s", out)
	}
	out := r.mustCLI("session", "rm", id, "--force", "--pull-back")
	for _, want := range []string{"pulled the worker's work back", "environment env_", "removed worktree ", "removed refs/openclaw/worker-results/" + name,
		"kept branch openclaw/" + name, "session " + id + " removed"} {
		if !strings.Contains(out, want) {
			t.Errorf("rm --force --pull-back output lacks %q:\n%s", want, out)
		}
	}
	if wt := testenv.Git(t, ws, "worktree", "list"); strings.Contains(wt, name) {
		t.Errorf("the managed worktree is still registered:\n%s", wt)
	}
	if refs := testenv.Git(t, ws, "for-each-ref", "--format=%(refname)", "refs/openclaw/"); strings.Contains(refs, name) {
		t.Errorf("refs/openclaw/* of the removed session are left:\n%s", refs)
	}
	if log := testenv.Git(t, ws, "log", "--format=%s", "openclaw/"+name); !strings.Contains(log, "worker edit") {
		t.Errorf("the branch openclaw/%s lost the work pulled back: %s", name, log)
	}

	// prune never deletes the unmerged branch without --force
	branches := testenv.Git(t, ws, "branch", "--list", "openclaw/*")
	for _, args := range [][]string{{"--dry-run"}, {}} {
		out = r.mustCLI(append([]string{"session", "prune", "--repo", ws}, args...)...)
		if !strings.Contains(out, "kept branch openclaw/"+name+": 1 commit(s) on no other branch") {
			t.Errorf("prune %v does not keep the unmerged branch, saying why:\n%s", args, out)
		}
		if got := testenv.Git(t, ws, "branch", "--list", "openclaw/*"); got != branches {
			t.Fatalf("prune %v changed the branches: %q, was %q", args, got, branches)
		}
	}
	testenv.Git(t, ws, "merge", "-q", "--ff-only", "openclaw/"+name)
	out = r.mustCLI("session", "prune", "--repo", ws, "--dry-run")
	if !strings.Contains(out, "would remove branch openclaw/"+name+" (merged)") || testenv.Git(t, ws, "branch", "--list", "openclaw/"+name) == "" {
		t.Errorf("prune --dry-run of a merged branch:\n%s", out)
	}
	out = r.mustCLI("session", "prune", "--repo", ws)
	if !strings.Contains(out, "removed branch openclaw/"+name+" (merged)") || testenv.Git(t, ws, "branch", "--list", "openclaw/"+name) != "" {
		t.Errorf("prune of a merged branch:\n%s", out)
	}
	if testenv.Git(t, ws, "branch", "--list", "openclaw/feature") == "" {
		t.Errorf("prune deleted the user's own branch openclaw/feature")
	}
	if e := r.failCLI("session", "prune", "--repo", r.root); !strings.Contains(e, "not in a git repository") {
		t.Errorf("prune outside a repository: %s", e)
	}

	// --force --discard: the work is dropped, the environment released
	id = strings.TrimSpace(r.mustCLI("session", "new", "--workspace", ws, "--git", "--profile", "local", "--model", "fresh/m"))
	name = strings.TrimPrefix(id, "ses_")
	r.mustCLI("session", "send", id, "edit the readme", "--follow")
	rep := mustJSON[turns.RemoveReport](t, r.mustCLI("session", "rm", id, "--force", "--discard", "-o", "json"))
	if !rep.Discarded || rep.PulledBack || rep.EnvironmentID == "" {
		t.Errorf("rm --force --discard report: %+v", rep)
	}
	switch rep.EnvironmentState {
	case "draining", "destroying", "destroyed":
	default:
		t.Errorf("rm --force --discard left environment %s %s, want it released", rep.EnvironmentID, rep.EnvironmentState)
	}
	if refs := testenv.Git(t, ws, "for-each-ref", "--format=%(refname)", "refs/openclaw/"); strings.Contains(refs, name) {
		t.Errorf("refs/openclaw/* of the discarded session are left:\n%s", refs)
	}
	if _, err := os.Stat(filepath.Join(ws, "untracked.txt")); err == nil {
		t.Errorf("the discarded worker's file reached the user's checkout")
	}
}

// deleteRaw sends DELETE path with the gateway's token and returns the status and the API's error.
func (r *cliRig) deleteRaw(path string) (int, apiError) {
	r.t.Helper()
	req, _ := http.NewRequest("DELETE", "http://"+r.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+r.client.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb struct {
		Error apiError `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb.Error
}

// mustJSON decodes a command's JSON output.
func mustJSON[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	return v
}

// TestSecondCtrlCDetaches runs `session send --follow` against a gateway whose turn ignores the
// cancellation: the first Ctrl-C asks the gateway to cancel the turn and keeps following, the
// second detaches at once (exit 130) without a second cancel, naming session watch.
func TestSecondCtrlCDetaches(t *testing.T) {
	following := make(chan struct{}, 1)
	cancels := make(chan struct{}, 4)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/sessions/ses_x/messages", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(turns.Turn{SessionID: "ses_x", RunID: "run_1", Status: turns.TurnRunning, Placement: "local"})
	})
	mux.HandleFunc("GET /api/v1/sessions/ses_x/stream", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		start := sessions.StreamMessage{Type: "live", LiveRecord: &sessions.LiveRecord{Cursor: 1, SessionID: "ses_x", RunID: "run_1",
			Event: protocol.LiveEvent{Type: protocol.LiveLifecycleStart}}}
		if wsjson.Write(r.Context(), conn, start) != nil {
			return
		}
		following <- struct{}{}
		<-conn.CloseRead(r.Context()).Done() // the turn never ends
	})
	mux.HandleFunc("POST /api/v1/sessions/ses_x/cancel", func(w http.ResponseWriter, r *http.Request) {
		cancels <- struct{}{}
		_ = json.NewEncoder(w).Encode(map[string]bool{"canceled": true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	cmd := exec.Command(openclawBin, "--gateway", srv.URL, "--token", "t", "session", "send", "ses_x", "hello", "--follow")
	cmd.Env = cleanEnv()
	var errText strings.Builder
	cmd.Stderr = &errText
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case err := <-done:
			t.Fatalf("send --follow ended (%v) before %s:\n%s", err, what, errText.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30s", what)
		}
	}
	wait("stream", following)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	wait("cancel request", cancels)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if code := exitCode(err); code != 130 {
			t.Errorf("send --follow after a second Ctrl-C: exit %d (%v), want 130", code, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("send --follow did not detach after a second Ctrl-C:\n%s", errText.String())
	}
	if !strings.Contains(errText.String(), "detached; turn run_1 goes on in the gateway (see openclaw session watch ses_x)") {
		t.Errorf("the detach is not reported:\n%s", errText.String())
	}
	if n := len(cancels); n != 0 {
		t.Errorf("the second Ctrl-C sent %d more cancel request(s), want none", n)
	}
}
