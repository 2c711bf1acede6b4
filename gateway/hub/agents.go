package hub

import (
	"context"
	"encoding/json"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// SpawnFunc serves a worker session's worker.sessions.spawn (gateway/agents): it spawns the child
// of sessionID from the tool's arguments and returns the tool result, or a refusal with its code
// (spawn-depth-exceeded past agents.maxSpawnDepth, capacity-exceeded with retryAfterMs).
type SpawnFunc func(ctx context.Context, call tools.Call, args json.RawMessage) (protocol.ToolCallResult, *protocol.Error)

// serveSessionsSpawn runs worker.sessions.spawn for the session the connection's admission binds,
// from a goroutine owned by the connection; the spawn lasts as long as the child's first turn when
// it waits.
func (s *Server) serveSessionsSpawn(ctx context.Context, wc *workerConn, f protocol.Frame) (protocol.Frame, bool) {
	if s.cfg.Spawn == nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "this gateway does not spawn sessions")), true
	}
	var p protocol.SessionsSpawnParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)), true
	}
	call := protocol.ToolCallParams{SessionID: p.SessionID, RunID: p.RunID, ToolCallID: p.ToolCallID, Name: protocol.SessionsSpawnTool}
	if err := call.Validate(); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "%v", err)), true
	}
	return s.spawnCall(ctx, wc, &f, func() protocol.Frame {
		if e := s.checkBinding(ctx, wc, p.SessionID, p.OwnerEpoch); e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		if e := s.checkRun(ctx, wc, p.SessionID, p.RunID, 0); e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		out, e := s.cfg.Spawn(ctx, tools.Call{SessionID: p.SessionID, RunID: p.RunID, ToolCallID: p.ToolCallID}, p.Arguments)
		s.auditTool(wc.envID, call, e != nil || out.IsError)
		if e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		r, _ := protocol.Response(f.ID, out)
		return r
	})
}
