// Package anthropic is the inference adapter for the Anthropic Messages API, through the official SDK.
package anthropic

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/protocol"
)

// Adapter streams calls to the Anthropic Messages API.
type Adapter struct {
	// HTTPClient is the client used for requests; nil means a default one (tests set theirs).
	HTTPClient *http.Client
}

var _ inference.Adapter = (*Adapter)(nil)

// New returns the adapter.
func New() *Adapter { return &Adapter{} }

// thinkingBudget maps a reasoning level to a thinking budget in tokens (0: thinking off).
func thinkingBudget(level string) int {
	switch level {
	case inference.ReasoningMinimal:
		return 1024
	case inference.ReasoningLow:
		return 2048
	case inference.ReasoningMedium:
		return 8192
	case inference.ReasoningHigh:
		return 16384
	}
	return 0
}

func (a *Adapter) client(call inference.Call) sdk.Client {
	opts := []option.RequestOption{
		// Nothing from the gateway's environment (ANTHROPIC_* variables, profiles) reaches a request:
		// endpoint, headers and credential come from the catalog and the credentials store only.
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(call.Model.BaseURL),
		option.WithMaxRetries(call.Model.MaxRetries),
	}
	if a.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(a.HTTPClient))
	}
	if call.APIKey != "" {
		opts = append(opts, option.WithAPIKey(call.APIKey))
	}
	for k, v := range call.Model.Headers {
		opts = append(opts, option.WithHeader(k, v))
	}
	return sdk.NewClient(opts...)
}

// Params builds the request of a call (exported for tests of the mapping).
func Params(call inference.Call) (sdk.MessageNewParams, []option.RequestOption, error) {
	p := sdk.MessageNewParams{Model: sdk.Model(call.Model.ID), MaxTokens: int64(call.MaxTokens())}
	var reqOpts []option.RequestOption
	if call.Context.SystemPrompt != "" {
		p.System = []sdk.TextBlockParam{{Text: call.Context.SystemPrompt}}
	}
	msgs, err := convertMessages(call.Context.Messages, call.Model)
	if err != nil {
		return p, nil, err
	}
	p.Messages = msgs
	for _, t := range call.Context.Tools {
		tp, err := convertTool(t)
		if err != nil {
			return p, nil, err
		}
		p.Tools = append(p.Tools, sdk.ToolUnionParam{OfTool: &tp})
	}
	markCacheBreakpoints(&p)
	budget := thinkingBudget(call.Options.Reasoning)
	if budget > 0 && p.MaxTokens <= int64(budget) {
		budget = int(p.MaxTokens) - 1024
	}
	if budget >= 1024 {
		p.Thinking = sdk.ThinkingConfigParamOfEnabled(int64(budget))
	} else if call.Options.Temperature != nil {
		// The SDK has no typed field for temperature; it is still part of the Messages API.
		reqOpts = append(reqOpts, option.WithJSONSet("temperature", *call.Options.Temperature))
	}
	return p, reqOpts, nil
}

// markCacheBreakpoints sets the request's prompt-cache breakpoints (Anthropic allows four). The
// prefix Anthropic caches runs tools → system → messages, so the policy is:
//
//  1. the last tool (the tool list is cached on its own),
//  2. the system prompt,
//  3. the last block of the last message (the rolling breakpoint: the next call, on whichever
//     placement, reads everything up to here from the cache),
//  4. the last block of the user message before it, where the previous call of an agent loop put
//     its rolling breakpoint: that call's cache entry is read even when the step added more
//     blocks than Anthropic looks back over (about 20).
//
// Blocks that cannot carry a breakpoint (thinking) are passed over for the nearest earlier block
// of the same message. The marks depend only on the request's content, so a request is the same
// bytes whichever placement's loop built the transcript.
func markCacheBreakpoints(p *sdk.MessageNewParams) {
	ephemeral := sdk.NewCacheControlEphemeralParam()
	if n := len(p.Tools); n > 0 {
		if cc := p.Tools[n-1].GetCacheControl(); cc != nil {
			*cc = ephemeral
		}
	}
	if n := len(p.System); n > 0 {
		p.System[n-1].CacheControl = ephemeral
	}
	mark := func(m sdk.MessageParam) bool {
		var blocks []sdk.ContentBlockParamUnion
		switch {
		case m.OfUser != nil:
			blocks = m.OfUser.Content
		case m.OfAssistant != nil:
			blocks = m.OfAssistant.Content
		}
		for i := len(blocks) - 1; i >= 0; i-- {
			if cc := blocks[i].GetCacheControl(); cc != nil {
				*cc = ephemeral
				return true
			}
		}
		return false
	}
	last := len(p.Messages) - 1
	if last < 0 || !mark(p.Messages[last]) {
		return
	}
	for i := last - 1; i >= 0; i-- {
		if p.Messages[i].OfUser != nil {
			mark(p.Messages[i])
			return
		}
	}
}

func convertTool(t protocol.Tool) (sdk.ToolParam, error) {
	tp := sdk.ToolParam{Name: t.Name}
	if t.Description != "" {
		tp.Description = sdk.String(t.Description)
	}
	var schema map[string]any
	if len(t.Parameters) > 0 {
		if err := json.Unmarshal(t.Parameters, &schema); err != nil {
			return tp, fmt.Errorf("tool %s: parameters: %w", t.Name, err)
		}
	}
	extra := map[string]any{}
	for k, v := range schema {
		switch k {
		case "type":
		case "properties":
			tp.InputSchema.Properties = v
		case "required":
			if req, ok := v.([]any); ok {
				for _, r := range req {
					if s, ok := r.(string); ok {
						tp.InputSchema.Required = append(tp.InputSchema.Required, s)
					}
				}
			}
		default:
			extra[k] = v
		}
	}
	if tp.InputSchema.Properties == nil {
		tp.InputSchema.Properties = map[string]any{}
	}
	if len(extra) > 0 {
		tp.InputSchema.ExtraFields = extra
	}
	return tp, nil
}

func imageBlock(c protocol.Content) sdk.ContentBlockParamUnion {
	return sdk.NewImageBlockBase64(c.MimeType, c.Data)
}

// convertMessages maps the transcript to Anthropic messages. Consecutive tool results become one user
// message; failed or aborted assistant messages are left out (their tool calls have no results).
// Thinking goes back, in its place, only with its signature and only to the model that produced it
// (signatures are model-specific: a foreign one makes Anthropic reject the request); other thinking
// is left out.
func convertMessages(in []protocol.Message, model inference.Model) ([]sdk.MessageParam, error) {
	var out []sdk.MessageParam
	var results []sdk.ContentBlockParamUnion
	flush := func() {
		if len(results) > 0 {
			out = append(out, sdk.NewUserMessage(results...))
			results = nil
		}
	}
	for _, m := range in {
		switch m.Role {
		case protocol.RoleUser:
			flush()
			var blocks []sdk.ContentBlockParamUnion
			for _, c := range m.Content {
				switch c.Type {
				case protocol.ContentText:
					if c.Text != "" {
						blocks = append(blocks, sdk.NewTextBlock(c.Text))
					}
				case protocol.ContentImage:
					blocks = append(blocks, imageBlock(c))
				}
			}
			if len(blocks) > 0 {
				out = append(out, sdk.NewUserMessage(blocks...))
			}
		case protocol.RoleAssistant:
			flush()
			if m.StopReason == protocol.StopError || m.StopReason == protocol.StopAborted {
				continue
			}
			sameModel := m.API == string(model.API) && m.Provider == model.Provider && m.Model == model.ID
			var blocks []sdk.ContentBlockParamUnion
			for _, c := range m.Content {
				switch c.Type {
				case protocol.ContentThinking:
					if c.Signature != "" && sameModel {
						blocks = append(blocks, sdk.NewThinkingBlock(c.Signature, c.Thinking))
					}
				case protocol.ContentText:
					if strings.TrimSpace(c.Text) != "" {
						blocks = append(blocks, sdk.NewTextBlock(c.Text))
					}
				case protocol.ContentToolCall:
					args := c.Arguments
					if len(args) == 0 {
						args = json.RawMessage(`{}`)
					}
					blocks = append(blocks, sdk.NewToolUseBlock(c.ID, args, c.Name))
				}
			}
			if len(blocks) > 0 {
				out = append(out, sdk.NewAssistantMessage(blocks...))
			}
		case protocol.RoleToolResult:
			tr := sdk.ToolResultBlockParam{ToolUseID: m.ToolCallID, IsError: sdk.Bool(m.IsError)}
			for _, c := range m.Content {
				switch c.Type {
				case protocol.ContentText:
					tr.Content = append(tr.Content, sdk.ToolResultBlockParamContentUnion{OfText: &sdk.TextBlockParam{Text: c.Text}})
				case protocol.ContentImage:
					img := imageBlock(c)
					tr.Content = append(tr.Content, sdk.ToolResultBlockParamContentUnion{OfImage: img.OfImage})
				}
			}
			results = append(results, sdk.ContentBlockParamUnion{OfToolResult: &tr})
		default:
			return nil, fmt.Errorf("message role %q", m.Role)
		}
	}
	flush()
	return out, nil
}

// signatures holds the thinking signatures of a streamed message by content index. The shared
// Builder does not know them: they are filled into every message it emits and into the result.
type signatures struct {
	byIndex map[int]string
	// redacted is set when the message has a redacted_thinking block, which the transcript cannot
	// hold: its signatures are then dropped, since Anthropic may reject a turn sent back with only some
	// of its thinking blocks, while a turn sent back without thinking is what the adapter did before.
	redacted bool
}

func (s *signatures) fill(m *protocol.Message) {
	if s.redacted {
		return
	}
	for i, sig := range s.byIndex {
		if i < len(m.Content) && m.Content[i].Type == protocol.ContentThinking {
			m.Content[i].Signature = sig
		}
	}
}

// Stream implements inference.Adapter.
func (a *Adapter) Stream(ctx context.Context, call inference.Call, emit inference.Emit) (protocol.Message, error) {
	sigs := &signatures{byIndex: map[int]string{}}
	msg, err := a.stream(ctx, call, sigs, func(ev protocol.StreamEvent) error {
		if ev.Message != nil { // a snapshot with its own content slice
			sigs.fill(ev.Message)
		}
		return emit(ev)
	})
	sigs.fill(&msg)
	return msg, err
}

func (a *Adapter) stream(ctx context.Context, call inference.Call, sigs *signatures, emit inference.Emit) (protocol.Message, error) {
	b := inference.NewBuilder(call, emit)
	if err := b.Start(); err != nil {
		return protocol.Message{}, err
	}
	params, reqOpts, err := Params(call)
	if err != nil {
		return b.Fail(ctx, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := a.client(call)
	stream := client.Messages.NewStreaming(ctx, params, reqOpts...)
	defer stream.Close()

	index := map[int64]int{} // Anthropic block index → content index
	var usage protocol.Usage
	var stop sdk.StopReason
	finished := false
	for stream.Next() {
		ev := stream.Current()
		var err error
		switch ev.Type {
		case "message_start":
			u := ev.Message.Usage
			usage = protocol.Usage{Input: u.InputTokens, Output: u.OutputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens}
			b.SetUsage(usage)
		case "content_block_start":
			cb := ev.ContentBlock
			switch cb.Type {
			case "text":
				var i int
				if i, err = b.BeginText(); err == nil {
					index[ev.Index] = i
					err = b.Delta(i, cb.Text)
				}
			case "thinking":
				var i int
				if i, err = b.BeginThinking(); err == nil {
					index[ev.Index] = i
					sigs.byIndex[i] = cb.Signature
					err = b.Delta(i, cb.Thinking)
				}
			case "redacted_thinking":
				sigs.redacted = true
			case "tool_use":
				var i int
				if i, err = b.BeginToolCall(cb.ID, cb.Name); err == nil {
					index[ev.Index] = i
				}
			}
		case "content_block_delta":
			i, ok := index[ev.Index]
			if !ok {
				break
			}
			switch ev.Delta.Type {
			case "text_delta":
				err = b.Delta(i, ev.Delta.Text)
			case "thinking_delta":
				err = b.Delta(i, ev.Delta.Thinking)
			case "signature_delta":
				if _, ok := sigs.byIndex[i]; ok {
					sigs.byIndex[i] += ev.Delta.Signature
				}
			case "input_json_delta":
				err = b.Delta(i, ev.Delta.PartialJSON)
			}
		case "content_block_stop":
			if i, ok := index[ev.Index]; ok {
				err = b.End(i)
			}
		case "message_delta":
			if ev.Delta.StopReason != "" {
				stop = ev.Delta.StopReason
			}
			u := ev.Usage
			if u.JSON.OutputTokens.Valid() {
				usage.Output = u.OutputTokens
			}
			if u.JSON.InputTokens.Valid() && u.InputTokens > 0 {
				usage.Input = u.InputTokens
			}
			if u.JSON.CacheReadInputTokens.Valid() && u.CacheReadInputTokens > 0 {
				usage.CacheRead = u.CacheReadInputTokens
			}
			if u.JSON.CacheCreationInputTokens.Valid() && u.CacheCreationInputTokens > 0 {
				usage.CacheWrite = u.CacheCreationInputTokens
			}
			b.SetUsage(usage)
		case "message_stop":
			finished = true
		}
		if err != nil {
			return protocol.Message{}, err // Emit failed: the deferred Close ends the provider stream
		}
	}
	if err := stream.Err(); err != nil || ctx.Err() != nil {
		return b.Fail(ctx, describe(err))
	}
	if !finished {
		return b.Fail(ctx, errors.New("stream ended before message_stop (connection cut?)"))
	}
	switch stop {
	case sdk.StopReasonMaxTokens, sdk.StopReasonModelContextWindowExceeded:
		return b.Done(protocol.StopLength)
	case sdk.StopReasonToolUse:
		return b.Done(protocol.StopToolUse)
	case sdk.StopReasonRefusal:
		return b.Fail(ctx, errors.New("the model refused to answer (stop_reason refusal)"))
	default: // end_turn, stop_sequence, pause_turn
		return b.Done(protocol.StopStop)
	}
}

// describe turns SDK errors into provider errors with status, retry hint and the provider's message
// (never the request, whose headers carry the credential).
func describe(err error) error {
	ae, ok := errors.AsType[*sdk.Error](err)
	if !ok {
		return err
	}
	msg := cmp.Or(ae.Message, string(ae.Type()), ae.RawJSON())
	status := ae.StatusCode
	if status == http.StatusOK { // an error event inside a started stream
		status = 0
		if t := string(ae.Type()); t != "" && t != msg {
			msg = t + ": " + msg
		}
	}
	return inference.NewProviderError(status, ae.Response, msg)
}
