package inferencetest

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// Wire formats a CachingModel speaks (the catalog's API names).
const (
	WireAnthropic   = "anthropic-messages"
	WireCompletions = "openai-completions"
	WireResponses   = "openai-responses"
)

// The documented prompt-caching rules the CachingModel applies. Tokens are estimated as a quarter
// of the bytes of a block's JSON.
const (
	// MinCachedTokens: neither provider caches a prompt (OpenAI) or a prefix (Anthropic, for its
	// Sonnet and Opus models) shorter than this.
	MinCachedTokens = 1024
	// openAIIncrement: OpenAI reports cache hits in steps of 128 tokens.
	openAIIncrement = 128
	// anthropicLookback: from each breakpoint Anthropic looks for an earlier cache entry at up to
	// about 20 block boundaries back.
	anthropicLookback = 20
)

// CacheUsage is what a CachingModel reported for one request.
type CacheUsage struct {
	Input, CacheRead, CacheWrite int
	// Key is the request's prompt_cache_key (OpenAI), "" for Anthropic.
	Key string
}

// CachingModel is a loopback provider of one wire format that answers like a small agent and
// caches prompts as its provider documents:
//
//   - Anthropic: a prefix (tools → system → messages) is cached at each block marked with
//     cache_control; a request reads the longest cached prefix that ends at one of its
//     breakpoints or at most 20 blocks before one, and writes its breakpoints' prefixes.
//   - OpenAI: every prompt of at least 1024 tokens is cached; a request reads the longest
//     prefix it shares with an earlier prompt routed by the same prompt_cache_key, in steps of
//     128 tokens.
//
// Its answers depend only on the request: to a user's text it calls the read tool on big.txt,
// to a tool result it says "turn done", so the same conversation is the same requests.
type CachingModel struct {
	*Server
	wire string

	mu      sync.Mutex
	prefix  map[[32]byte]bool       // Anthropic: cached prefixes
	prompts map[string][][][32]byte // OpenAI: earlier prompts (item digests) by cache key
	usage   []CacheUsage
}

// NewCachingModel starts a CachingModel speaking wire on loopback.
func NewCachingModel(t *testing.T, wire string) *CachingModel {
	t.Helper()
	m := &CachingModel{wire: wire, prefix: map[[32]byte]bool{}, prompts: map[string][][][32]byte{}}
	m.Server = NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		reqs := m.Requests()
		if err := m.answer(w, reqs[len(reqs)-1].Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	return m
}

// Forget empties the model's cache (as if the provider's entries had expired) and its usage log.
func (m *CachingModel) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.prefix, m.prompts, m.usage = map[[32]byte]bool{}, map[string][][][32]byte{}, nil
}

// Usage returns what the model reported for each request so far, in order.
func (m *CachingModel) Usage() []CacheUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]CacheUsage(nil), m.usage...)
}

// block is one cacheable unit of a prompt: its canonical bytes (cache marks removed) and whether
// it carries a cache breakpoint.
type block struct {
	canon      []byte
	breakpoint bool
}

// canonical re-encodes a JSON value without its cache_control marks (a breakpoint's place does
// not change the prefix it ends) with sorted keys, prefixed by what holds it.
func canonical(where string, raw json.RawMessage) (block, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return block{}, err
	}
	b := block{}
	if o, ok := v.(map[string]any); ok {
		_, b.breakpoint = o["cache_control"]
		delete(o, "cache_control")
	}
	c, err := json.Marshal(v)
	b.canon = append([]byte(where+":"), c...)
	return b, err
}

func tokens(b []byte) int { return (len(b) + 3) / 4 }

// request is what the model reads of a request of any wire format.
type request struct {
	blocks  []block
	key     string
	lastMsg string // "user", "tool" (a tool result), or "" when there is none
	nMsgs   int
}

func (m *CachingModel) parse(body []byte) (request, error) {
	var r request
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return r, err
	}
	if k, ok := raw["prompt_cache_key"]; ok {
		_ = json.Unmarshal(k, &r.key)
	}
	add := func(where string, items ...json.RawMessage) error {
		for _, it := range items {
			b, err := canonical(where, it)
			if err != nil {
				return err
			}
			r.blocks = append(r.blocks, b)
		}
		return nil
	}
	list := func(name string) ([]json.RawMessage, error) {
		var l []json.RawMessage
		if v, ok := raw[name]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, &l); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
		return l, nil
	}
	tools, err := list("tools")
	if err != nil {
		return r, err
	}
	if err := add("tool", tools...); err != nil {
		return r, err
	}
	switch m.wire {
	case WireAnthropic:
		system, err := list("system")
		if err != nil {
			return r, err
		}
		if err := add("system", system...); err != nil {
			return r, err
		}
		msgs, err := list("messages")
		if err != nil {
			return r, err
		}
		for _, mr := range msgs {
			var msg struct {
				Role    string            `json:"role"`
				Content []json.RawMessage `json:"content"`
			}
			if err := json.Unmarshal(mr, &msg); err != nil {
				return r, fmt.Errorf("message: %w", err)
			}
			if err := add(msg.Role, msg.Content...); err != nil {
				return r, err
			}
			r.lastMsg = msg.Role
			if len(msg.Content) > 0 && strings.Contains(string(msg.Content[len(msg.Content)-1]), `"tool_result"`) {
				r.lastMsg = "tool"
			}
		}
		r.nMsgs = len(msgs)
	case WireCompletions, WireResponses:
		name := "messages"
		if m.wire == WireResponses {
			name = "input"
			if ins, ok := raw["instructions"]; ok {
				if err := add("instructions", ins); err != nil {
					return r, err
				}
			}
		}
		msgs, err := list(name)
		if err != nil {
			return r, err
		}
		if err := add("item", msgs...); err != nil {
			return r, err
		}
		for _, mr := range msgs {
			var msg struct{ Role, Type string }
			_ = json.Unmarshal(mr, &msg)
			switch {
			case msg.Role == "tool" || msg.Type == "function_call_output":
				r.lastMsg = "tool"
			case msg.Role == "user":
				r.lastMsg = "user"
			default:
				r.lastMsg = msg.Role + msg.Type
			}
		}
		r.nMsgs = len(msgs)
	default:
		return r, fmt.Errorf("wire %q", m.wire)
	}
	return r, nil
}

// cache applies the provider's caching rules to a request and records its usage.
func (m *CachingModel) cache(r request) CacheUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	digests := make([][32]byte, len(r.blocks))
	cum := make([]int, len(r.blocks)) // tokens of blocks 0..i
	h := sha256.New()
	total := 0
	for i, b := range r.blocks {
		h.Write(b.canon)
		h.Write([]byte{0})
		copy(digests[i][:], h.Sum(nil))
		total += tokens(b.canon)
		cum[i] = total
	}
	u := CacheUsage{Key: r.key}
	switch m.wire {
	case WireAnthropic:
		hit, last := -1, -1
		for i, b := range r.blocks {
			if !b.breakpoint {
				continue
			}
			last = i
			for j := i; j >= 0 && j >= i-anthropicLookback; j-- {
				if m.prefix[digests[j]] {
					hit = max(hit, j)
					break
				}
			}
		}
		if hit >= 0 {
			u.CacheRead = cum[hit]
		}
		for i, b := range r.blocks {
			if b.breakpoint && cum[i] >= MinCachedTokens {
				m.prefix[digests[i]] = true
			}
		}
		if last > hit && cum[last] >= MinCachedTokens {
			u.CacheWrite = cum[last] - u.CacheRead
		}
	default:
		if total >= MinCachedTokens {
			best := -1
			for _, p := range m.prompts[r.key] {
				n := 0
				for n < len(p) && n < len(digests) && p[n] == digests[n] {
					n++
				}
				best = max(best, n-1)
			}
			if best >= 0 && cum[best] >= MinCachedTokens {
				u.CacheRead = cum[best] / openAIIncrement * openAIIncrement
			}
			m.prompts[r.key] = append(m.prompts[r.key], digests)
		}
	}
	u.Input = total - u.CacheRead - u.CacheWrite
	m.usage = append(m.usage, u)
	return u
}

func (m *CachingModel) answer(w http.ResponseWriter, body []byte) error {
	r, err := m.parse(body)
	if err != nil {
		return err
	}
	u := m.cache(r)
	if r.lastMsg == "user" {
		id := fmt.Sprintf("call_%d", r.nMsgs)
		m.toolCall(w, u, id, "read", `{"path":"big.txt"}`)
		return nil
	}
	m.text(w, u, fmt.Sprintf("turn done after %d messages", r.nMsgs))
	return nil
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (m *CachingModel) text(w http.ResponseWriter, u CacheUsage, text string) {
	switch m.wire {
	case WireAnthropic:
		SSE(w, anthropicStart(u),
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"+quote(text)+"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
			anthropicEnd("end_turn"))
	case WireCompletions:
		SSE(w, chunk(`{"role":"assistant","content":`+quote(text)+`}`, "null"), chunk(`{}`, `"stop"`), completionsUsage(u), "data: [DONE]")
	case WireResponses:
		item := `{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":` + quote(text) + `,"annotations":[]}]}`
		SSE(w, respEvent("response.created", `"response":`+respObject("in_progress", CacheUsage{}, false)),
			respEvent("response.output_item.added", `"output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}`),
			respEvent("response.output_text.delta", `"item_id":"msg_1","output_index":0,"content_index":0,"delta":`+quote(text)),
			respEvent("response.output_text.done", `"item_id":"msg_1","output_index":0,"content_index":0,"text":`+quote(text)),
			respEvent("response.output_item.done", `"output_index":0,"item":`+item),
			respEvent("response.completed", `"response":`+respObject("completed", u, true)))
	}
}

func (m *CachingModel) toolCall(w http.ResponseWriter, u CacheUsage, id, name, args string) {
	switch m.wire {
	case WireAnthropic:
		SSE(w, anthropicStart(u),
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":"+quote(id)+",\"name\":"+quote(name)+",\"input\":{}}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"+quote(args)+"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
			anthropicEnd("tool_use"))
	case WireCompletions:
		call := `{"role":"assistant","tool_calls":[{"index":0,"id":` + quote(id) + `,"type":"function","function":{"name":` + quote(name) + `,"arguments":` + quote(args) + `}}]}`
		SSE(w, chunk(call, "null"), chunk(`{}`, `"tool_calls"`), completionsUsage(u), "data: [DONE]")
	case WireResponses:
		item := `{"id":"fc_1","type":"function_call","call_id":` + quote(id) + `,"name":` + quote(name) + `,"arguments":` + quote(args) + `,"status":"completed"}`
		SSE(w, respEvent("response.created", `"response":`+respObject("in_progress", CacheUsage{}, false)),
			respEvent("response.output_item.added", `"output_index":0,"item":{"id":"fc_1","type":"function_call","call_id":`+quote(id)+`,"name":`+quote(name)+`,"arguments":"","status":"in_progress"}`),
			respEvent("response.function_call_arguments.done", `"item_id":"fc_1","output_index":0,"arguments":`+quote(args)),
			respEvent("response.output_item.done", `"output_index":0,"item":`+item),
			respEvent("response.completed", `"response":`+respObject("completed", u, true)))
	}
}

func anthropicStart(u CacheUsage) string {
	return fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,"+
		"\"usage\":{\"input_tokens\":%d,\"output_tokens\":1,\"cache_read_input_tokens\":%d,\"cache_creation_input_tokens\":%d}}}", u.Input, u.CacheRead, u.CacheWrite)
}

func anthropicEnd(stop string) string {
	return "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"" + stop + "\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":8}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}"
}

func chunk(delta, finish string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
}

func completionsUsage(u CacheUsage) string {
	return fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":8,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
		u.Input+u.CacheRead, u.Input+u.CacheRead+8, u.CacheRead)
}

func respEvent(typ, fields string) string {
	return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"," + fields + "}"
}

func respObject(status string, u CacheUsage, usage bool) string {
	s := `{"id":"resp_1","object":"response","created_at":1,"status":"` + status + `","model":"m","output":[]`
	if usage {
		s += fmt.Sprintf(`,"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":8,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`,
			u.Input+u.CacheRead, u.CacheRead, u.Input+u.CacheRead+8)
	}
	return s + "}"
}
