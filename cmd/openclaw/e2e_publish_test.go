package main_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/internal/testrig/browsertest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

const forgeToken = "ghs_e2ePublishToken0123456789abcdefXYZ"

// TestGatewayPublish: through a running gateway (the real binary) and a real smart-HTTP forge
// (git http-backend on loopback): the git credential is set with `openclaw credential set
// --git-token`; a session's work, pulled back, is published by `openclaw session publish` and
// lands on the forge as openclaw/<session> at the managed branch's tip, with the gateway's token;
// a publish naming refs/heads/main (API and CLI) is refused with the allowlist named before any
// request reaches the forge, its refs unchanged; publishing again is up to date; the token is in
// no output or log.
func TestGatewayPublish(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	forge, err := gitforge.Start(filepath.Join(root, "forge"), "x-access-token", forgeToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forge.Close() })
	ctx := testenv.Context(t, 2*time.Minute)
	bare, remote, err := forge.Init(ctx, "org/repo.git")
	if err != nil {
		t.Fatal(err)
	}
	g, cli := startPublishGateway(t, root, "pub", "forge", "published work")
	if out, err := cli(forgeToken, "credential", "set", "forge", "--git-token"); err != nil {
		t.Fatalf("credential set --git-token: %v\n%s", err, out)
	}

	ws := filepath.Join(root, "user")
	forgeWorkspace(t, ws, remote)
	id, branch, tip := g.pulledBackWork(ws, "pub")

	before, err := gitforge.Refs(ctx, bare)
	if err != nil {
		t.Fatal(err)
	}
	authed, refused := forge.Authed.Load(), forge.Refused.Load()
	unchanged := func(what string) {
		t.Helper()
		if forge.Authed.Load() != authed || forge.Refused.Load() != refused {
			t.Fatalf("%s reached the forge (%d authenticated, %d refused requests)", what, forge.Authed.Load()-authed, forge.Refused.Load()-refused)
		}
		if now, err := gitforge.Refs(ctx, bare); err != nil || now != before {
			t.Fatalf("%s changed the forge's refs:\n%s\nwant\n%s (%v)", what, now, before, err)
		}
	}

	// the allowlist: refused before any ref update, through the API and the CLI
	var body map[string]any
	code, err := g.do("POST", "/api/v1/sessions/"+id+"/publish", workspace.PublishRequest{To: "refs/heads/main"}, &body)
	if code != http.StatusBadRequest || err == nil || !strings.Contains(err.Error(), "publish.pushRefAllowlist") {
		t.Fatalf("publish to main through the API: %d %v, want 400 naming publish.pushRefAllowlist", code, err)
	}
	unchanged("the API's refused publish")
	if out, err := cli("", "session", "publish", id, "--to", "refs/heads/main"); err == nil || !strings.Contains(out, "publish.pushRefAllowlist") {
		t.Fatalf("session publish --to refs/heads/main: %v\n%s", err, out)
	}
	unchanged("the CLI's refused publish")

	// The Control UI's publish action on the session page, in Chromium: a remote the workspace
	// does not have is refused and said so (nothing sent); origin publishes and says where.
	status := "new"
	t.Run("control UI", func(t *testing.T) {
		testenv.RequireCommands(t, "chromium")
		p := browsertest.NewPage(t, browsertest.Start(t), "publish", true)
		link, err := exec.Command(openclawBin, "ui", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
		if err != nil {
			t.Fatalf("openclaw ui: %v", err)
		}
		p.Do("sign in", chromedp.Navigate(strings.TrimSpace(string(link))), chromedp.WaitVisible(`#session-list-status`))
		p.Do("open the session", chromedp.Navigate("http://"+g.addr+"/sessions/"+id), chromedp.WaitVisible(`#publish`))
		p.Do("publish to a remote the workspace lacks", chromedp.SetValue(`#publish-remote`, "upstream"), chromedp.Click(`#publish`))
		p.Until("the refusal", `document.getElementById('publish-result').className === 'error'`)
		if got := browsertest.Eval[string](p, `document.getElementById('publish-result').textContent`); !strings.Contains(got, `Publish failed:`) || !strings.Contains(got, `the workspace has no remote "upstream"`) {
			t.Fatalf("the page says %q", got)
		}
		unchanged("the UI's refused publish")
		p.Do("publish to origin", chromedp.SetValue(`#publish-remote`, "origin"), chromedp.Click(`#publish`))
		p.Until("the result", `document.getElementById('publish-result').className === 'published'`)
		want := "Pushed refs/heads/" + branch + " at " + tip[:12] + " to " + remote + " (new)"
		if got := browsertest.Eval[string](p, `document.getElementById('publish-result').textContent`); got != want {
			t.Fatalf("the page says %q, want %q", got, want)
		}
		// the publish's placement note hides neither what came back nor starts a move's steps
		p.Until("what came back, still shown", `(() => { const h = document.querySelector('#came-back h2'); return !!h && h.textContent === 'What came back' })()`)
		if n := browsertest.Eval[int](p, `document.querySelectorAll('#steps li').length`); n < 2 {
			t.Fatalf("the steps list shows %d step(s) after the publish, want the pull-back's", n)
		}
		p.Shot(rootRel, "publish")
		status = "up to date"
	})

	out, err := cli("", "session", "publish", id)
	if err != nil {
		t.Fatalf("session publish: %v\n%s", err, out)
	}
	if want := remote + " refs/heads/" + branch + " at " + tip[:12] + " (" + status + ")"; !strings.Contains(out, want) {
		t.Fatalf("session publish printed %q, want %q", out, want)
	}
	if got, err := gitforge.Git(ctx, "-C", bare, "rev-parse", "refs/heads/"+branch); err != nil || got != tip {
		t.Fatalf("the forge has %s at %q (%v), want the managed branch's %s", branch, got, err, tip)
	}
	if forge.Authed.Load() == authed {
		t.Fatal("the push reached the forge without the gateway's token")
	}
	if got, _ := gitforge.Git(ctx, "-C", bare, "rev-parse", "refs/heads/main"); !strings.Contains(before, "refs/heads/main "+got) {
		t.Fatal("main moved on the forge")
	}
	res, err := g.client.Publish(g.ctx(), id, workspace.PublishRequest{})
	if err != nil || res.Status != "up to date" || res.Commit != tip {
		t.Fatalf("second publish through the API: %+v %v", res, err)
	}
	if !strings.Contains(strings.Join(eventReasons(g.placement(id)), "\n"), "published "+branch+" to refs/heads/"+branch+" (new, "+tip[:12]+")") {
		t.Fatalf("no placement event of the publish: %v", eventReasons(g.placement(id)))
	}
	if strings.Contains(g.log.String(), forgeToken) || strings.Contains(out, forgeToken) {
		t.Fatal("the forge token is in the gateway log or the CLI's output")
	}
}

func eventReasons(v placementView) []string {
	var r []string
	for _, ev := range v.Events {
		r = append(r, ev.Reason)
	}
	return r
}

// TestGatewayPublishSSH: through a running gateway, an SSH key set with `openclaw credential set
// --git-ssh-key --known-host` publishes to a real OpenSSH sshd on loopback; with a pin that is not
// the server's host key the publish is refused with that said, no key accepted and no ref
// changed; the key is in no output or log. Bad SSH credentials are refused by the CLI.
func TestGatewayPublishSSH(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "git", "ssh", "ssh-keygen", "/usr/sbin/sshd")
	root := t.TempDir()
	ctx := testenv.Context(t, 2*time.Minute)
	keys := filepath.Join(root, "keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	pub, err := gitforge.Keygen(ctx, filepath.Join(keys, "client"))
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := gitforge.Keygen(ctx, filepath.Join(keys, "impostor"))
	if err != nil {
		t.Fatal(err)
	}
	key := readFile(t, filepath.Join(keys, "client"))
	srvDir := filepath.Join(root, "sshd")
	if err := os.MkdirAll(srvDir, 0o700); err != nil {
		t.Fatal(err)
	}
	srv, err := gitforge.StartSSH(ctx, srvDir, pub)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	bare := filepath.Join(srvDir, "org", "repo.git")
	if _, err := gitforge.Git(ctx, "init", "-q", "--bare", bare); err != nil {
		t.Fatal(err)
	}

	g, cli := startPublishGateway(t, root, "pubssh", "forge-ssh", "over ssh")
	body := strings.Split(strings.TrimSpace(key), "\n")[1] // a line of the key's body
	// refused by the CLI, before anything is stored
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{key, []string{"--git-ssh-key"}, "pins no host key"},
		{"not a key", []string{"--git-ssh-key", "--known-host", srv.KnownHost()}, "is not an SSH private key"},
		{key, []string{"--known-host", srv.KnownHost()}, "--known-host and --host-key pin the host key of a --git-ssh-key credential"},
		{key, []string{"--git-ssh-key", "--git-token", "--known-host", srv.KnownHost()}, "one or the other"},
	} {
		out, err := cli(tc.stdin, append([]string{"credential", "set", "forge-ssh"}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) || strings.Contains(out, body) {
			t.Fatalf("credential set %v: %v\n%s\nwant a refusal saying %q, never the key", tc.args, err, out, tc.want)
		}
	}

	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	testenv.Git(t, ws, "push", "-q", bare, "main")
	testenv.Git(t, ws, "remote", "add", "origin", srv.URL(bare))
	id, branch, tip := g.pulledBackWork(ws, "pubssh")
	before, err := gitforge.Refs(ctx, bare)
	if err != nil {
		t.Fatal(err)
	}

	// a pin that is not the server's host key: refused, nothing accepted, nothing changed
	if out, err := cli(key, "credential", "set", "forge-ssh", "--git-ssh-key", "--known-host", "[127.0.0.1]:"+srv.Port+" "+impostor); err != nil {
		t.Fatalf("credential set --git-ssh-key: %v\n%s", err, out)
	}
	out, err := cli("", "session", "publish", id)
	if err == nil || !strings.Contains(out, "is not the credential's pinned host key") || !strings.Contains(out, "nothing was pushed") {
		t.Fatalf("session publish to a server with another host key: %v\n%s", err, out)
	}
	if now, _ := gitforge.Refs(ctx, bare); now != before {
		t.Fatalf("a refused publish changed the server's refs:\n%s", now)
	}
	if strings.Contains(srv.Log(), "Accepted publickey") {
		t.Fatalf("sshd accepted a key for a publish whose host key check failed:\n%s", srv.Log())
	}

	// the server's own host key: the branch lands, authenticated with the credential's key
	if out, err := cli(key, "credential", "set", "forge-ssh", "--git-ssh-key", "--known-host", srv.KnownHost()); err != nil {
		t.Fatalf("credential set --git-ssh-key: %v\n%s", err, out)
	}
	out, err = cli("", "session", "publish", id)
	if err != nil {
		t.Fatalf("session publish over ssh: %v\n%s", err, out)
	}
	if want := srv.URL(bare) + " refs/heads/" + branch + " at " + tip[:12] + " (new)"; !strings.Contains(out, want) {
		t.Fatalf("session publish printed %q, want %q", out, want)
	}
	if got, err := gitforge.Git(ctx, "-C", bare, "rev-parse", "refs/heads/"+branch); err != nil || got != tip {
		t.Fatalf("the server has %s at %q (%v), want %s", branch, got, err, tip)
	}
	if !strings.Contains(srv.Log(), "Accepted publickey for root") {
		t.Fatalf("sshd did not accept the credential's key:\n%s", srv.Log())
	}
	if strings.Contains(g.log.String(), body) {
		t.Fatal("the gateway log holds the SSH key")
	}
}

// startPublishGateway starts a gateway whose profile publishes with credential, and whose scripted
// worker turn commits work.txt holding content; cli runs the real CLI against it with stdin.
func startPublishGateway(t *testing.T, root, profile, credential, content string) (*gw, func(stdin string, args ...string) (string, error)) {
	t.Helper()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{
		"work": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "printf '` + content + `\\n' > work.txt && git add work.txt && git -c user.name=w -c user.email=w@example.com commit -qm 'add work'"}}]},
		          {"text": "Committed."}]`,
	})+"profiles:\n  - id: "+profile+"\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    publish: {credential: "+credential+"}\n")
	t.Cleanup(func() { destroyAll(g) })
	cli := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(openclawBin, append(args, "--gateway", g.addr, "--data-dir", g.dataDir)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	return g, cli
}

// forgeWorkspace creates the user's git workspace at ws with remote as its origin, and pushes its
// main there with the forge's token.
func forgeWorkspace(t *testing.T, ws, remote string) {
	t.Helper()
	userWorkspace(t, ws, true)
	testenv.Git(t, ws, "remote", "add", "origin", remote)
	testenv.Git(t, ws, "-c", "credential.helper=", "-c", "credential.helper=!f() { echo username=x-access-token; echo password="+forgeToken+"; }; f", "push", "-q", "origin", "main")
}

// pulledBackWork runs a session on ws whose worker turn (on profile) commits work, and pulls it
// back; it returns the session, its managed branch and the branch's tip.
func (g *gw) pulledBackWork(ws, profile string) (id, branch, tip string) {
	g.t.Helper()
	id, _ = g.activeSession(ws, "work/m", profile)
	g.runTurn(id, "add the work", "worker")
	g.pullback(id)
	g.mustRest(id, placement.Local)
	branch = "openclaw/" + strings.TrimPrefix(id, "ses_")
	return id, branch, testenv.Git(g.t, ws, "rev-parse", branch)
}

// TestWorkerCommitsCarryTheConfiguredAuthor: git.author (the gateway's, or a profile's) is the
// box repository's identity: a worker's plain `git commit` carries it, and so does the commit
// adopted on the session's branch at home.
func TestWorkerCommitsCarryTheConfiguredAuthor(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{
		"work": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "date > work.txt && git add work.txt && git commit -qm 'add work'"}}]},
		          {"text": "Committed."}]`,
	})+"git: {author: {name: Gateway Author, email: gateway@example.invalid}}\n"+
		"profiles:\n  - id: signed\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    git: {author: {name: Profile Author, email: profile@example.invalid}}\n")
	t.Cleanup(func() { destroyAll(g) })
	for _, tc := range []struct{ profile, want string }{
		{"local", "Gateway Author <gateway@example.invalid>"},
		{"signed", "Profile Author <profile@example.invalid>"},
	} {
		ws := filepath.Join(root, "ws-"+tc.profile)
		userWorkspace(t, ws, false)
		testenv.InitRepo(t, ws, "initial", map[string]string{"README.md": "hello\n"})
		_, branch, _ := g.pulledBackWork(ws, tc.profile)
		if got := testenv.Git(t, ws, "log", "-1", "--format=%an <%ae>", branch); got != tc.want {
			t.Errorf("profile %s: the worker's commit is by %q, want %q", tc.profile, got, tc.want)
		}
	}
}
