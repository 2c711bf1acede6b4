package main_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// shellProfile is a lease-CLI profile whose provision runs a shell with the machine class in its
// script (the worst template an operator could write), recording every argv it is given.
func shellProfile(id, rec string) string {
	return fmt.Sprintf(`  - id: %s
    provider: command
    settings:
      provision: [sh, -c, "echo provision {class} {leaseId} >> %[2]s"]
      inspect: [sh, -c, "echo inspect {leaseId} >> %[2]s; exit 1"]
      destroy: [sh, -c, "echo destroy {leaseId} >> %[2]s"]
      timeout: 3s
`, id, rec)
}

// A narrow token stays narrow: the gateway's data dir, /etc, or a symlink to either cannot be a
// workspace through any door (API, agents spawn, MCP with the MCP token); a hostile machine class
// reaches no lease CLI; a bad model or agent id is refused at create. Nothing is written: no
// session, environment, anchor or checkpoint, no file of the data dir anywhere but the data dir.
func TestNarrowTokenStaysNarrow(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "argv.log")
	marker := filepath.Join(root, "marker")
	data := filepath.Join(root, "data")
	cfg := fastWorkerConfig + scriptedModels(t, root, map[string]string{"mcp": mcpScript}) +
		"agents: {defaultProfile: local}\nprofiles:\n" + shellProfile("shell", rec)
	g := startGateway(t, data, cfg)
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, true)
	toData := filepath.Join(root, "innocent")
	if err := os.Symlink(data, toData); err != nil {
		t.Fatal(err)
	}
	sid := g.newSession(ws, "")

	hostileDirs := []string{data, filepath.Join(data, "anchors"), toData, "/etc", "/", root}
	hostileClasses := []string{"x; touch " + marker + " #", "$(touch " + marker + ")", "-x", "--lease-id=attacker-chosen"}

	type refusal struct{ door, path, body, field, rule string }
	var cases []refusal
	for _, d := range hostileDirs {
		rule := "data dir"
		if strings.HasPrefix(d, "/etc") || d == "/" {
			rule = "may not be"
		}
		q, _ := json.Marshal(d)
		cases = append(cases,
			refusal{"api create", "/api/v1/sessions", fmt.Sprintf(`{"title":"t","workspace":%s}`, q), "workspace", rule},
			refusal{"api create on a worker", "/api/v1/sessions", fmt.Sprintf(`{"title":"t","workspace":%s,"target":{"kind":"profile","profileId":"local"}}`, q), "workspace", rule},
			refusal{"agents spawn", "/api/v1/agents/spawn", fmt.Sprintf(`{"task":"x","dir":%s,"profile":"local"}`, q), "dir", rule},
		)
	}
	for _, c := range hostileClasses {
		q, _ := json.Marshal(c)
		wq, _ := json.Marshal(ws)
		cases = append(cases,
			refusal{"api create", "/api/v1/sessions", fmt.Sprintf(`{"title":"t","workspace":%s,"target":{"kind":"profile","profileId":"shell","machineClass":%s}}`, wq, q), "target.machineClass", "machineClass"},
			refusal{"api dispatch", "/api/v1/sessions/" + sid + "/dispatch", fmt.Sprintf(`{"profileId":"shell","machineClass":%s}`, q), "machineClass", "machineClass"},
			refusal{"agents spawn", "/api/v1/agents/spawn", fmt.Sprintf(`{"task":"x","dir":%s,"profile":"shell","machineClass":%s}`, wq, q), "machineClass", "machineClass"},
		)
	}
	cases = append(cases,
		refusal{"api create", "/api/v1/sessions", `{"title":"t","model":"nope/../../x"}`, "model", "catalog"},
		refusal{"api create", "/api/v1/sessions", `{"title":"t","agent":"../../x"}`, "agent", "letters"},
		refusal{"agents spawn", "/api/v1/agents/spawn", fmt.Sprintf(`{"task":"x","dir":%q,"profile":"local","model":"nope/x"}`, ws), "model", "catalog"},
	)
	before := countRows(g)
	for _, c := range cases {
		status, e := g.postRaw(c.path, c.body)
		if status != http.StatusBadRequest || e.Field != c.field || !strings.Contains(e.Message, c.rule) {
			t.Errorf("%s %s: got %d %+v, want 400 naming %s and %q", c.door, c.body, status, e, c.field, c.rule)
		}
	}

	// MCP over HTTP with the MCP token: the same refusals, as tool errors.
	ctx := testenv.Context(t, time.Minute)
	out, err := exec.Command(openclawBin, "mcp", "token", "--data-dir", data).Output()
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: bearer{token: strings.TrimSpace(string(out)), next: http.DefaultTransport}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "hostile", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: "http://" + g.addr + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	mcpCalls := []struct {
		args map[string]any
		want string
	}{}
	for _, d := range hostileDirs {
		mcpCalls = append(mcpCalls, struct {
			args map[string]any
			want string
		}{map[string]any{"workspace": d, "task": "read everything", "profile": "local"}, "refused"})
	}
	for _, c := range hostileClasses {
		mcpCalls = append(mcpCalls, struct {
			args map[string]any
			want string
		}{map[string]any{"workspace": ws, "task": "x", "profile": "shell", "machineClass": c}, "machineClass"})
	}
	for _, c := range mcpCalls {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "dispatch", Arguments: c.args})
		if err == nil && (res == nil || !res.IsError || !strings.Contains(toolText(res), c.want)) {
			t.Errorf("MCP dispatch %v: got %v %q, want a tool error saying %q", c.args, err, toolText(res), c.want)
		}
	}

	if after := countRows(g); after != before {
		t.Errorf("rows written by refused requests: before %v, after %v", before, after)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("a hostile machine class ran a command on the gateway (%s: %v)", marker, err)
	}
	if b, err := os.ReadFile(rec); err == nil {
		t.Errorf("the lease CLI ran for a refused request:\n%s", b)
	}
	// No file of the data dir was copied anywhere: its anchors, checkpoints, agents' forks and
	// boxes hold nothing.
	for _, sub := range []string{"anchors", "checkpoints", "agents", "boxes", "localbox"} {
		n := 0
		_ = filepath.WalkDir(filepath.Join(data, sub), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		if n > 0 {
			t.Errorf("%s holds %d files after refused requests", filepath.Join(data, sub), n)
		}
	}
}

// countRows is what refused requests could have written: sessions and environments.
func countRows(g *gw) string {
	g.t.Helper()
	var ss, es []json.RawMessage
	if _, err := g.do("GET", "/api/v1/sessions?all=true", nil, &ss); err != nil {
		g.t.Fatal(err)
	}
	if _, err := g.do("GET", "/api/v1/environments?all=true", nil, &es); err != nil {
		g.t.Fatal(err)
	}
	return fmt.Sprintf("%d sessions, %d environments", len(ss), len(es))
}
