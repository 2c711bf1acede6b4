package main_test

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// TestSpendAndBudgets: with a priced model and priced machines, a session created with
// --budget runs turns until its next one would pass the budget; that message is refused (402,
// budget-exceeded, naming the budget, its spend, its limit and how to raise it) before any turn
// row. The usage report says the same as the ledger in table, JSON and CSV; `session show` gives
// the session's spend; `budget list` counts a worker's leased time (its minimum billing) with the
// model calls; and a lease whose minimum billing would pass its profile's budget is refused before
// any environment is recorded.
func TestSpendAndBudgets(t *testing.T) {
	root := t.TempDir()
	script := "[" + strings.TrimSuffix(strings.Repeat(`{"text": "An answer long enough to cost something at these prices."},`, 20), ",") + "]"
	// a call reserves its input (tool schemas included) and 50 output tokens ($0.10); an answer
	// costs about $0.03
	cfg := fastWorkerConfig + scriptedPriced(t, root, "paid", script, "maxTokens: 50, cost: {input: 100, output: 2000}") +
		"spend: {timeZone: Europe/Berlin}\n" +
		"budgets:\n  - {id: daily, scope: gateway, window: day, limitUsd: 1000}\n  - {id: dear-month, scope: profile, profile: dear, window: month, limitUsd: 5}\n" +
		"profiles:\n  - id: paid\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    price: {perHour: 36, minimumMinutes: 1}\n" +
		"  - id: dear\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    price: {perHour: 60, minimumMinutes: 10}\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)

	out, stderr, err := g.cli("session", "new", "--workspace", ws, "--budget", "0.5", "-o", "json")
	if err != nil {
		t.Fatalf("session new --budget: %v %s", err, stderr)
	}
	var ses sessions.Session
	if err := json.Unmarshal([]byte(out), &ses); err != nil {
		t.Fatal(err)
	}
	// Turns run until the budget refuses one: its message (402, before any turn row), or its
	// model call (the turn fails, its final message naming the budget).
	ran, refusal := 0, ""
	for i := 0; i < 20 && refusal == ""; i++ {
		before := len(g.turns(ses.ID))
		code, e := g.postRaw("/api/v1/sessions/"+ses.ID+"/messages", `{"text":"answer"}`)
		switch {
		case code == 402:
			if e.Code != "budget-exceeded" {
				t.Fatalf("402 with code %q", e.Code)
			}
			if after := len(g.turns(ses.ID)); after != before {
				t.Fatalf("the refused message left %d turn rows", after-before)
			}
			refusal = e.Message
		case code != 202 && code != 200:
			t.Fatalf("message %d: %d %+v", i+1, code, e)
		default:
			ts := g.turns(ses.ID)
			got := waitTurn(t, g, ts[len(ts)-1].RunID)
			switch {
			case got.Status == turns.TurnDone:
				ran++
			case got.Status == turns.TurnFailed && strings.Contains(got.Error, "budget "):
				refusal = got.Error
			default:
				t.Fatalf("turn %d: %s %s", i+1, got.Status, got.Error)
			}
		}
	}
	if ran == 0 || refusal == "" {
		t.Fatalf("%d turns ran, refusal %q: want some, then a refusal", ran, refusal)
	}
	if !strings.Contains(refusal, "budget session:"+ses.ID) || !strings.Contains(refusal, "of $0.50") || !strings.Contains(refusal, "to raise it") {
		t.Fatalf("the refusal %q does not name the session's budget, its limit and how to raise it", refusal)
	}

	// The ledger, three ways.
	var rows []spend.UsageRow
	out, stderr, err = g.cli("usage", "--by", "session", "-o", "json")
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Key != ses.ID || rows[0].Calls != ran {
		// every call that ran was a done turn's (one answer each); refused ones cost nothing
		t.Fatalf("usage --by session -o json: %v %s %s, want one row of %d calls", err, out, stderr, ran)
	}
	modelUSD := rows[0].USD
	if modelUSD <= 0 || modelUSD > 0.5 {
		t.Fatalf("the session spent $%v, want within its $0.50", modelUSD)
	}
	out, _, err = g.cli("usage", "--by", "session", "-o", "csv")
	recs, cerr := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || cerr != nil || len(recs) != 2 || recs[0][0] != "session" || recs[1][0] != ses.ID {
		t.Fatalf("usage -o csv: %v %v %q", err, cerr, out)
	}
	if usd, _ := strconv.ParseFloat(recs[1][1], 64); math.Abs(usd-modelUSD) > 1e-9 {
		t.Fatalf("csv says $%v, json $%v", usd, modelUSD)
	}
	out, _, err = g.cli("usage", "--by", "model")
	if err != nil || !strings.Contains(out, "paid/m") || !strings.Contains(out, fmt.Sprintf("%.4f", modelUSD)) {
		t.Fatalf("usage --by model: %v\n%s", err, out)
	}
	out, _, err = g.cli("session", "show", ses.ID)
	if err != nil || !strings.Contains(out, fmt.Sprintf("$%.4f", modelUSD)) || !strings.Contains(out, "of its budget $0.50") {
		t.Fatalf("session show: %v\n%s", err, out)
	}

	// A worker's leased time counts, at least its minimum billing ($0.60), while it runs.
	other := filepath.Join(root, "other")
	userWorkspace(t, other, false)
	otherID, _ := g.activeSession(other, "paid/m", "paid")
	var st []spend.Status
	out, _, err = g.cli("budget", "list", "-o", "json")
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st) != 2 || st[0].ID != "daily" {
		t.Fatalf("budget list: %v %s", err, out)
	}
	if got := st[0].SpentUSD - modelUSD; got < 0.6-1e-9 || got > 0.7 {
		t.Fatalf("the daily budget counts $%v beyond the model calls, want the machine's minimum $0.60 (and seconds)", got)
	}
	if st[0].ResetAt.IsZero() || st[0].ResetAt.Location().String() == "UTC" && st[0].ResetAt.Hour() != 23 {
		t.Fatalf("daily resets at %s, want Berlin midnight", st[0].ResetAt)
	}

	// A lease past its profile's budget is refused before it is recorded.
	before := len(must(g.client.Environments(g.ctx(), true))(t))
	code, e := g.postRaw("/api/v1/environments", `{"profileId":"dear"}`)
	if code != 402 || e.Code != "budget-exceeded" || !strings.Contains(e.Message, "budget dear-month") || !strings.Contains(e.Message, "profile dear") {
		t.Fatalf("a lease past its budget: %d %+v, want 402 naming dear-month", code, e)
	}
	if after := len(must(g.client.Environments(g.ctx(), true))(t)); after != before {
		t.Fatalf("the refused lease left %d environments", after-before)
	}
	if p := g.placement(ses.ID); p.Placement.State != placement.Local {
		t.Fatalf("the budgeted session moved: %s", p.Placement.State)
	}

	// A budget set at run time holds at once, shows in the list as set there, and goes with rm.
	if out, stderr, err := g.cli("budget", "set", "cli-day", "--limit", "0.01"); err != nil || !strings.Contains(out, "budget cli-day") {
		t.Fatalf("budget set: %v %s %s", err, out, stderr)
	}
	if code, e := g.postRaw("/api/v1/sessions/"+otherID+"/messages", `{"text":"answer"}`); code != 402 || !strings.Contains(e.Message, "budget cli-day") {
		t.Fatalf("a message past a budget set at run time: %d %+v, want 402 naming cli-day", code, e)
	}
	out, _, err = g.cli("budget", "list")
	if err != nil || !strings.Contains(out, "cli-day") || !strings.Contains(out, "api") || !strings.Contains(out, "exceeded") {
		t.Fatalf("budget list after set:\n%s", out)
	}
	if _, stderr, err := g.cli("budget", "set", "daily", "--limit", "5"); err == nil || !strings.Contains(stderr, "config") {
		t.Fatalf("budget set of a configured budget: %v %s, want refused naming the config", err, stderr)
	}
	if _, stderr, err := g.cli("budget", "rm", "cli-day"); err != nil {
		t.Fatalf("budget rm: %v %s", err, stderr)
	}
	if code, e := g.postRaw("/api/v1/sessions/"+otherID+"/messages", `{"text":"answer"}`); code != 202 && code != 200 {
		t.Fatalf("a message once the budget is removed: %d %+v", code, e)
	}
}

// scriptedPriced is the models section of one scripted provider whose model NAME/m has the
// given settings (its price).
func scriptedPriced(t *testing.T, dir, name, script, model string) string {
	t.Helper()
	p := filepath.Join(dir, name+"-script.json")
	if err := os.WriteFile(p, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("models:\n  default: %s/m\n  providers:\n    %s: {api: scripted, script: %s, models: [{id: m, %s}]}\n", name, name, p, model)
}

// TestASpentTreeBudgetBringsItsChildrenHome: a parent session with a budget of its own spawns a
// child on a worker; the child's answer costs more than the tree has left (a provider may report
// more than the call reserved). The next message to the child is refused (402, naming the
// parent's budget), and the tree's policy stops it: the idle child's work comes home (its file is
// in its workspace on the gateway) and its machine is released, the timeline saying why.
func TestASpentTreeBudgetBringsItsChildrenHome(t *testing.T) {
	root := t.TempDir()
	long := strings.Repeat("A long answer that costs a lot. ", 60)
	write := func(name, body string) string {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	parent := write("parent.json", `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "write out.txt", "model": "child/m", "workspace": "empty", "wait": false}}]},
		{"text": "Spawned."}]`)
	child := write("child.json", `[{"toolCalls": [{"name": "write", "arguments": {"path": "out.txt", "content": "made by the child\n"}}]},
		{"text": "`+long+`"}, {"text": "never"}]`)
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+"agents: {defaultProfile: kids}\n"+
		"profiles:\n  - id: kids\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n"+
		"models:\n  default: parent/m\n  providers:\n"+
		"    parent: {api: scripted, script: "+parent+", models: [{id: m}]}\n"+
		"    child: {api: scripted, script: "+child+", models: [{id: m, maxTokens: 50, cost: {input: 100, output: 2000}}]}\n")
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	ses, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws, BudgetUSD: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	g.runTurn(ses.ID, "start a helper", "local")
	kid := spawnResult(t, toolResults(t, g, ses.ID, "sessions_spawn")[0]).SessionID
	g.waitChild(ses.ID, kid, agents.StatusDone)
	env := g.placement(kid).Placement.EnvironmentID
	if sp := must(g.client.SessionSpend(g.ctx(), ses.ID))(t); sp.TreeUSD <= 0.5 || sp.OwnUSD != 0 {
		t.Fatalf("the tree's spend %+v, want its child's answer past the $0.50", sp)
	}
	code, e := g.postRaw("/api/v1/sessions/"+kid+"/messages", `{"text":"more"}`)
	if code != 402 || e.Code != "budget-exceeded" || !strings.Contains(e.Message, "budget session:"+ses.ID) {
		t.Fatalf("a message to the child of a spent tree: %d %+v, want 402 naming the parent's budget", code, e)
	}
	waitUntil(t, 60*time.Second, func() string { return "the child is still on its worker:\n" + g.placement(kid).String() }, func() bool {
		return g.placement(kid).Placement.State == placement.Local
	})
	v := g.placement(kid)
	timelineHas(t, v, "budget session:"+ses.ID+" is spent: its work came home and its machine "+env+" was released")
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "out.txt")); got != "made by the child\n" {
		t.Fatalf("the child's work came home as %q", got)
	}
	waitUntil(t, 60*time.Second, func() string { return "the child's machine is not released" }, func() bool {
		e, err := g.getEnv(env)
		return err == nil && e.State == envs.Destroyed
	})
}
