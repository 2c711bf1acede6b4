package openai_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/openai"
)

// TestPromptCacheKey: both OpenAI transports send a prompt_cache_key that is the session's (the
// same for every call of a session, wherever its loop runs; another for another session), never
// the session id itself, and none for a call of no session (a probe).
func TestPromptCacheKey(t *testing.T) {
	build := map[string]func(inference.Call) (any, error){
		"completions": func(c inference.Call) (any, error) { return openai.CompletionParams(c) },
		"responses":   func(c inference.Call) (any, error) { return openai.ResponseParams(c) },
	}
	for name, params := range build {
		t.Run(name, func(t *testing.T) {
			key := func(session string) string {
				t.Helper()
				c := call("http://127.0.0.1:1", 0)
				c.Options.Session = session
				p, err := params(c)
				if err != nil {
					t.Fatal(err)
				}
				b, err := json.Marshal(p)
				if err != nil {
					t.Fatal(err)
				}
				var body map[string]any
				if err := json.Unmarshal(b, &body); err != nil {
					t.Fatal(err)
				}
				k, _ := body["prompt_cache_key"].(string)
				if _, ok := body["prompt_cache_key"]; ok && session == "" {
					t.Fatalf("a call of no session has a prompt_cache_key: %s", b)
				}
				return k
			}
			a, a2, b := key("ses_aaaa1111"), key("ses_aaaa1111"), key("ses_bbbb2222")
			if a == "" || a != a2 || a == b || strings.Contains(a, "aaaa1111") {
				t.Fatalf("keys %q %q %q: want one stable key per session that does not show the session id", a, a2, b)
			}
			key("")
		})
	}
}
