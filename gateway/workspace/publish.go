package workspace

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// PublishRequest is the (optional) body of POST /sessions/:id/publish.
type PublishRequest struct {
	// Remote names the workspace's configured remote (default origin).
	Remote string `json:"remote,omitempty"`
	// To is the destination ref (default refs/heads/openclaw/<session>); it must match the
	// profile's publish.pushRefAllowlist.
	To string `json:"to,omitempty"`
	// Force allows a non-fast-forward push where publish.forcePushAllowlist does.
	Force bool `json:"force,omitempty"`
	// PR opens (or reuses) the branch's pull request; Title overrides its title (default the
	// session's title).
	PR    bool   `json:"pr,omitempty"`
	Title string `json:"title,omitempty"`
}

// Publish pushes a session's managed branch from its anchor's repository with the profile's
// forge credential (gateway/publish), and opens its pull request when asked: title and body from
// the session (its title, its commits, where to find it). The session must be home (local) with
// a git anchor: what is on a worker has not been scanned and adopted yet.
func (w *Service) Publish(ctx context.Context, sessionID string, req PublishRequest) (publish.Result, error) {
	if w.cfg.Publisher == nil {
		return publish.Result{}, errors.New("publishing is not configured on this gateway")
	}
	p, err := w.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return publish.Result{}, err
	}
	if manifest.Mode(p.SyncMode) != manifest.ModeGit || p.AnchorDir == "" {
		return publish.Result{}, providers.Fieldf("session", "session %s has no managed git branch (it never went to a worker from a git checkout)", sessionID)
	}
	if p.State != placement.Local {
		return publish.Result{}, fmt.Errorf("session %s is %s: pull it back first (its work is published from the gateway's managed worktree): %w", sessionID, p.State, placement.ErrBusy)
	}
	e, err := w.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return publish.Result{}, fmt.Errorf("the profile of session %s's environment: %w", sessionID, err)
	}
	sess, err := w.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return publish.Result{}, err
	}
	gitDir, err := placement.AnchorGit(ctx, p.AnchorDir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return publish.Result{}, err
	}
	branch := placement.Branch(sessionID)
	title := req.Title
	if title == "" {
		title = sess.Title
	}
	body := w.prBody(ctx, sessionID, sess.Title)
	source, dest, signed := "refs/heads/"+branch, req.To, 0
	if dest == "" {
		dest = source
	}
	if w.cfg.Signing != nil {
		// the worker's commits, signed here with the gateway's key (which never reached the box)
		g, err := gitexec.NewUntrusted(ctx, p.AnchorDir)
		if err != nil {
			return publish.Result{}, err
		}
		if source, signed, err = w.cfg.Signing.signBranch(ctx, g, branch); err != nil {
			return publish.Result{}, err
		}
	}
	res, err := w.cfg.Publisher.Publish(ctx, publish.Request{GitDir: gitDir, Source: source, Remote: req.Remote, Dest: dest,
		Force: req.Force, Policy: e.Profile.Publish, PR: req.PR, Title: title, Body: body})
	var re *publish.RefusedError
	if errors.As(err, &re) {
		return res, providers.Fieldf(re.Field, "%s", re.Error())
	}
	if err == nil {
		note := fmt.Sprintf("published %s to %s (%s, %s)", branch, res.Ref, res.Status, short(res.Commit))
		if w.cfg.Signing != nil {
			note += fmt.Sprintf("; %d commit(s) signed with %s", signed, w.cfg.Signing.Fingerprint)
		}
		if res.PullRequest != nil {
			note += fmt.Sprintf("; pull request #%d %s", res.PullRequest.Number, res.PullRequest.URL)
		}
		w.cfg.Placements.Note(ctx, sessionID, note)
	}
	return res, err
}

// prBody is a pull request's description: the task, the commits, and the way back to the session.
func (w *Service) prBody(ctx context.Context, sessionID, task string) string {
	var b strings.Builder
	if task != "" {
		fmt.Fprintf(&b, "Task: %s\n\n", task)
	}
	if ch, err := w.Changes(ctx, sessionID); err == nil && len(ch.Commits) > 0 {
		b.WriteString("Commits:\n")
		for _, c := range ch.Commits {
			fmt.Fprintf(&b, "- %s (%s)\n", c.Subject, short(c.ID))
		}
		if ch.Truncated {
			b.WriteString("- …\n")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "From OpenClaw session %s (`openclaw session show %s`).\n", sessionID, sessionID)
	return b.String()
}

func short(id string) string { return id[:min(12, len(id))] }
