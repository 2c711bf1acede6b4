package inference

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/protocol"
)

// probeMaxTokens bounds the answer of a probe call: it proves the call, not the model.
const probeMaxTokens = 16

// probeReplyChars bounds how much of the model's answer a probe reports.
const probeReplyChars = 80

// Probe is the outcome of one minimal call to a model (what `openclaw doctor` reports).
type Probe struct {
	Model   string `json:"model"`
	API     API    `json:"api"`
	BaseURL string `json:"baseUrl,omitempty"`
	// Credential names the provider's credential (never its value).
	Credential string `json:"credential,omitempty"`
	// Scripted: the answer came from a script, no model provider was called.
	Scripted bool `json:"scripted"`
	OK       bool `json:"ok"`
	// StopReason is the call's terminal reason (stop, length, toolUse; error, aborted).
	StopReason string `json:"stopReason,omitempty"`
	// Reply is the start of the answer, bounded and without control characters.
	Reply        string `json:"reply,omitempty"`
	InputTokens  int64  `json:"inputTokens,omitempty"`
	OutputTokens int64  `json:"outputTokens,omitempty"`
	// Error is the call's sanitized error; Status the provider's HTTP status when it refused.
	Error  string `json:"error,omitempty"`
	Status int    `json:"status,omitempty"`
	Millis int64  `json:"ms"`
}

// Probe makes one real, minimal call to the model ref ("" = the default) through the same path a
// session's call takes (credential, adapter, provider), with a one-line prompt and a 16-token
// bound. A call that fails is a Probe with OK false; the error is only for a model not in the
// catalog.
func (c *Catalog) Probe(ctx context.Context, ref string) (Probe, error) {
	if ref == "" {
		ref = c.def
	}
	m, err := c.Resolve(ref)
	if err != nil {
		return Probe{}, err
	}
	p := Probe{Model: m.Ref, API: m.API, BaseURL: m.BaseURL, Credential: m.Credential, Scripted: m.API == APIScripted}
	cx := protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Timestamp: time.Now().UnixMilli(),
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "This is a connectivity check. Reply with the single word OK."}}}}}
	start := time.Now()
	msg, err := c.Stream(ctx, ref, cx, Options{MaxTokens: probeMaxTokens}, func(protocol.StreamEvent) error { return nil })
	p.Millis = time.Since(start).Milliseconds()
	p.StopReason = msg.StopReason
	if msg.Usage != nil {
		p.InputTokens, p.OutputTokens = msg.Usage.Input, msg.Usage.Output
	}
	var text strings.Builder
	for _, ct := range msg.Content {
		if ct.Type == protocol.ContentText {
			text.WriteString(ct.Text)
		}
	}
	p.Reply = printable(text.String(), probeReplyChars)
	if err != nil {
		p.Error = printable(err.Error(), 500)
		var ce *CallError
		if errors.As(err, &ce) {
			p.Status = ce.Status
		}
		return p, nil
	}
	p.OK = true
	return p, nil
}

// printable is s as one printable line (untrusted.Line), bounded to n bytes.
func printable(s string, n int) string { return untrusted.Line(s, n) }
