package tools

import "context"

// Call names the tool call a Run belongs to: the session, its run and the model's tool call id.
// The runner puts it in the context of every Run; tools that act on behalf of the session (the
// gateway-resident sessions_* tools) read it with CallFrom.
type Call struct {
	SessionID  string
	RunID      string
	ToolCallID string
}

type callKey struct{}

// WithCall returns ctx carrying c.
func WithCall(ctx context.Context, c Call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// CallFrom returns the call ctx carries, if any.
func CallFrom(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callKey{}).(Call)
	return c, ok
}
