package hub

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// gatewayToolTimeout bounds one gateway-resident tool call, unless the tool has a Timeout method.
const gatewayToolTimeout = 2 * time.Minute

// serveToolCall runs a gateway-resident tool (web_search) for a worker's turn, on the gateway and
// with its credentials; the result goes back over the same channel. It answers from a goroutine
// owned by the connection.
func (s *Server) serveToolCall(ctx context.Context, wc *workerConn, f protocol.Frame) (protocol.Frame, bool) {
	var p protocol.ToolCallParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)), true
	}
	if err := p.Validate(); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "%v", err)), true
	}
	var tool tools.Tool
	for _, t := range s.cfg.GatewayTools {
		if t.Name() == p.Name {
			tool = t
		}
	}
	if tool == nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "no gateway tool %.64q", p.Name)), true
	}
	return s.spawnCall(ctx, wc, &f, func() protocol.Frame {
		if e := s.checkBinding(ctx, wc, p.SessionID, p.OwnerEpoch); e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		if e := s.checkRun(ctx, wc, p.SessionID, p.RunID, 0); e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		timeout := gatewayToolTimeout
		if l, ok := tool.(interface{ Timeout() time.Duration }); ok {
			timeout = l.Timeout() // a tool that waits on other work (sessions_send) bounds itself
		}
		tctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		// The tool acts for the session the admission binds (sessions_* tools read it).
		tctx = tools.WithCall(tctx, tools.Call{SessionID: p.SessionID, RunID: p.RunID, ToolCallID: p.ToolCallID})
		out, err := tool.Run(tctx, p.Arguments)
		if err != nil {
			out = tools.Result{IsError: true, Content: []protocol.Content{{Type: protocol.ContentText, Text: p.Name + ": " + err.Error()}}}
		}
		s.auditTool(wc.envID, p, out.IsError)
		r, _ := protocol.Response(f.ID, protocol.ToolCallResult{Content: out.Content, Details: out.Details, IsError: out.IsError})
		return r
	})
}

func (s *Server) auditTool(envID string, p protocol.ToolCallParams, isError bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	outcome := "ok"
	if isError {
		outcome = "error"
	}
	detail := fmt.Sprintf("session %.128s run %.128s tool %.128q call %.256q: %s", p.SessionID, p.RunID, p.Name, p.ToolCallID, outcome)
	if err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		return store.Audit(ctx, tx, s.cfg.Clock.Now(), "worker.tool.call", envID, detail)
	}); err != nil {
		s.log.Warn("audit gateway tool call", "env", envID, "err", err)
	}
}
