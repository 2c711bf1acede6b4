package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

func newSessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "session",
		Example: `  openclaw session new --workspace . --git --profile local
  openclaw session send ses_123 "fix the failing test" --follow
  openclaw session pullback ses_123`,
		Aliases: []string{"sessions"},
		Short:   "List, inspect, follow and export sessions",
	}
	cmd.AddCommand(newSessionCreateCmd(g), newSessionSendCmd(g), newSessionDispatchCmd(g), newSessionPullbackCmd(g), newSessionMoveCmd(g), newSessionListCmd(g), newSessionShowCmd(g), newSessionWatchCmd(g),
		newSessionExportCmd(g), newSessionCancelCmd(g), newSessionPublishCmd(g), newSessionDiffCmd(g),
		newSessionRmCmd(g), newSessionArchiveCmd(g, true), newSessionArchiveCmd(g, false), newSessionPruneCmd(g))
	return cmd
}

func newSessionCreateCmd(g *globals) *cobra.Command {
	var req sessions.CreateRequest
	p := &req.CreateParams
	var worker, class string
	cmd := &cobra.Command{
		Use: "create [--title T] [--model provider/model] [--workspace DIR [--git]] [--profile P [--class C]]",
		Example: `  openclaw session new --workspace . --git --profile local
  openclaw session new --title triage --model anthropic/claude-sonnet-4-5 --workspace ~/src/app`,
		Aliases: []string{"new"},
		Short:   "Create a session",
		Long: `Create a session. The gateway checks everything before it writes the session or leases a machine:
the workspace must exist and be a directory (it is never created), with --git it must be inside a git
work tree, and with --profile the worker profile (and --class) must exist. A session created with --profile runs
its turns on a worker only: if its dispatch fails, its messages are refused until it is dispatched
again or moved to the gateway with ` + "`openclaw session move ID --local`" + `.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			if p.Workspace != "" {
				var err error
				if p.Workspace, err = filepath.Abs(p.Workspace); err != nil {
					return err
				}
			}
			if class != "" && worker == "" {
				return errors.New("--class needs --profile (the worker profile)")
			}
			if worker != "" {
				req.Target = &sessions.Target{Kind: "profile", ProfileID: worker, MachineClass: class}
			}
			ses, err := c.CreateSession(ctx, req)
			if err != nil {
				return err
			}
			if worker != "" {
				if err := awaitDispatch(ctx, c, ses.ID, 0); err != nil {
					return fmt.Errorf("session %s created, but: %w", ses.ID, err)
				}
			}
			return printResult(g, ses, ses.ID)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&p.Title, "title", "", "session title")
	f.StringVar(&p.Agent, "agent", "", "agent id (default "+sessions.DefaultAgent+")")
	f.StringVar(&p.Model, "model", "", "model reference, provider/model")
	f.StringVar(&p.Workspace, "workspace", "", "workspace directory (must exist)")
	f.BoolVar(&req.Git, "git", false, "the workspace must be inside a git work tree (git mode); refused otherwise")
	f.StringVar(&worker, "profile", "", "run the session on a worker of this profile (dispatches it right away; see openclaw profile list)")
	f.StringVar(&worker, "worker", "", "same as --profile")
	_ = f.MarkHidden("worker")
	f.StringVar(&class, "class", "", "with --profile: machine class (overrides the profile's settings.class)")
	f.Float64Var(&p.BudgetUSD, "budget", 0, "the session's budget in US dollars: its spend and its spawned children's (models and machines) may not pass it")
	addOutput(cmd, g)
	return cmd
}

func newSessionListCmd(g *globals) *cobra.Command {
	var f api.SessionFilter
	cmd := listCmd(g, &cobra.Command{Use: "list [--all|--archived]", Example: `  openclaw session list
  openclaw session list --archived
  openclaw session list -o json | jq -r '.[].id'`, Short: "List sessions (archived ones with --all or --archived), most recently updated first", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]sessions.Session, error) {
			if f.All && f.Archived {
				return nil, errors.New("--all lists every session, --archived only the archived ones: pick one")
			}
			return c.SessionsWhere(ctx, f)
		},
		[]string{"ID", "TITLE", "AGENT", "MODEL", "PLACEMENT", "ENVIRONMENT", "UPDATED"}, func(s sessions.Session) []string {
			placement := string(s.Placement)
			if s.ArchivedAt != nil {
				placement += " (archived)"
			}
			return []string{s.ID, dash(truncate(s.Title, 40)), s.Agent, dash(s.Model),
				placement, dash(s.EnvironmentID), humanMs(time.Since(s.UpdatedAt).Milliseconds()) + " ago"}
		})
	cmd.Flags().BoolVar(&f.All, "all", false, "also list archived sessions")
	cmd.Flags().BoolVar(&f.Archived, "archived", false, "list only archived sessions")
	return cmd
}

func newSessionShowCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "show ID",
		Example: `  openclaw session show ses_123
  openclaw session show ses_123 -o yaml`,
		Short: "Show a session and its transcript tree",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			t, err := c.Transcript(ctx, args[0])
			if err != nil {
				return err
			}
			if err := printShow(g, t, func(row func(k, v string)) { sessionRows(ctx, c, t, row) }); err != nil || g.structured() || len(t.Entries) == 0 {
				return err
			}
			fmt.Fprintln(stdout)
			return printList(g, t.Entries, []string{"ENTRY", "PARENT", "TYPE", "RUN", "SUMMARY"}, func(e sessions.Entry) []string {
				return []string{e.ID, dash(e.ParentID), string(e.Type), fmt.Sprint(e.RunEpoch), entrySummary(e)}
			})
		}),
	}
	addOutput(cmd, g)
	return cmd
}

// sessionRows writes the rows of `session show`: the session, where it runs and its tunnel.
func sessionRows(ctx context.Context, c *api.Client, t sessions.Transcript, row func(k, v string)) {
	s := t.Session
	row("id", s.ID)
	row("title", s.Title)
	row("agent", s.Agent)
	row("model", s.Model)
	row("workspace", s.Workspace)
	if pv, err := c.Placement(ctx, s.ID); err == nil {
		p := pv.Placement
		state := string(p.State)
		if p.Error != "" {
			state += " — " + p.Error
		}
		row("placement", state)
		env := p.EnvironmentID
		if env == "" {
			env = s.EnvironmentID
		}
		row("environment", env)
		if env != "" {
			if wi, err := c.EnvironmentWorker(ctx, env); err == nil {
				row("tunnel", fmt.Sprintf("%s (epoch %d), worker admitted: %v", wi.TunnelStatus, wi.TunnelEpoch, wi.Admitted))
			}
		}
		if p.AnchorDir != "" {
			row("anchor", p.AnchorDir+" ("+p.SyncMode+")")
		}
		last := ""
		for _, ev := range pv.Events {
			if strings.HasPrefix(ev.Reason, "checkpoint ") {
				last = ev.At + "  " + ev.Reason
			}
		}
		row("checkpoint", last)
	} else {
		row("placement", string(s.Placement))
		row("environment", s.EnvironmentID)
	}
	if sp, err := c.SessionSpend(ctx, s.ID); err == nil {
		spent := fmt.Sprintf("$%.4f (its own $%.4f)", sp.TreeUSD, sp.OwnUSD)
		if sp.BudgetUSD > 0 {
			spent += fmt.Sprintf(" of its budget $%.2f", sp.BudgetUSD)
		}
		row("spend", spent)
	}
	if s.ParentSessionID != "" {
		row("parent", s.ParentSessionID+" (tool call "+s.SpawnToolCallID+")")
	}
	if kids, err := c.Children(ctx, s.ID); err == nil && len(kids) > 0 {
		var cost float64
		var tokens int64
		for _, k := range kids {
			row("child", fmt.Sprintf("%s %s %s on %s, %d tokens, cost %.6f", k.SessionID, dash(k.Label), k.Status, dash(k.EnvID), k.Usage.TotalTokens, k.Cost))
			cost += k.Cost
			tokens += k.Usage.TotalTokens
		}
		row("children cost", fmt.Sprintf("%.6f (%d tokens, %d children)", cost, tokens, len(kids)))
	}
	if s.ArchivedAt != nil {
		row("archived", s.ArchivedAt.Local().Format(time.RFC3339)+" (read-only; openclaw session unarchive "+s.ID+")")
	}
	row("owner epoch", fmt.Sprint(s.OwnerEpoch))
	row("leaf", s.LeafID)
	row("entries", fmt.Sprint(len(t.Entries)))
	row("created", s.CreatedAt.Local().Format(time.RFC3339))
	row("updated", s.UpdatedAt.Local().Format(time.RFC3339))
}

func entrySummary(e sessions.Entry) string {
	s := strings.Join(strings.Fields(string(e.Content)), " ")
	return truncate(s, 70)
}

func newSessionExportCmd(g *globals) *cobra.Command {
	var file, format string
	cmd := &cobra.Command{
		Use:   "export ID [--file FILE]",
		Short: "Export a transcript as JSONL in the upstream session file layout",
		Long: `Export a session's transcript tree as JSONL in the upstream (pi) session file layout: a header line
{"type":"session","version":3,"id","timestamp","cwd"} and then one line per entry
{"type","id","parentId","timestamp",...}. Without --file the JSONL goes to stdout; a file is written
whole or not at all (temp file, fsync, rename).`,
		Example: `  openclaw session export ses_123 --file transcript.jsonl
  openclaw session export ses_123 | jq -c 'select(.type == "message")'`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(g),
		PreRunE: func(*cobra.Command, []string) error {
			if format != "jsonl" {
				return fmt.Errorf("--output of session export is always jsonl (got %q); to write a file use --file %s", format, format)
			}
			return nil
		},
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			t, err := c.Transcript(ctx, args[0])
			if err != nil {
				return err
			}
			if file == "" || file == "-" {
				return sessions.WriteJSONL(stdout, t)
			}
			return atomicfile.WriteFunc(file, 0o644, func(w io.Writer) error { return sessions.WriteJSONL(w, t) })
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "file to write (default stdout)")
	cmd.Flags().StringVarP(&format, "output", "o", "jsonl", "output format: jsonl (the only one)")
	return cmd
}

func newSessionWatchCmd(g *globals) *cobra.Command {
	var cursor uint64
	var thinking bool
	cmd := &cobra.Command{
		Use:   "watch ID [--cursor N] [-o json|yaml]",
		Short: "Follow a session's live events: assistant text, tool activity, run lifecycle",
		Long: `Follow a session's live events. Retained events after --cursor are replayed first (0: all
retained), then new ones are printed as they happen: assistant text on stdout, tool activity and run
lifecycle on stderr. With -o json every event is one line of JSON on stdout, with its cursor (a gap
of events no longer retained is a {"type":"gap","missed":N} line); with -o yaml every event is one
YAML document of a stream, each starting with "---" (as kubectl get -w -o yaml). A watcher that falls behind is
disconnected by the gateway and reconnects from the last event it printed.`,
		Example: `  openclaw session watch ses_123
  openclaw session watch ses_123 -o json | jq -r 'select(.event.type == "text_delta") | .event.delta'`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(g),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			p := &console.Printer{Out: stdout, Info: stderr, Thinking: thinking, JSONLines: g.asJSON(), YAMLDocs: g.output == "yaml"}
			for {
				err := p.Watch(ctx, c, args[0], &cursor, nil)
				var ce websocket.CloseError
				if errors.As(err, &ce) && ce.Code == websocket.StatusTryAgainLater {
					if !p.JSONLines && !p.YAMLDocs {
						p.Note("(fell behind; resuming after event %d)", cursor)
					}
					continue
				}
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}),
	}
	cmd.Flags().Uint64Var(&cursor, "cursor", 0, "replay retained events after this cursor")
	cmd.Flags().BoolVar(&thinking, "thinking", false, "also print thinking deltas (on stderr)")
	addOutput(cmd, g)
	return cmd
}
