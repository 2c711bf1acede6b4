package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// cacheWires are the provider transports of the catalog, by the provider name the tests give them.
var cacheWires = map[string]string{
	"anth": inferencetest.WireAnthropic,
	"chat": inferencetest.WireCompletions,
	"resp": inferencetest.WireResponses,
}

// startCachingGateway starts a gateway whose catalog has one provider per transport, each a
// loopback CachingModel.
func startCachingGateway(t *testing.T, root string) (*gw, map[string]*inferencetest.CachingModel) {
	t.Helper()
	models := map[string]*inferencetest.CachingModel{}
	cfg := fastWorkerConfig + "models:\n  default: anth/m\n  providers:\n"
	for name, wire := range cacheWires {
		models[name] = inferencetest.NewCachingModel(t, wire)
		cfg += fmt.Sprintf("    %s: {api: %s, baseUrl: %s, models: [{id: m}]}\n", name, wire, models[name].URL)
	}
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	return g, models
}

// cacheWorkspace is a user's checkout with a file large enough (about 1,500 tokens) that the
// conversation passes the providers' minimum cacheable length once the agent has read it.
func cacheWorkspace(t *testing.T, dir string) {
	t.Helper()
	var big strings.Builder
	for i := range 150 {
		fmt.Fprintf(&big, "line %03d: the quick brown fox jumps over the lazy dog\n", i)
	}
	testenv.InitRepo(t, dir, "initial", map[string]string{"big.txt": big.String()})
}

// cachePlan is where each turn of a session runs: "local" or "worker"; the session moves
// (dispatch, pull-back) between turns whose placements differ.
type cachePlan []string

// runCachePlan runs the plan's turns on a new session of model and returns the session and the
// request bodies its turns sent to the provider, in order (each turn makes two calls).
func runCachePlan(t *testing.T, g *gw, m *inferencetest.CachingModel, ws, model string, plan cachePlan) (string, [][]byte) {
	t.Helper()
	cacheWorkspace(t, ws)
	id := g.newSession(ws, model)
	before := len(m.Requests())
	where := "local"
	for i, p := range plan {
		if p != where {
			if p == "worker" {
				g.dispatchTo(id, "local")
				g.mustRest(id, "active")
			} else {
				g.pullback(id)
				g.mustRest(id, "local")
			}
			where = p
		}
		// no wait for the checkpoint that follows a worker turn: the message waits for it
		g.runTurn(id, fmt.Sprintf("turn %d: read big.txt", i+1), p)
	}
	if where == "worker" {
		g.pullback(id)
		g.mustRest(id, "local")
	}
	var bodies [][]byte
	for _, r := range m.Requests()[before:] {
		bodies = append(bodies, r.Body)
	}
	if len(bodies) != 2*len(plan) {
		t.Fatalf("session %s made %d model calls, want %d (two per turn)", id, len(bodies), 2*len(plan))
	}
	return id, bodies
}

var cacheKeyField = regexp.MustCompile(`"prompt_cache_key":"([^"]*)"`)

// splitCacheKey returns the body with its prompt_cache_key's value replaced, and that value.
func splitCacheKey(body []byte) (string, string) {
	key := ""
	if m := cacheKeyField.FindSubmatch(body); m != nil {
		key = string(m[1])
	}
	return cacheKeyField.ReplaceAllString(string(body), `"prompt_cache_key":"KEY"`), key
}

// callUsages returns the usage of each assistant message of a session's transcript, in order.
func (g *gw) callUsages(id string) []protocol.Usage {
	g.t.Helper()
	tr, err := g.client.Transcript(g.ctx(), id)
	if err != nil {
		g.t.Fatal(err)
	}
	var out []protocol.Usage
	for _, e := range tr.Entries {
		var m protocol.Message
		if err := json.Unmarshal(e.Content, &m); err != nil {
			g.t.Fatal(err)
		}
		if m.Role == protocol.RoleAssistant && m.Usage != nil {
			out = append(out, *m.Usage)
		}
	}
	return out
}

// TestRequestsAreTheSameBytesOnEveryPlacement: per provider transport, the same conversation run
// on the gateway, on a worker, and moved to a worker and back in its middle sends byte-identical
// request bodies at each call (OpenAI's prompt_cache_key aside: it is the session's, stable
// across the moves and distinct per session). The requests carry the cache policy (Anthropic's
// breakpoints on the tools, the system prompt and the conversation), and a provider that caches
// prefixes as documented reports a cache hit on the first call after each move; the gateway
// records each call's cache reads and writes in the transcript.
func TestRequestsAreTheSameBytesOnEveryPlacement(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g, models := startCachingGateway(t, root)
	for name := range cacheWires {
		t.Run(name, func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			m := models[name]
			model := name + "/m"
			// the moved session runs first: its cache hits can only come from its own calls
			moved, movedBodies := runCachePlan(t, g, m, filepath.Join(root, name, "moved"), model, cachePlan{"local", "worker", "local"})
			movedUsage := m.Usage()
			_, localBodies := runCachePlan(t, g, m, filepath.Join(root, name, "local"), model, cachePlan{"local", "local", "local"})
			_, workerBodies := runCachePlan(t, g, m, filepath.Join(root, name, "worker"), model, cachePlan{"worker", "worker", "worker"})

			keys := map[string]string{}
			for i := range movedBodies {
				want, mk := splitCacheKey(localBodies[i])
				for run, b := range map[string][]byte{"worker": workerBodies[i], "moved": movedBodies[i]} {
					got, key := splitCacheKey(b)
					if got != want {
						t.Fatalf("call %d of the %s session differs from the gateway-only session's:\n%s\nwant\n%s", i+1, run, got, want)
					}
					if prev, ok := keys[run]; ok && prev != key {
						t.Fatalf("the %s session's prompt_cache_key changed from %q to %q at call %d", run, prev, key, i+1)
					}
					keys[run] = key
				}
				keys["local"] = mk
			}
			if cacheWires[name] == inferencetest.WireAnthropic {
				if n := strings.Count(string(movedBodies[2]), `"cache_control"`); n != 4 {
					t.Fatalf("the first call after the dispatch has %d cache breakpoints, want 4 (tools, system, the conversation twice):\n%s", n, movedBodies[2])
				}
				if keys["moved"] != "" {
					t.Fatalf("an Anthropic request carries a prompt_cache_key")
				}
			} else {
				if keys["moved"] == "" || keys["moved"] == keys["local"] || keys["local"] == keys["worker"] ||
					strings.Contains(keys["moved"], strings.TrimPrefix(moved, "ses_")) {
					t.Fatalf("prompt_cache_keys %v: want one per session, never the session id", keys)
				}
			}

			// calls 3 and 5 are the first after the dispatch and after the pull-back
			for _, call := range []int{3, 5} {
				if u := movedUsage[call-1]; u.CacheRead == 0 {
					t.Fatalf("call %d (the first after a move) read nothing from the cache: %+v\nall: %+v", call, u, movedUsage)
				}
			}
			got := g.callUsages(moved)
			if len(got) != len(movedUsage) {
				t.Fatalf("the transcript has %d calls' usage, the provider answered %d", len(got), len(movedUsage))
			}
			for i, u := range movedUsage {
				if got[i].CacheRead != int64(u.CacheRead) || got[i].CacheWrite != int64(u.CacheWrite) || got[i].Input != int64(u.Input) {
					t.Fatalf("call %d: the transcript records %+v, the provider reported %+v", i+1, got[i], u)
				}
			}
			t.Logf("%s: cache reads per call of the moved session: %v", name, cacheReads(movedUsage))
		})
	}
}

func cacheReads(us []inferencetest.CacheUsage) []int {
	var out []int
	for _, u := range us {
		out = append(out, u.CacheRead)
	}
	return out
}

// cachedShare is the share of input tokens read from the cache.
func cachedShare(us []inferencetest.CacheUsage) float64 {
	read, all := 0, 0
	for _, u := range us {
		read += u.CacheRead
		all += u.Input + u.CacheRead + u.CacheWrite
	}
	if all == 0 {
		return 0
	}
	return float64(read) / float64(all)
}

// TestCacheShareAcrossMoves (make bench): per transport, the share of input tokens read from the
// provider's cache across a 10-turn session moved to a worker and back, against the same
// conversation on a session that never moved, each against an empty cache. The goal is a ratio
// of 1.00: a move costs no cache.
func TestCacheShareAcrossMoves(t *testing.T) {
	if os.Getenv("OPENCLAW_BENCH") == "" {
		t.Skip("a benchmark: run by make bench (OPENCLAW_BENCH=1)")
	}
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g, models := startCachingGateway(t, root)
	moved := cachePlan{"local", "local", "local", "worker", "worker", "worker", "local", "local", "local", "local"}
	still := cachePlan{"local", "local", "local", "local", "local", "local", "local", "local", "local", "local"}
	for _, name := range []string{"anth", "chat", "resp"} {
		m := models[name]
		m.Forget()
		runCachePlan(t, g, m, filepath.Join(root, name, "moved"), name+"/m", moved)
		movedShare := cachedShare(m.Usage())
		m.Forget()
		runCachePlan(t, g, m, filepath.Join(root, name, "still"), name+"/m", still)
		stillShare := cachedShare(m.Usage())
		fmt.Printf("cache share %-22s 10 turns, 20 calls: moved twice %5.1f%%  never moved %5.1f%%  ratio %.2f\n",
			cacheWires[name], 100*movedShare, 100*stillShare, movedShare/stillShare)
	}
}
