package main_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// cliHelloScript answers every turn with one line of text.
const cliHelloScript = `[{"text": "Hello one."}, {"text": "Hello two."}, {"text": "Hello three."}, {"text": "Hello four."}, {"text": "Hello five."}, {"text": "Hello six."}]`

// cliSlowScript is turns that run until they are canceled.
var cliSlowScript = "[" + strings.TrimSuffix(strings.Repeat(`{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 120", "timeout": 300}}]},`, 8), ",") + "]"

// cliRig is one gateway shared by the CLI tests, with a hello and a slow scripted model.
type cliRig struct {
	*gw
	root string
}

func newCLIRig(t *testing.T) *cliRig {
	t.Helper()
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"hello": cliHelloScript, "slow": cliSlowScript, "fresh": dispatchScript}))
	t.Cleanup(func() { destroyAll(g) })
	return &cliRig{gw: g, root: root}
}

// sub points the rig's gateway helpers at a subtest.
func (r *cliRig) sub(t *testing.T) {
	outer := r.t
	r.t = t
	t.Cleanup(func() { r.t = outer })
}

// mustCLI runs the CLI and fails the test unless it succeeds; it returns stdout.
func (r *cliRig) mustCLI(args ...string) string {
	r.t.Helper()
	out, errOut, err := r.cli(args...)
	if err != nil {
		r.t.Fatalf("openclaw %v: %v\nstdout: %s\nstderr: %s", args, err, out, errOut)
	}
	return out
}

// failCLI runs the CLI, wants it to fail, and returns its stderr.
func (r *cliRig) failCLI(args ...string) string {
	r.t.Helper()
	out, errOut, err := r.cli(args...)
	if err == nil {
		r.t.Fatalf("openclaw %v succeeded, want a failure\nstdout: %s", args, out)
	}
	return errOut
}

// session creates a session with a model and a workspace directory of its own.
func (r *cliRig) session(model string) string {
	r.t.Helper()
	ws := filepath.Join(r.root, fmt.Sprintf("ws-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(ws, 0o755); err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimSpace(r.mustCLI("session", "new", "--model", model, "--workspace", ws))
}

// transcriptText joins the text of a session's transcript entries.
func (r *cliRig) transcriptText(id string) string {
	r.t.Helper()
	tr, err := r.client.Transcript(r.ctx(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range tr.Entries {
		b.Write(e.Content)
	}
	return b.String()
}

// workerEdit makes a git workspace named name and, through the CLI, a session on it on the local
// profile whose worker turn edits and commits the readme; it returns the session.
func (r *cliRig) workerEdit(name string) string {
	r.t.Helper()
	ws := filepath.Join(r.root, name)
	userWorkspace(r.t, ws, true)
	id := strings.TrimSpace(r.mustCLI("session", "new", "--workspace", ws, "--git", "--profile", "local", "--model", "fresh/m"))
	r.mustCLI("session", "send", id, "edit the readme", "--follow")
	return id
}

// startWatch starts `session watch ID -o OUTPUT`, killed at the end of the test, and returns its
// stdout.
func (r *cliRig) startWatch(id, output string) io.Reader {
	r.t.Helper()
	cmd := r.cliCmd("session", "watch", id, "-o", output)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return stdout
}

// startFollow starts `session send ID TEXT --follow` and waits until the turn's first tool call
// is on its stderr; it returns the running command and its exit channel.
func (r *cliRig) startFollow(id string) (*exec.Cmd, <-chan error, *strings.Builder) {
	r.t.Helper()
	cmd := r.cliCmd("session", "send", id, "sleep please", "--follow")
	pr, pw := io.Pipe()
	var errText strings.Builder
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	r.t.Cleanup(func() { _ = cmd.Process.Kill() })
	seen := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		found := false
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if !found && strings.Contains(sc.Text(), "→ exec") {
				found = true
				seen <- true
			}
		}
		if !found {
			seen <- false
		}
	}()
	select {
	case ok := <-seen:
		if !ok {
			r.t.Fatalf("send --follow ended before the tool call: %s", errText.String())
		}
	case <-time.After(30 * time.Second):
		r.t.Fatalf("no tool call within 30s: %s", errText.String())
	}
	return cmd, done, &errText
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// TestCLI drives the real binary against one real gateway: output formats, messages from stdin
// and files, turn control, contexts, profile apply and completion.
func TestCLI(t *testing.T) {
	r := newCLIRig(t)

	t.Run("output", func(t *testing.T) {
		r.sub(t)
		for _, args := range [][]string{{"version", "-o", "json"}, {"session", "list", "-o", "json"}, {"profile", "show", "local", "-o", "json"}, {"env", "list", "-o", "json"}, {"models", "list", "-o", "json"}} {
			var v any
			if out := r.mustCLI(args...); json.Unmarshal([]byte(out), &v) != nil {
				t.Errorf("%v: not JSON: %s", args, out)
			}
		}
		for _, args := range [][]string{{"version", "-o", "yaml"}, {"profile", "show", "local", "-o", "yaml"}, {"profile", "list", "-o", "yaml"}} {
			var v any
			out := r.mustCLI(args...)
			if err := yaml.Unmarshal([]byte(out), &v); err != nil || strings.HasPrefix(strings.TrimSpace(out), "{") || strings.HasPrefix(strings.TrimSpace(out), "[") {
				t.Errorf("%v: not block YAML (%v): %s", args, err, out)
			}
		}
		var info struct{ Version, SHA256 string }
		if out := r.mustCLI("version", "-o", "yaml"); yaml.Unmarshal([]byte(out), &info) != nil || info.SHA256 == "" {
			t.Errorf("version -o yaml has no sha256: %s", out)
		}
		if out, err := exec.Command(openclawBin, "--version").Output(); err != nil || !strings.Contains(string(out), "sha256") || !strings.Contains(string(out), "commit") {
			t.Errorf("--version: %v %s", err, out)
		}
		// flags after --version apply as they do on `version`
		for _, args := range [][]string{{"--version", "-o", "json"}, {"--gateway", "http://127.0.0.1:1", "--version", "-o", "json"}} {
			info.SHA256 = ""
			if out, err := exec.Command(openclawBin, args...).Output(); err != nil || json.Unmarshal(out, &info) != nil || info.SHA256 == "" {
				t.Errorf("openclaw %v: %v %s", args, err, out)
			}
		}
		if out := r.mustCLI("profile", "show", "local"); !strings.Contains(out, "provider") || !strings.Contains(out, "max environments") || strings.Contains(out, "{") {
			t.Errorf("profile show is not a table: %s", out)
		}
		if e := r.failCLI("session", "list", "-o", "xml"); !strings.Contains(e, "--output must be table, json or yaml") {
			t.Errorf("-o xml: %s", e)
		}
	})

	t.Run("send-stdin-file-export-watch", func(t *testing.T) {
		r.sub(t)
		id := r.session("hello/m")
		big := strings.Repeat("from stdin ", 20000) // past what one argv string should carry
		cmd := r.cliCmd("session", "send", id, "-", "--follow")
		cmd.Stdin = strings.NewReader(big)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Hello one.") {
			t.Fatalf("send -: %v %s", err, out)
		}
		msg := filepath.Join(r.root, "msg.md")
		if err := os.WriteFile(msg, []byte("the message in a file"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := r.mustCLI("session", "send", id, "--file", msg, "--follow"); !strings.Contains(out, "Hello two.") {
			t.Fatalf("send --file: %s", out)
		}
		text := r.transcriptText(id)
		if !strings.Contains(text, "the message in a file") || strings.Count(text, "from stdin") != 20000 {
			t.Fatalf("transcript lacks the stdin or file message (%d stdin words)", strings.Count(text, "from stdin"))
		}
		if e := r.failCLI("session", "send", id, "text", "--file", msg); !strings.Contains(e, "not both") {
			t.Errorf("TEXT and --file: %s", e)
		}

		// export writes --file; -o json is not a file name
		file := filepath.Join(r.root, "t.jsonl")
		r.mustCLI("session", "export", id, "--file", file)
		b, err := os.ReadFile(file)
		if err != nil || !strings.HasPrefix(string(b), `{"type":"session"`) {
			t.Fatalf("export --file: %v %.80s", err, b)
		}
		if e := r.failCLI("session", "export", id, "-o", "json"); !strings.Contains(e, "--file") {
			t.Errorf("export -o json: %s", e)
		}
		if _, err := os.Stat("json"); err == nil {
			t.Errorf("export -o json wrote a file named json")
		}

		// watch -o json: one JSON object per line, every one with its cursor
		sc := bufio.NewScanner(r.startWatch(id, "json"))
		sc.Buffer(nil, 4<<20)
		ends := 0
		for ends < 2 && sc.Scan() {
			var m sessions.StreamMessage
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("watch -o json line is not JSON: %q", sc.Text())
			}
			if m.LiveRecord == nil || m.Cursor == 0 {
				t.Fatalf("watch line without a record and cursor: %q", sc.Text())
			}
			if m.Event.Type == "lifecycle_end" {
				ends++
			}
		}
		if ends < 2 {
			t.Fatalf("watch -o json replayed %d turn ends, want 2 (%v)", ends, sc.Err())
		}

		// watch -o yaml: a YAML document stream, each document after "---", with the JSON names
		yout := r.startWatch(id, "yaml")
		// a document is complete once the next "---" arrives (the last one waits for more events)
		var raw strings.Builder
		docs := make(chan error, 1)
		go func() {
			ysc := bufio.NewScanner(yout)
			ysc.Buffer(nil, 4<<20)
			var doc strings.Builder
			complete := 0
			for ysc.Scan() {
				line := ysc.Text()
				raw.WriteString(line + "\n")
				if line != "---" {
					doc.WriteString(line + "\n")
					if complete > 0 && strings.Count(raw.String(), "type: lifecycle_end") == 2 {
						docs <- nil
						return
					}
					continue
				}
				if doc.Len() > 0 {
					var m struct {
						Type   string `yaml:"type"`
						Cursor uint64 `yaml:"cursor"`
					}
					if err := yaml.Unmarshal([]byte(doc.String()), &m); err != nil || m.Type != "live" || m.Cursor == 0 {
						docs <- fmt.Errorf("watch -o yaml document without a record and cursor (%v):\n%s", err, doc.String())
						return
					}
					complete++
				}
				doc.Reset()
			}
			docs <- fmt.Errorf("watch -o yaml ended: %v", ysc.Err())
		}()
		select {
		case err := <-docs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("watch -o yaml did not replay both turn ends within 30s") // the cleanup kills it
		}
		if !strings.HasPrefix(raw.String(), "---\n") || strings.Count(raw.String(), "\n---\n") == 0 {
			t.Errorf("watch -o yaml documents do not start with ---:\n%s", raw.String())
		}
	})

	t.Run("turn-control", func(t *testing.T) {
		r.sub(t)
		id := r.session("slow/m")
		if out := r.mustCLI("session", "cancel", id); !strings.Contains(out, "no turn running") {
			t.Errorf("cancel of an idle session: %s", out)
		}
		if e := r.failCLI("session", "cancel", "ses_doesnotexist"); !strings.Contains(e, "not-found") {
			t.Errorf("cancel of a missing session: %s", e)
		}
		cmd, done, errText := r.startFollow(id)
		// a second message names the way out
		if e := r.failCLI("session", "send", id, "again"); !strings.Contains(e, "openclaw session cancel "+id) {
			t.Errorf("busy refusal does not name session cancel: %s", e)
		}
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if code := exitCode(err); code != 130 {
				t.Fatalf("send --follow after Ctrl-C: exit %d (%v), want 130\n%s", code, err, errText)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("send --follow did not end after Ctrl-C:\n%s", errText)
		}
		list, err := r.client.Turns(r.ctx(), id)
		if err != nil || len(list) != 1 {
			t.Fatalf("turns: %+v %v", list, err)
		}
		if tr := waitTurn(t, r.gw, list[0].RunID); tr.Status != turns.TurnCanceled {
			t.Fatalf("turn after Ctrl-C: %+v, want canceled", tr)
		}

		// session cancel stops a running turn too
		cmd, done, _ = r.startFollow(id)
		if out := r.mustCLI("session", "cancel", id); !strings.Contains(out, "turn canceled") {
			t.Errorf("cancel of a running turn: %s", out)
		}
		select {
		case err := <-done:
			if exitCode(err) != 1 {
				t.Errorf("follow of a turn canceled elsewhere: %v, want exit 1", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("the turn did not stop after session cancel")
		}
	})

	t.Run("too-large", func(t *testing.T) {
		r.sub(t)
		id := r.session("hello/m")
		var out any
		code, err := r.do("POST", "/api/v1/sessions/"+id+"/messages", map[string]string{"text": strings.Repeat("x", 2<<20)}, &out)
		if code != 413 || err == nil || !strings.Contains(err.Error(), "too-large") {
			t.Fatalf("2 MiB message: %d %v, want 413 too-large", code, err)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		r.sub(t)
		cfgHome := t.TempDir()
		bare := func(args ...string) (string, error) {
			cmd := exec.Command(openclawBin, args...)
			cmd.Env = append(cleanEnv(), "XDG_CONFIG_HOME="+cfgHome, "HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := bare("context", "add", "lab", "--gateway", "http://"+r.addr+"/api/v1/", "--data-dir", r.dataDir); err != nil {
			t.Fatalf("context add: %v %s", err, out)
		}
		path := filepath.Join(cfgHome, "openclaw", "config.yaml")
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("config file: %v %v, want mode 0600", fi, err)
		}
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), "/api/v1") || !strings.Contains(string(b), "gateway: http://"+r.addr+"\n") {
			t.Fatalf("gateway URL not normalised:\n%s", b)
		}
		// the first context is the current one: no flag, no environment variable needed
		if out, err := bare("profile", "list"); err != nil || !strings.Contains(out, "local") {
			t.Fatalf("profile list through the context: %v %s", err, out)
		}
		tok, _ := os.ReadFile(filepath.Join(r.dataDir, "gateway.token"))
		tokFile := filepath.Join(t.TempDir(), "tok")
		if err := os.WriteFile(tokFile, tok, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := bare("context", "add", "other", "--gateway", r.addr, "--token-file", tokFile); err != nil {
			t.Fatalf("context add --token-file: %v %s", err, out)
		}
		if out, err := bare("context", "add", "broken", "--gateway", "127.0.0.1:1", "--token-file", tokFile); err != nil {
			t.Fatalf("context add: %v %s", err, out)
		}
		if out, err := bare("context", "use", "broken"); err != nil {
			t.Fatalf("context use: %v %s", err, out)
		}
		if out, err := bare("profile", "list"); err == nil || !strings.Contains(out, "127.0.0.1:1") {
			t.Fatalf("profile list through the broken context: %v %s", err, out)
		}
		if out, err := bare("profile", "list", "--context", "other"); err != nil || !strings.Contains(out, "local") {
			t.Fatalf("--context other: %v %s", err, out)
		}
		out, err := bare("context", "list")
		if err != nil || !strings.Contains(out, "* ") || !strings.Contains(out, "broken") || !strings.Contains(out, tokFile) {
			t.Fatalf("context list: %v %s", err, out)
		}
		if out, err := bare("context", "use", "nope"); err == nil || !strings.Contains(out, "no context") {
			t.Fatalf("context use nope: %v %s", err, out)
		}
		if out, err := bare("context", "add", "x", "--gateway", r.addr); err == nil || !strings.Contains(out, "--token-file") {
			t.Fatalf("context add without a token source: %v %s", err, out)
		}
	})

	t.Run("profile-apply", func(t *testing.T) {
		r.sub(t)
		write := func(body string) string {
			p := filepath.Join(t.TempDir(), "profiles.yaml")
			if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}
		good := "profiles:\n  - id: applied-a\n    provider: local\n    lifetime: {idleTimeout: 30m}\n"
		bad := write(good + "  - id: applied-b\n    provider: local\n    lifetime:\n      ttl: banana\n")
		if e := r.failCLI("profile", "apply", "-f", bad); !strings.Contains(e, "line 8") || !strings.Contains(e, "banana") {
			t.Errorf("bad YAML value: %s, want line 8 named", e)
		}
		// valid YAML, but the gateway refuses the second profile: the first is not written either
		refused := write(good + "  - id: applied-b\n    provider: nope\n")
		if e := r.failCLI("profile", "apply", "-f", refused); !strings.Contains(e, "profiles[1].provider") || !strings.Contains(e, "nothing was written") {
			t.Errorf("refused profile: %s", e)
		}
		if _, err := r.client.Profile(r.ctx(), "applied-a"); err == nil {
			t.Fatal("applied-a was written although applied-b was refused")
		}
		f := write(good)
		if out := r.mustCLI("profile", "apply", "-f", f, "--dry-run"); !strings.Contains(out, "profile applied-a would be created") {
			t.Errorf("dry run: %s", out)
		}
		if _, err := r.client.Profile(r.ctx(), "applied-a"); err == nil {
			t.Fatal("--dry-run wrote applied-a")
		}
		if out := r.mustCLI("profile", "apply", "-f", f); !strings.Contains(out, "profile applied-a created") {
			t.Errorf("apply: %s", out)
		}
		if out := r.mustCLI("profile", "apply", "-f", f); !strings.Contains(out, "profile applied-a unchanged") {
			t.Errorf("apply again: %s", out)
		}
		changed := write(strings.Replace(good, "30m", "45m", 1))
		if out := r.mustCLI("profile", "apply", "-f", changed, "--dry-run"); !strings.Contains(out, "profile applied-a would be updated") {
			t.Errorf("dry run of a change: %s", out)
		}
	})

	t.Run("completion", func(t *testing.T) {
		r.sub(t)
		id := r.session("hello/m")
		complete := func(args ...string) string {
			// the flags go first: the last word is the one being completed
			out, err := exec.Command(openclawBin, append([]string{"__complete", "--gateway", r.addr, "--data-dir", r.dataDir}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("__complete %v: %v %s", args, err, out)
			}
			return string(out)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"session", "show", ""}, id},
			{[]string{"session", "send", "ses_"}, id},
			{[]string{"env", "create", "--profile", ""}, "local"},
			{[]string{"session", "new", "--worker", ""}, "local"},
			{[]string{"session", "new", "--model", ""}, "slow/m"},
			{[]string{"profile", "show", "lo"}, "local"},
		} {
			if out := complete(c.args...); !strings.Contains(out, c.want) {
				t.Errorf("%v: %q lacks %s", c.args, out, c.want)
			}
		}
		env := r.createEnv("local")
		if out := complete("env", "show", ""); !strings.Contains(out, env.ID) {
			t.Errorf("env show completion %q lacks %s", out, env.ID)
		}
	})

	t.Run("errors", func(t *testing.T) {
		r.sub(t)
		for _, args := range [][]string{{"session", "show", "ses_missing"}, {"session", "send", "ses_missing", "hi"}, {"session", "pullback", "ses_missing"}, {"session", "export", "ses_missing"}} {
			e := r.failCLI(args...)
			if !strings.Contains(e, "not-found") || strings.Contains(e, "session-not-attached") || strings.Contains(e, "is local") {
				t.Errorf("%v: %s, want not-found alone", args, e)
			}
		}
		plain := filepath.Join(r.root, "not-git")
		if err := os.MkdirAll(plain, 0o755); err != nil {
			t.Fatal(err)
		}
		if e := r.failCLI("session", "new", "--workspace", plain, "--git"); strings.Count(strings.TrimSpace(e), "\n") != 0 || !strings.Contains(e, "not a git work tree") || strings.Contains(e, "fatal:") {
			t.Errorf("--git on a plain directory: %q, want one line of our own", e)
		}
		// a server that is not a gateway answers with an HTML page
		html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>"+strings.Repeat("<p>nginx</p>", 200)+"</body></html>")
		}))
		t.Cleanup(html.Close)
		out, err := exec.Command(openclawBin, "session", "list", "--gateway", html.URL, "--token", "t").CombinedOutput()
		if err == nil || strings.Contains(string(out), "<p>") || !strings.Contains(string(out), "502 Bad Gateway") || len(out) > 400 {
			t.Errorf("HTML error page: %v %q, want a one-line summary", err, out)
		}
		// credential set with no terminal on stdin does not prompt
		cmd := r.cliCmd("credential", "set", "k")
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer devnull.Close()
		cmd.Stdin = devnull
		if out, err := cmd.CombinedOutput(); err == nil || strings.Contains(string(out), "paste") || !strings.Contains(string(out), "empty value") {
			t.Errorf("credential set < /dev/null: %v %q", err, out)
		}
		// sync plan against a box that serves no session names --box-dir
		envID := strings.TrimSpace(r.mustCLI("env", "create", "--profile", "local", "--wait"))
		if e := r.failCLI("sync", "plan", envID, "--workspace", plain); !strings.Contains(e, "--box-dir DIR") || strings.Contains(e, "invalid-field") {
			t.Errorf("sync plan of an environment with no session: %s", e)
		}
	})

	t.Run("pullback-report-and-diff", func(t *testing.T) {
		r.sub(t)
		id := r.workerEdit("repo")
		out := r.mustCLI("session", "pullback", id)
		for _, want := range []string{"branch openclaw/", "1 commit(s) since its base", "worker edit", "M  README.md", "git log openclaw/"} {
			if !strings.Contains(out, want) {
				t.Errorf("pull-back report lacks %q:\n%s", want, out)
			}
		}
		if d := r.mustCLI("session", "diff", id); !strings.Contains(d, "+hello from the worker") || !strings.Contains(d, "worker edit") {
			t.Errorf("session diff:\n%s", d)
		}
	})
	t.Run("session-archive", func(t *testing.T) { testSessionArchive(t, r) })
	t.Run("session-rm-local", func(t *testing.T) { testSessionRmLocal(t, r) })
	t.Run("session-rm-worker-and-prune", func(t *testing.T) { testSessionRmWorker(t, r) })
	t.Run("pullback-destroy", func(t *testing.T) {
		r.sub(t)
		id := r.workerEdit("repo-destroy")
		if e := r.failCLI("session", "pullback", id, "--destroy", "--no-wait"); !strings.Contains(e, "--no-wait") {
			t.Errorf("pullback --destroy --no-wait refused without naming the flag: %s", e)
		}
		out := r.mustCLI("session", "pullback", id, "--destroy")
		if !strings.Contains(out, "is local again") || !strings.Contains(out, " destroyed") {
			t.Fatalf("pullback --destroy does not report the environment destroyed:\n%s", out)
		}
		var envID string
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "env_") {
				envID = f
			}
		}
		if envID == "" {
			t.Fatalf("pullback --destroy names no environment:\n%s", out)
		}
		if !strings.Contains(out, "environment "+envID+" destroyed") {
			t.Errorf("pullback --destroy report:\n%s", out)
		}
		if show := r.mustCLI("env", "show", envID); !strings.Contains(show, "destroyed") {
			t.Errorf("env show %s after pullback --destroy:\n%s", envID, show)
		}
	})
}

// cleanEnv is the test's environment without the CLI's OPENCLAW_ variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPENCLAW_") {
			out = append(out, kv)
		}
	}
	return out
}
