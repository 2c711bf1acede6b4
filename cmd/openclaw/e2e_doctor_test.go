package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
)

// chatChunk is one chunk of an OpenAI chat-completions stream.
func chatChunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
}

// TestDoctorInferenceMakesARealCall: doctor's inference step calls the model through the gateway's
// proxy: a scripted default is reported as scripted; a model on a loopback OpenAI-compatible server
// is really called (the server sees one bounded request with the credential) and answers; a
// refused credential (401) and a server that is down fail the step, naming the model and the error.
func TestDoctorInferenceMakesARealCall(t *testing.T) {
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-good" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)
			return
		}
		inferencetest.SSE(w, chatChunk(`{"role":"assistant","content":"OK"}`, ""), chatChunk(`{}`, "stop"),
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`,
			"data: [DONE]")
	})
	down := "http://" + freeAddr(t) // a loopback port nothing listens on
	root := t.TempDir()
	cfg := fastWorkerConfig + `models:
  default: demo/demo
  providers:
    demo: {api: scripted, models: [{id: demo}]}
    real: {api: openai-completions, baseUrl: ` + srv.URL + `, credential: goodkey, maxRetries: 0, models: [{id: m1}]}
    refused: {api: openai-completions, baseUrl: ` + srv.URL + `, credential: badkey, maxRetries: 0, models: [{id: m1}]}
    down: {api: openai-completions, baseUrl: ` + down + `, maxRetries: 0, models: [{id: m1}]}
`
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	for name, value := range map[string]string{"goodkey": "sk-good", "badkey": "sk-bad"} {
		if err := g.client.SetCredential(g.ctx(), name, value); err != nil {
			t.Fatal(err)
		}
	}
	// doctor runs the whole chain on the local profile; only the inference step differs
	doctor := func(args ...string) (map[string]any, error) {
		t.Helper()
		cmd := exec.Command(openclawBin, append([]string{"doctor", "-o", "json", "--gateway", g.addr, "--data-dir", g.dataDir}, args...)...)
		out, err := cmd.Output()
		var steps []map[string]any
		if jerr := json.Unmarshal(out, &steps); jerr != nil {
			t.Fatalf("doctor output %q: %v", out, jerr)
		}
		for _, s := range steps {
			if s["name"] == "inference" {
				return s, err
			}
			if s["ok"] != true {
				t.Fatalf("step %v failed", s)
			}
		}
		t.Fatalf("no inference step in %v", steps)
		return nil, err
	}
	cases := []struct {
		name   string
		args   []string
		ok     bool
		detail []string
		fix    string
	}{
		{"scripted default", nil, true, []string{"scripted", "demo/demo", "no model provider is called"}, ""},
		{"real", []string{"--model", "real/m1"}, true, []string{"real/m1", "answered a real call", `"OK"`, "12 input / 1 output tokens"}, ""},
		{"401", []string{"--model", "refused/m1"}, false, []string{"refused/m1", "401", "Incorrect API key provided"}, "credential badkey"},
		{"down", []string{"--model", "down/m1"}, false, []string{"down/m1", "connection refused"}, "baseUrl"},
		{"unknown", []string{"--model", "nope/m"}, false, []string{"nope/m", "not in the gateway's model catalog"}, "models list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(srv.Requests())
			s, err := doctor(c.args...)
			if s["ok"] != c.ok || (err == nil) != c.ok {
				t.Fatalf("inference step %v (doctor: %v), want ok=%v", s, err, c.ok)
			}
			for _, want := range c.detail {
				if !strings.Contains(fmt.Sprint(s["detail"]), want) {
					t.Errorf("detail %q does not say %q", s["detail"], want)
				}
			}
			if !strings.Contains(fmt.Sprint(s["fix"]), c.fix) {
				t.Errorf("fix %q does not say %q", s["fix"], c.fix)
			}
			reqs := srv.Requests()[before:]
			switch c.name {
			case "real", "401":
				if len(reqs) != 1 || reqs[0].Path != "/chat/completions" || !strings.Contains(string(reqs[0].Body), `"max_completion_tokens":16`) {
					t.Fatalf("the provider saw %d requests, want one bounded chat completion: %+v", len(reqs), reqs)
				}
			default:
				if len(reqs) != 0 {
					t.Fatalf("the provider was called %d times", len(reqs))
				}
			}
		})
	}
}

// TestDoctorFixesTheGatewayItself: when the gateway cannot be reached, doctor's one failed step
// says how to fix the gateway (start it, on its address; use its token), never a box's SSH fix.
func TestDoctorFixesTheGatewayItself(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), "")
	doctor := func(args ...string) map[string]any {
		t.Helper()
		out, err := exec.Command(openclawBin, append([]string{"doctor", "-o", "json"}, args...)...).Output()
		if err == nil {
			t.Fatalf("doctor %v succeeded: %s", args, out)
		}
		var steps []map[string]any
		if jerr := json.Unmarshal(out, &steps); jerr != nil || len(steps) != 1 || steps[0]["name"] != "gateway" || steps[0]["ok"] != false {
			t.Fatalf("doctor %v: %s (%v), want one failed gateway step", args, out, jerr)
		}
		return steps[0]
	}
	fix := func(s map[string]any) string { f, _ := s["fix"].(string); return f }

	if f := fix(doctor("--gateway", g.addr, "--token", "not-this-gateways-token")); !strings.Contains(f, "refused the token") {
		t.Errorf("wrong token: fix %q", f)
	}
	never := filepath.Join(root, "never-started")
	if f := fix(doctor("--gateway", g.addr, "--data-dir", never)); !strings.Contains(f, "no gateway has run with data dir "+never) ||
		!strings.Contains(f, "openclaw gateway --data-dir "+never) {
		t.Errorf("data dir of no gateway: fix %q", f)
	}
	g.stop()
	f := fix(doctor("--gateway", g.addr, "--data-dir", g.dataDir))
	if !strings.Contains(f, "nothing answers at http://"+g.addr) || !strings.Contains(f, "openclaw gateway --data-dir "+g.dataDir+" --listen "+g.addr) {
		t.Errorf("gateway down: fix %q", f)
	}
	if strings.Contains(f, "SSH") {
		t.Errorf("gateway down: a box's fix %q", f)
	}
}
