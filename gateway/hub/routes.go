package hub

import (
	"context"

	"github.com/openclaw/cloudworkers/protocol"
)

// route is how the hub serves one worker method after admission. Exactly one field is set:
//
//   - inline: answered by the connection's read loop (cheap, never waits on a box or a provider);
//   - queue: decoded by the read loop, then queued on its stream (session + stream kind) and answered
//     in order by the stream's goroutine (see enqueue);
//   - spawn: checked by the read loop, then answered by a goroutine owned by the connection that holds
//     a share of the connection's and environment's call budget (see Server.reserve). It returns a
//     frame to write now (a refusal), or ok false when the goroutine answers.
type route struct {
	inline func(s *Server, ctx context.Context, wc *workerConn, f protocol.Frame) protocol.Frame
	queue  func(f protocol.Frame) (streamKey, sessionID string, params any, e *protocol.Error)
	spawn  func(s *Server, ctx context.Context, wc *workerConn, f protocol.Frame) (res protocol.Frame, now bool)
}

// routes maps every method a worker may call (protocol.WorkerMethods(), and nothing else) to how it
// is served. A credential grants a subset of them.
var routes = map[string]route{
	protocol.MethodHeartbeat:         {inline: (*Server).serveHeartbeat},
	protocol.MethodCredentialRefresh: {inline: (*Server).serveCredentialRefresh},
	protocol.MethodInferenceCredit:   {inline: (*Server).serveInferenceCredit},
	protocol.MethodInferenceCancel:   {inline: (*Server).serveInferenceCancel},

	protocol.MethodTranscriptCommit: {queue: decodeCommit},
	protocol.MethodLiveEvent:        {queue: decodeLiveEvent},
	protocol.MethodResume:           {queue: decodeResume},

	protocol.MethodInferenceStart:    {spawn: (*Server).serveInferenceStart},
	protocol.MethodTranscriptContext: {spawn: (*Server).serveTranscriptContext},
	protocol.MethodToolCall:          {spawn: (*Server).serveToolCall},
	protocol.MethodSessionsSpawn:     {spawn: (*Server).serveSessionsSpawn},
}

// serveRequest answers, queues or starts one request of an admitted worker. The allowlist is
// checked here, once: a method with no route, or one the connection's credential does not grant,
// is refused with method-not-allowed. It returns a frame to write now, or ok false when a stream
// or a goroutine of the connection answers.
func (s *Server) serveRequest(ctx context.Context, wc *workerConn, f protocol.Frame) (res protocol.Frame, now bool) {
	r, ok := routes[f.Method]
	if !ok || !wc.cred.Allows(f.Method) {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "method %.128q is not allowed", f.Method)), true
	}
	if s.cfg.OnActivity != nil && f.Method != protocol.MethodHeartbeat && f.Method != protocol.MethodCredentialRefresh {
		s.cfg.OnActivity(wc.envID)
	}
	switch {
	case r.inline != nil:
		return r.inline(s, ctx, wc, f), true
	case r.queue != nil:
		return s.enqueue(ctx, wc, f, r.queue)
	default:
		return r.spawn(s, ctx, wc, f)
	}
}

// spawn runs fn on a goroutine owned by wc (Close and the end of the connection wait for it),
// then gives back the budget release holds. fn answers through wc.answer.
func (wc *workerConn) spawn(release func(), fn func()) {
	wc.swg.Add(1)
	go func() {
		defer wc.swg.Done()
		defer release()
		fn()
	}()
}

// spawnCall takes a call of f's params bytes from wc's and its environment's budgets (or answers
// capacity-exceeded now), drops the params (the decoded ones are what the call keeps) and answers f
// from a goroutine of wc with what serve returns.
func (s *Server) spawnCall(ctx context.Context, wc *workerConn, f *protocol.Frame, serve func() protocol.Frame) (protocol.Frame, bool) {
	release, e := s.reserve(wc, len(f.Params))
	if e != nil {
		return protocol.ErrorResponse(f.ID, e), true
	}
	f.Params = nil
	wc.spawn(release, func() { wc.answer(ctx, serve()) })
	return protocol.Frame{}, false
}

// answer writes a frame from a goroutine other than the read loop; a connection that cannot take
// it is closed (the read loop then ends). It reports whether the frame was written.
func (wc *workerConn) answer(ctx context.Context, f protocol.Frame) bool {
	if err := wc.write(ctx, f); err != nil {
		_ = wc.ws.CloseNow()
		return false
	}
	return true
}
