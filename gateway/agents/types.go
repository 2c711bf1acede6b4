package agents

import (
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/providers"
)

// Workspace modes of a spawned child.
const (
	// WorkspaceFork gives the child a copy of the parent's workspace as it is now (git mode: the
	// parent's current commit plus its uncommitted and untracked files, as one snapshot commit;
	// plain mode: the files).
	WorkspaceFork = "fork"
	// WorkspaceEmpty gives the child an empty workspace.
	WorkspaceEmpty = "empty"
)

// Cleanup modes of a spawned child.
const (
	// CleanupKeep leaves the child's environment up (idle, reusable by the next spawn).
	CleanupKeep = "keep"
	// CleanupDelete destroys the child's environment once its results are pulled back.
	CleanupDelete = "delete"
)

// SpawnRequest is what sessions_spawn (and the MCP dispatch tool) asks for. The JSON names are
// upstream's tool parameters.
type SpawnRequest struct {
	// Task is the child's first message (required).
	Task string `json:"task"`
	// Label is the child session's title.
	Label string `json:"label,omitempty"`
	// Profile is the worker profile; "" means agents.defaultProfile.
	Profile      string `json:"profile,omitempty"`
	MachineClass string `json:"machineClass,omitempty"`
	// Model is the child's model reference; "" means the parent's model (or the catalog default).
	Model string `json:"model,omitempty"`
	// Workspace is WorkspaceFork (default) or WorkspaceEmpty.
	Workspace string `json:"workspace,omitempty"`
	// RunTimeoutSeconds bounds each of the child's turns (0: agents.runTimeout).
	RunTimeoutSeconds int `json:"runTimeoutSeconds,omitempty"`
	// Cleanup is CleanupKeep (default) or CleanupDelete.
	Cleanup string `json:"cleanup,omitempty"`
	// Wait (default true) returns once the child's first turn has ended and its results are back;
	// false returns the child's id at once.
	Wait *bool `json:"wait,omitempty"`
	// BudgetUSD is the child's own budget in US dollars (its tree's spend: models and machines);
	// 0: none. The child's spend counts against its parents' budgets either way.
	BudgetUSD float64 `json:"budgetUsd,omitempty"`

	// ToolCallID is the spawning tool call (recorded on the child's row); set by the tool.
	ToolCallID string `json:"-"`
	// Dir is, for a spawn with no parent session (the MCP door), the workspace directory the child
	// forks; it must be empty when there is a parent.
	Dir string `json:"-"`
	// parentRepo is the parent's git workspace a fork came from (the child's branch is fetched
	// into it once the child is back).
	parentRepo string
	// Progress, if set, is told each step of the child (placement steps, tool calls). It must not
	// block.
	Progress func(Progress) `json:"-"`
}

// Waits reports the request's wait flag (default true).
func (r SpawnRequest) Waits() bool { return r.Wait == nil || *r.Wait }

// Progress is one step of a child, for progress notifications.
type Progress struct {
	SessionID string `json:"sessionId"`
	// Kind is "placement" (Message is the placement state and reason) or "tool" (Message names
	// the tool the child called) or "turn" (the turn's status).
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Child statuses, as SpawnResult.Status shows them (derived from the placement and turn rows).
const (
	StatusStarting = "starting" // being placed on a worker
	StatusRunning  = "running"  // a turn is running
	StatusDone     = "done"     // its last turn is done (PulledBack says whether its results are home)
	StatusFailed   = "failed"
	StatusCanceled = "canceled"
)

// Usage is a child's model usage, summed over its model calls.
type Usage struct {
	InputTokens  int64 `json:"inputTokens"`
	OutputTokens int64 `json:"outputTokens"`
	TotalTokens  int64 `json:"totalTokens"`
	Calls        int64 `json:"calls"`
}

// SpawnResult is what the tools return about a child.
type SpawnResult struct {
	SessionID string `json:"sessionId"`
	ParentID  string `json:"parentSessionId,omitempty"`
	Label     string `json:"label,omitempty"`
	Status    string `json:"status"`
	Placement string `json:"placement,omitempty"` // the placement state
	// PulledBack says the child's results are back on the gateway (its placement is local).
	PulledBack    bool   `json:"pulledBack"`
	EnvironmentID string `json:"environmentId,omitempty"`
	ProfileID     string `json:"profileId,omitempty"`
	RunID         string `json:"runId,omitempty"`
	// Answer is the child's final assistant text of its last turn.
	Answer string `json:"answer,omitempty"`
	Error  string `json:"error,omitempty"`
	// Branch, Commits and Files are what came back (git mode); Workspace is where it is on the
	// gateway.
	Branch string `json:"branch,omitempty"`
	// ParentBranch is set when Branch was also fetched into the parent's own repository (a git
	// fork of a parent on the gateway): the parent can merge it from its workspace.
	ParentBranch string                  `json:"parentBranch,omitempty"`
	Commits      []workspace.Commit      `json:"commits,omitempty"`
	Files        []workspace.ChangedFile `json:"files,omitempty"`
	Workspace    string                  `json:"workspace,omitempty"`
	Usage        Usage                   `json:"usage"`
	Cost         float64                 `json:"cost"`
}

// Child is one row of a parent's children, for `session show`.
type Child struct {
	SessionID  string  `json:"sessionId"`
	Label      string  `json:"label,omitempty"`
	ToolCallID string  `json:"toolCallId,omitempty"`
	Status     string  `json:"status"`
	Placement  string  `json:"placement"`
	EnvID      string  `json:"environmentId,omitempty"`
	Usage      Usage   `json:"usage"`
	Cost       float64 `json:"cost"`
}

// ErrNoDefaultProfile is a spawn with no profile on a gateway without agents.defaultProfile.
var ErrNoDefaultProfile = errors.New("no profile given and agents.defaultProfile is not set: pass profile, or set agents.defaultProfile in the gateway config")

// ErrNotChild is a session the caller did not spawn (a parent sees and drives only its own
// children).
var ErrNotChild = errors.New("not a child of this session")

// DepthError refuses a spawn past agents.maxSpawnDepth.
type DepthError struct {
	Depth, Max int
}

func (e *DepthError) Error() string {
	return fmt.Sprintf("a child at depth %d is past agents.maxSpawnDepth %d (worker sessions spawn only when it is raised)", e.Depth, e.Max)
}

// RetryError refuses a spawn that a limit blocks now; the caller may retry after RetryAfter.
type RetryError struct {
	RetryAfter time.Duration
	Err        error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%v; retry in %s", e.Err, e.RetryAfter)
}

// Unwrap returns the cause.
func (e *RetryError) Unwrap() error { return e.Err }

// FieldError names a bad argument.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// asFieldError is err as this package's FieldError when it is a *providers.FieldError.
func asFieldError(err error) error {
	var fe *providers.FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: fe.Field, Msg: fe.Message}
	}
	return err
}

func fieldf(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}
