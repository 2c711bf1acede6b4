// Package openai is the inference adapter for OpenAI Chat Completions (and any OpenAI-compatible
// server) and the OpenAI Responses API, through the official SDK.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/protocol"
)

// Completions streams calls to a Chat Completions endpoint.
type Completions struct{ client }

// Responses streams calls to the OpenAI Responses API (POST {baseUrl}/responses).
//
// Calls are stateless (store: false, no previous_response_id): the whole context is sent each time.
// Reasoning summaries become thinking blocks; encrypted reasoning is not carried between calls.
type Responses struct{ client }

var (
	_ inference.Adapter = (*Completions)(nil)
	_ inference.Adapter = (*Responses)(nil)
)

// NewCompletions returns the Chat Completions adapter.
func NewCompletions() *Completions { return &Completions{} }

// NewResponses returns the Responses adapter.
func NewResponses() *Responses { return &Responses{} }

// client is what both adapters hold.
type client struct {
	// HTTPClient is the client used for requests; nil means a default one (tests set theirs).
	HTTPClient *http.Client
}

// options are the client options of a call. Services are built from them directly (not through
// sdk.NewClient), so nothing from the gateway's environment (OPENAI_* variables) reaches a request.
func (c client) options(call inference.Call) []option.RequestOption {
	opts := []option.RequestOption{
		option.WithBaseURL(call.Model.BaseURL),
		option.WithMaxRetries(call.Model.MaxRetries),
	}
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	opts = append(opts, option.WithHTTPClient(hc))
	if call.APIKey != "" {
		opts = append(opts, option.WithAPIKey(call.APIKey))
	}
	for k, v := range call.Model.Headers {
		opts = append(opts, option.WithHeader(k, v))
	}
	return opts
}

func reasoningEffort(level string) shared.ReasoningEffort {
	switch level {
	case inference.ReasoningMinimal:
		return shared.ReasoningEffortMinimal
	case inference.ReasoningLow:
		return shared.ReasoningEffortLow
	case inference.ReasoningMedium:
		return shared.ReasoningEffortMedium
	case inference.ReasoningHigh:
		return shared.ReasoningEffortHigh
	}
	return ""
}

func parseSchema(t protocol.Tool) (map[string]any, error) {
	schema := map[string]any{}
	if len(t.Parameters) > 0 {
		if err := json.Unmarshal(t.Parameters, &schema); err != nil || schema == nil {
			return nil, fmt.Errorf("tool %s: parameters must be a JSON object", t.Name)
		}
	}
	if _, ok := schema["type"]; !ok {
		schema["type"] = "object"
	}
	if _, ok := schema["properties"]; !ok {
		schema["properties"] = map[string]any{}
	}
	return schema, nil
}

func dataURL(c protocol.Content) string { return "data:" + c.MimeType + ";base64," + c.Data }

// toolCalls are the tool calls of an assistant message, with empty arguments sent as {}.
func toolCalls(m protocol.Message) []protocol.Content {
	var out []protocol.Content
	for _, c := range m.Content {
		if c.Type != protocol.ContentToolCall {
			continue
		}
		if len(c.Arguments) == 0 {
			c.Arguments = json.RawMessage("{}")
		}
		out = append(out, c)
	}
	return out
}

func resultText(m protocol.Message) string {
	var parts []string
	for _, c := range m.Content {
		switch c.Type {
		case protocol.ContentText:
			parts = append(parts, c.Text)
		case protocol.ContentImage:
			parts = append(parts, "(image omitted: this API takes no images in tool results)")
		}
	}
	return strings.Join(parts, "\n")
}

// CompletionParams builds the Chat Completions request of a call.
func CompletionParams(call inference.Call) (sdk.ChatCompletionNewParams, error) {
	p := sdk.ChatCompletionNewParams{
		Model:               shared.ChatModel(call.Model.ID),
		MaxCompletionTokens: sdk.Int(int64(call.MaxTokens())),
		StreamOptions:       sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}
	if call.Options.Temperature != nil {
		p.Temperature = sdk.Float(*call.Options.Temperature)
	}
	if k := call.CacheKey(); k != "" {
		p.PromptCacheKey = sdk.String(k)
	}
	if e := reasoningEffort(call.Options.Reasoning); e != "" {
		p.ReasoningEffort = e
	}
	if call.Context.SystemPrompt != "" {
		p.Messages = append(p.Messages, sdk.SystemMessage(call.Context.SystemPrompt))
	}
	for _, m := range call.Context.Messages {
		switch m.Role {
		case protocol.RoleUser:
			var parts []sdk.ChatCompletionContentPartUnionParam
			for _, c := range m.Content {
				switch c.Type {
				case protocol.ContentText:
					parts = append(parts, sdk.TextContentPart(c.Text))
				case protocol.ContentImage:
					parts = append(parts, sdk.ImageContentPart(sdk.ChatCompletionContentPartImageImageURLParam{URL: dataURL(c)}))
				}
			}
			if len(parts) == 1 && parts[0].OfText != nil {
				p.Messages = append(p.Messages, sdk.UserMessage(parts[0].OfText.Text))
			} else if len(parts) > 0 {
				p.Messages = append(p.Messages, sdk.UserMessage(parts))
			}
		case protocol.RoleAssistant:
			if m.StopReason == protocol.StopError || m.StopReason == protocol.StopAborted {
				continue // its tool calls have no results
			}
			var am sdk.ChatCompletionAssistantMessageParam
			if text := m.Text(); strings.TrimSpace(text) != "" {
				am.Content.OfString = sdk.String(text)
			}
			for _, c := range toolCalls(m) {
				am.ToolCalls = append(am.ToolCalls, sdk.ChatCompletionMessageToolCallUnionParam{OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
					ID: c.ID, Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: string(c.Arguments)},
				}})
			}
			if am.Content.OfString.Valid() || len(am.ToolCalls) > 0 {
				p.Messages = append(p.Messages, sdk.ChatCompletionMessageParamUnion{OfAssistant: &am})
			}
		case protocol.RoleToolResult:
			p.Messages = append(p.Messages, sdk.ToolMessage(resultText(m), m.ToolCallID))
		default:
			return p, fmt.Errorf("message role %q", m.Role)
		}
	}
	for _, t := range call.Context.Tools {
		schema, err := parseSchema(t)
		if err != nil {
			return p, err
		}
		fd := shared.FunctionDefinitionParam{Name: t.Name, Parameters: shared.FunctionParameters(schema)}
		if t.Description != "" {
			fd.Description = sdk.String(t.Description)
		}
		p.Tools = append(p.Tools, sdk.ChatCompletionFunctionTool(fd))
	}
	return p, nil
}

// reasoningDelta reads the reasoning text that OpenAI-compatible servers (vLLM, Ollama, DeepSeek)
// stream in a non-standard delta field.
func reasoningDelta(d sdk.ChatCompletionChunkChoiceDelta) string {
	for _, k := range []string{"reasoning_content", "reasoning"} {
		if f, ok := d.JSON.ExtraFields[k]; ok {
			var s string
			if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
				return s
			}
		}
	}
	return ""
}

// streamCall starts the message, builds the request of call with params, opens the provider stream
// with open and hands it to read; the stream is closed (and the provider's connection with it) when
// read returns.
func streamCall[P, E any](ctx context.Context, call inference.Call, emit inference.Emit, params func(inference.Call) (P, error),
	open func(context.Context, P, ...option.RequestOption) *ssestream.Stream[E],
	read func(context.Context, *inference.Builder, *ssestream.Stream[E]) (protocol.Message, error)) (protocol.Message, error) {
	b := inference.NewBuilder(call, emit)
	if err := b.Start(); err != nil {
		return protocol.Message{}, err
	}
	p, err := params(call)
	if err != nil {
		return b.Fail(ctx, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := open(ctx, p)
	defer stream.Close()
	return read(ctx, b, stream)
}

// Stream implements inference.Adapter.
func (a *Completions) Stream(ctx context.Context, call inference.Call, emit inference.Emit) (protocol.Message, error) {
	svc := sdk.NewChatCompletionService(a.options(call)...)
	return streamCall(ctx, call, emit, CompletionParams, svc.NewStreaming, readCompletion)
}

// readCompletion turns a Chat Completions stream into the events of one message.
func readCompletion(ctx context.Context, b *inference.Builder, stream *ssestream.Stream[sdk.ChatCompletionChunk]) (protocol.Message, error) {
	text, thinking, lastTool := -1, -1, -1
	tools := map[int64]int{} // tool call index → content index
	finish := ""
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() && chunk.JSON.Usage.Raw() != "null" {
			u := chunk.Usage
			cached := u.PromptTokensDetails.CachedTokens
			b.SetUsage(protocol.Usage{Input: max(0, u.PromptTokens-cached), Output: u.CompletionTokens, CacheRead: cached,
				CacheWrite: u.PromptTokensDetails.CacheWriteTokens})
		}
		if len(chunk.Choices) == 0 {
			continue
		}
		ch := chunk.Choices[0]
		err := func() error {
			if r := reasoningDelta(ch.Delta); r != "" {
				if thinking < 0 {
					var err error
					if thinking, err = b.BeginThinking(); err != nil {
						return err
					}
				}
				if err := b.Delta(thinking, r); err != nil {
					return err
				}
			}
			if ch.Delta.Content != "" {
				if err := b.End(thinking); err != nil {
					return err
				}
				if text < 0 {
					var err error
					if text, err = b.BeginText(); err != nil {
						return err
					}
				}
				if err := b.Delta(text, ch.Delta.Content); err != nil {
					return err
				}
			}
			for _, tc := range ch.Delta.ToolCalls {
				i, ok := tools[tc.Index]
				if !ok {
					if err := b.End(thinking); err != nil {
						return err
					}
					if err := b.End(text); err != nil {
						return err
					}
					if err := b.End(lastTool); err != nil { // tool calls stream one after another
						return err
					}
					var err error
					if i, err = b.BeginToolCall(tc.ID, tc.Function.Name); err != nil {
						return err
					}
					tools[tc.Index] = i
					lastTool = i
				} else {
					b.SetToolCall(i, tc.ID, tc.Function.Name)
				}
				if err := b.Delta(i, tc.Function.Arguments); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			return protocol.Message{}, err // Emit failed: the deferred Close ends the provider stream
		}
		if ch.FinishReason != "" {
			finish = ch.FinishReason
		}
	}
	if err := stream.Err(); err != nil || ctx.Err() != nil {
		return b.Fail(ctx, describe(err))
	}
	switch finish {
	case "":
		return b.Fail(ctx, errors.New("stream ended without a finish_reason (connection cut?)"))
	case "length":
		return b.Done(protocol.StopLength)
	case "tool_calls", "function_call":
		return b.Done(protocol.StopToolUse)
	case "content_filter":
		return b.Fail(ctx, errors.New("the response was stopped by the content filter"))
	default:
		return b.Done(protocol.StopStop)
	}
}

// describe turns SDK errors into provider errors with status, retry hint and the provider's message.
func describe(err error) error {
	if ae, ok := errors.AsType[*sdk.Error](err); ok {
		msg := ae.Message
		if msg == "" {
			msg = ae.Type
		}
		return inference.NewProviderError(ae.StatusCode, ae.Response, msg)
	}
	return err
}
