package openai

import (
	"context"
	"errors"
	"fmt"
	"strings"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/protocol"
)

// ResponseParams builds the Responses request of a call.
func ResponseParams(call inference.Call) (responses.ResponseNewParams, error) {
	p := responses.ResponseNewParams{
		Model:           shared.ResponsesModel(call.Model.ID),
		MaxOutputTokens: sdk.Int(int64(call.MaxTokens())),
		Store:           sdk.Bool(false),
	}
	if call.Context.SystemPrompt != "" {
		p.Instructions = sdk.String(call.Context.SystemPrompt)
	}
	if call.Options.Temperature != nil {
		p.Temperature = sdk.Float(*call.Options.Temperature)
	}
	if k := call.CacheKey(); k != "" {
		p.PromptCacheKey = sdk.String(k)
	}
	if e := reasoningEffort(call.Options.Reasoning); e != "" {
		p.Reasoning = shared.ReasoningParam{Effort: e, Summary: shared.ReasoningSummaryAuto}
	}
	var input responses.ResponseInputParam
	for _, m := range call.Context.Messages {
		switch m.Role {
		case protocol.RoleUser:
			var parts responses.ResponseInputMessageContentListParam
			for _, c := range m.Content {
				switch c.Type {
				case protocol.ContentText:
					parts = append(parts, responses.ResponseInputContentParamOfInputText(c.Text))
				case protocol.ContentImage:
					img := responses.ResponseInputContentParamOfInputImage(responses.ResponseInputImageDetailAuto)
					img.OfInputImage.ImageURL = sdk.String(dataURL(c))
					parts = append(parts, img)
				}
			}
			if len(parts) == 1 && parts[0].OfInputText != nil {
				input = append(input, responses.ResponseInputItemParamOfMessage(parts[0].OfInputText.Text, responses.EasyInputMessageRoleUser))
			} else if len(parts) > 0 {
				input = append(input, responses.ResponseInputItemParamOfMessage(parts, responses.EasyInputMessageRoleUser))
			}
		case protocol.RoleAssistant:
			if m.StopReason == protocol.StopError || m.StopReason == protocol.StopAborted {
				continue // its tool calls have no results
			}
			if text := m.Text(); strings.TrimSpace(text) != "" {
				input = append(input, responses.ResponseInputItemParamOfMessage(text, responses.EasyInputMessageRoleAssistant))
			}
			for _, c := range toolCalls(m) {
				input = append(input, responses.ResponseInputItemParamOfFunctionCall(string(c.Arguments), c.ID, c.Name))
			}
		case protocol.RoleToolResult:
			out := responses.ResponseInputItemParamOfFunctionCallOutput(resultText(m))
			out.OfFunctionCallOutput.CallID = sdk.String(m.ToolCallID)
			input = append(input, out)
		default:
			return p, fmt.Errorf("message role %q", m.Role)
		}
	}
	p.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: input}
	for _, t := range call.Context.Tools {
		schema, err := parseSchema(t)
		if err != nil {
			return p, err
		}
		tool := responses.ToolParamOfFunction(t.Name, schema, false)
		if t.Description != "" {
			tool.OfFunction.Description = sdk.String(t.Description)
		}
		p.Tools = append(p.Tools, tool)
	}
	return p, nil
}

// responseStream maps the events of one Responses stream onto a Builder. Output items arrive one
// after another (by output_index); each maps to at most one content block, opened on its first
// delta so that empty items (a reasoning item without a summary) leave no block behind.
type responseStream struct {
	b *inference.Builder
	// blocks maps an output item id to its content index.
	blocks map[string]int
	// streamed marks tool calls whose arguments arrived as deltas.
	streamed map[string]bool
	// summaries is the last reasoning summary index seen per reasoning item.
	summaries map[string]int64
	toolUse   bool
}

func (s *responseStream) open(itemID string, begin func() (int, error)) (int, error) {
	if i, ok := s.blocks[itemID]; ok {
		return i, nil
	}
	i, err := begin()
	if err != nil {
		return -1, err
	}
	s.blocks[itemID] = i
	return i, nil
}

// endItem closes the block of an item, if it has one.
func (s *responseStream) endItem(itemID string) error {
	if i, ok := s.blocks[itemID]; ok {
		return s.b.End(i)
	}
	return nil
}

func (s *responseStream) setUsage(u responses.ResponseUsage) {
	cached := u.InputTokensDetails.CachedTokens
	s.b.SetUsage(protocol.Usage{Input: max(0, u.InputTokens-cached), Output: u.OutputTokens, CacheRead: cached,
		CacheWrite: u.InputTokensDetails.CacheWriteTokens})
}

// terminal is the outcome of a stream that reached its end event.
type terminal struct {
	reason string // a protocol stop reason; "" when err is set
	err    error
}

// handle maps one event; it returns a non-nil terminal for the events that end the response.
func (s *responseStream) handle(ev responses.ResponseStreamEventUnion) (*terminal, error) {
	b := s.b
	switch ev.Type {
	case "response.output_item.added":
		it := ev.Item
		if it.Type == "function_call" {
			s.toolUse = true
			if _, err := s.open(it.ID, func() (int, error) { return b.BeginToolCall(it.CallID, it.Name) }); err != nil {
				return nil, err
			}
		}
	case "response.output_text.delta", "response.refusal.delta":
		i, err := s.open(ev.ItemID, b.BeginText)
		if err != nil {
			return nil, err
		}
		return nil, b.Delta(i, ev.Delta)
	case "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		_, had := s.blocks[ev.ItemID]
		i, err := s.open(ev.ItemID, b.BeginThinking)
		if err != nil {
			return nil, err
		}
		if ev.Type == "response.reasoning_summary_text.delta" {
			// Summary parts of one reasoning item share its thinking block, separated by a blank line.
			if last, ok := s.summaries[ev.ItemID]; had && ok && last != ev.SummaryIndex {
				if err := b.Delta(i, "\n\n"); err != nil {
					return nil, err
				}
			}
			s.summaries[ev.ItemID] = ev.SummaryIndex
		}
		return nil, b.Delta(i, ev.Delta)
	case "response.function_call_arguments.delta":
		i, ok := s.blocks[ev.ItemID]
		if !ok {
			return nil, nil // arguments of an item that was never announced
		}
		s.streamed[ev.ItemID] = true
		return nil, b.Delta(i, ev.Delta)
	case "response.function_call_arguments.done":
		// Servers that send the arguments only whole (no deltas) still fill the call.
		if i, ok := s.blocks[ev.ItemID]; ok && !s.streamed[ev.ItemID] {
			s.streamed[ev.ItemID] = true
			if err := b.Delta(i, ev.Arguments); err != nil {
				return nil, err
			}
		}
		return nil, s.endItem(ev.ItemID)
	case "response.output_item.done":
		it := ev.Item
		if it.Type == "function_call" {
			i, ok := s.blocks[it.ID]
			if !ok {
				s.toolUse = true
				var err error
				if i, err = s.open(it.ID, func() (int, error) { return b.BeginToolCall(it.CallID, it.Name) }); err != nil {
					return nil, err
				}
			}
			b.SetToolCall(i, it.CallID, it.Name)
			if !s.streamed[it.ID] {
				s.streamed[it.ID] = true
				if err := b.Delta(i, it.Arguments.OfString); err != nil {
					return nil, err
				}
			}
		}
		return nil, s.endItem(it.ID)
	case "response.completed":
		s.setUsage(ev.Response.Usage)
		if s.toolUse {
			return &terminal{reason: protocol.StopToolUse}, nil
		}
		return &terminal{reason: protocol.StopStop}, nil
	case "response.incomplete":
		s.setUsage(ev.Response.Usage)
		switch r := ev.Response.IncompleteDetails.Reason; r {
		case "max_output_tokens":
			return &terminal{reason: protocol.StopLength}, nil
		case "content_filter":
			return &terminal{err: errors.New("the response was stopped by the content filter")}, nil
		default:
			return &terminal{err: fmt.Errorf("the response is incomplete (%s)", r)}, nil
		}
	case "response.failed":
		s.setUsage(ev.Response.Usage)
		e := ev.Response.Error
		msg := e.Message
		if msg == "" {
			msg = "the response failed"
		}
		if e.Code != "" {
			msg = string(e.Code) + ": " + msg
		}
		return &terminal{err: errors.New(msg)}, nil
	case "error":
		msg := ev.Message
		if ev.Code != "" {
			msg = ev.Code + ": " + msg
		}
		return &terminal{err: errors.New(msg)}, nil
	}
	return nil, nil
}

// Stream implements inference.Adapter.
func (a *Responses) Stream(ctx context.Context, call inference.Call, emit inference.Emit) (protocol.Message, error) {
	svc := responses.NewResponseService(a.options(call)...)
	return streamCall(ctx, call, emit, ResponseParams, svc.NewStreaming, readResponse)
}

// readResponse turns a Responses stream into the events of one message.
func readResponse(ctx context.Context, b *inference.Builder, stream *ssestream.Stream[responses.ResponseStreamEventUnion]) (protocol.Message, error) {
	s := &responseStream{b: b, blocks: map[string]int{}, streamed: map[string]bool{},
		summaries: map[string]int64{}}
	var end *terminal
	for end == nil && stream.Next() {
		t, err := s.handle(stream.Current())
		if err != nil {
			return protocol.Message{}, err // Emit failed: the deferred Close ends the provider stream
		}
		end = t
	}
	if ctx.Err() != nil {
		return b.Fail(ctx, ctx.Err())
	}
	if end == nil {
		if err := stream.Err(); err != nil {
			return b.Fail(ctx, describe(err))
		}
		return b.Fail(ctx, errors.New("stream ended without response.completed (connection cut?)"))
	}
	if end.err != nil {
		return b.Fail(ctx, end.err)
	}
	return b.Done(end.reason)
}
