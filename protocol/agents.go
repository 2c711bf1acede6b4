package protocol

import "encoding/json"

// MethodSessionsSpawn is a worker session's sessions_spawn tool call (SessionsSpawnParams,
// answered with a ToolCallResult): the gateway spawns the child, refusing past
// agents.maxSpawnDepth with CodeSpawnDepthExceeded before anything is leased.
const MethodSessionsSpawn = "worker.sessions.spawn"

// SessionsSpawnTool is the name of the tool whose calls a worker sends as worker.sessions.spawn.
const SessionsSpawnTool = "sessions_spawn"

// CodeSpawnDepthExceeded refuses a spawn that would make a child deeper than agents.maxSpawnDepth.
const CodeSpawnDepthExceeded Code = "spawn-depth-exceeded"

// SessionsSpawnParams are the params of worker.sessions.spawn: the calling session's scope, the
// model's tool call id and the tool's arguments as the model gave them (decoded and checked by the
// gateway).
type SessionsSpawnParams struct {
	SessionID  string          `json:"sessionId"`
	OwnerEpoch uint64          `json:"ownerEpoch"`
	RunID      string          `json:"runId"`
	ToolCallID string          `json:"toolCallId"`
	Arguments  json.RawMessage `json:"arguments"`
}
