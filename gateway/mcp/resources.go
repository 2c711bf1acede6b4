package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// Resource URIs: openclaw://sessions/{id}/transcript.jsonl and openclaw://sessions/{id}/diff.
const (
	uriPrefix          = "openclaw://sessions/"
	transcriptSuffix   = "/transcript.jsonl"
	diffSuffix         = "/diff"
	transcriptTemplate = uriPrefix + "{sessionId}" + transcriptSuffix
	diffTemplate       = uriPrefix + "{sessionId}" + diffSuffix
)

func resourceURIs(id string) []string {
	return []string{uriPrefix + id + transcriptSuffix, uriPrefix + id + diffSuffix}
}

func (s *Server) addResources() {
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{Name: "transcript", Title: "Session transcript",
		URITemplate: transcriptTemplate, MIMEType: "application/jsonl",
		Description: "A session's transcript as JSONL in the upstream session file layout (as `openclaw session export` writes it): a header line {type: session, version, id, timestamp, cwd}, then one line per entry {type, id, parentId, timestamp, …}, oldest first."},
		s.readTranscript)
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{Name: "diff", Title: "Diff of a session's branch",
		URITemplate: diffTemplate, MIMEType: "text/x-diff",
		Description: "The unified diff of the commits a session's worker brought back on its branch openclaw/<name> (git workspaces, after pull-back)."},
		s.readDiff)
}

// sessionOf parses a resource URI of the given suffix into its session id.
func sessionOf(uri, suffix string) (string, error) {
	rest, ok := strings.CutPrefix(uri, uriPrefix)
	if !ok {
		return "", mcp.ResourceNotFoundError(uri)
	}
	id, ok := strings.CutSuffix(rest, suffix)
	if !ok || id == "" || strings.ContainsAny(id, "/?#") {
		return "", mcp.ResourceNotFoundError(uri)
	}
	id, err := url.PathUnescape(id)
	if err != nil || id == "" || strings.ContainsAny(id, "/\\") {
		return "", mcp.ResourceNotFoundError(uri)
	}
	return id, nil
}

func (s *Server) readTranscript(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	id, err := sessionOf(req.Params.URI, transcriptSuffix)
	if err != nil {
		return nil, err
	}
	tr, err := s.cfg.Client.Transcript(ctx, id)
	if err != nil {
		return nil, toolError("transcript of session "+id, err)
	}
	b := &boundedBuffer{max: s.cfg.MaxResourceBytes}
	if err := sessions.WriteJSONL(b, tr); errors.Is(err, errTooLarge) {
		return nil, fmt.Errorf("transcript of session %s is larger than %d bytes (mcp.maxResourceBytes)", id, s.cfg.MaxResourceBytes)
	} else if err != nil {
		return nil, fmt.Errorf("transcript of session %s: %w", id, err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "application/jsonl", Text: b.String()}}}, nil
}

// errTooLarge stops a diff at the resource bound.
var errTooLarge = errors.New("too large")

// boundedBuffer fails a write past max bytes.
type boundedBuffer struct {
	bytes.Buffer
	max int64
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if int64(b.Len()+len(p)) > b.max {
		return 0, errTooLarge
	}
	return b.Buffer.Write(p)
}

// readDiff runs git diff (read-only) in the session's anchor: from the parent of the branch's
// oldest new commit to the branch. The anchor is on the gateway's machine, so this works when the
// MCP server runs there (`openclaw mcp` next to the gateway, or /mcp).
func (s *Server) readDiff(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	id, err := sessionOf(req.Params.URI, diffSuffix)
	if err != nil {
		return nil, err
	}
	ch, err := s.cfg.Client.BranchChanges(ctx, id)
	if err != nil {
		return nil, toolError("diff of session "+id, err)
	}
	text := ""
	switch {
	case ch.Branch == "" || ch.AnchorDir == "":
		return nil, fmt.Errorf("diff of session %s: no branch (a plain-mode workspace, or never dispatched): its results are the files of its workspace", id)
	case len(ch.Commits) == 0:
		text = "" // nothing committed on the branch yet
	case ch.Truncated:
		return nil, fmt.Errorf("diff of session %s: more commits than the gateway lists; diff the branch %s in %s with git", id, ch.Branch, ch.AnchorDir)
	default:
		if _, err := os.Stat(ch.AnchorDir); err != nil {
			return nil, fmt.Errorf("diff of session %s: its workspace %s is not on this machine (run the MCP server next to the gateway): %w", id, ch.AnchorDir, err)
		}
		base := ch.Commits[len(ch.Commits)-1].ID + "^"
		out := &boundedBuffer{max: s.cfg.MaxResourceBytes}
		// --no-ext-diff and --no-textconv: attributes the worker committed run nothing here.
		err := gitexec.Stream(ctx, ch.AnchorDir, nil, out, "diff", "--no-ext-diff", "--no-textconv", "--no-color", base, "refs/heads/"+ch.Branch, "--")
		if errors.Is(err, errTooLarge) {
			return nil, fmt.Errorf("diff of session %s is larger than %d bytes (mcp.maxResourceBytes)", id, s.cfg.MaxResourceBytes)
		}
		if err != nil {
			return nil, fmt.Errorf("diff of session %s: %w", id, err)
		}
		text = out.String()
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/x-diff", Text: text}}}, nil
}
