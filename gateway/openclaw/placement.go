package openclaw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// PlacementWait bounds how long sessions.dispatch and sessions.reclaim (and the
// environments.session methods) wait for the placement to rest; past it they answer UNAVAILABLE
// (retryable) and the move goes on in the gateway.
const PlacementWait = 10 * time.Minute

type dispatchParams struct {
	keyParams
	AgentID      string `json:"agentId"`
	ProfileID    string `json:"profileId"`
	DeviceID     string `json:"deviceId"`
	AutoDevice   bool   `json:"autoDevice"`
	MachineClass string `json:"machineClass"`
	OS           string `json:"os"`
}

// sessionsDispatch moves a session to a worker of a profile (POST /api/v1/sessions/:id/dispatch)
// and answers once it is active there, as the protocol's result says.
func (c *conn) sessionsDispatch(f inFrame) (any, *errorShape) {
	if e := c.placementWired(); e != nil {
		return nil, e
	}
	var p dispatchParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.DeviceID != "" || p.AutoDevice {
		return nil, errf(CodeInvalidRequest, "sessions.dispatch: this gateway runs sessions on cloud workers of a profile, not on paired devices; pass profileId")
	}
	if p.ProfileID == "" {
		return nil, errf(CodeInvalidRequest, "sessions.dispatch needs profileId")
	}
	if e := checkOS(p.OS); e != nil {
		return nil, e
	}
	ctx, cancel := context.WithTimeout(c.ctx, PlacementWait)
	defer cancel()
	s, e := c.existingSession(ctx, p.key())
	if e != nil {
		return nil, e
	}
	pl, e := c.dispatchAndWait(ctx, s.ID, p.ProfileID, p.MachineClass)
	if e != nil {
		return nil, e
	}
	return map[string]any{"ok": true, "key": sessionKeyFor(s.Agent, s.ID), "sessionId": s.ID, "placement": pl}, nil
}

type reclaimParams struct {
	keyParams
	AgentID          string `json:"agentId"`
	RecoverToGateway *struct {
		ExpectedGeneration *uint64 `json:"expectedGeneration"`
	} `json:"recoverToGateway"`
}

// sessionsReclaim brings a session home from its worker (a pull-back: drain, reconcile the
// workspace) and answers once it rests on the gateway. recoverToGateway moves a session whose
// placement failed back to the gateway (session move --local), at the generation the client saw.
func (c *conn) sessionsReclaim(f inFrame) (any, *errorShape) {
	if e := c.placementWired(); e != nil {
		return nil, e
	}
	var p reclaimParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	recover := p.RecoverToGateway != nil
	var gen uint64
	if recover {
		if p.RecoverToGateway.ExpectedGeneration == nil {
			return nil, errf(CodeInvalidRequest, "sessions.reclaim: recoverToGateway needs expectedGeneration")
		}
		gen = *p.RecoverToGateway.ExpectedGeneration
	}
	ctx, cancel := context.WithTimeout(c.ctx, PlacementWait)
	defer cancel()
	s, e := c.existingSession(ctx, p.key())
	if e != nil {
		return nil, e
	}
	cur, _ := c.srv.cfg.Placement(ctx, s.ID)
	if recover && cur.Generation != gen {
		return nil, &errorShape{Code: CodeInvalidRequest, Message: fmt.Sprintf("sessions.reclaim: the placement moved on (generation %d, expected %d); read it again", cur.Generation, gen),
			Details: map[string]any{"code": "stale"}}
	}
	if err := c.srv.cfg.Reclaim(ctx, s.ID, recover); err != nil {
		return nil, envError(err)
	}
	pl, e := c.waitPlacement(ctx, s, func(p Placement) (bool, *errorShape) {
		switch p.State {
		case "local", "reclaimed":
			return true, nil
		case "failed":
			return false, &errorShape{Code: CodeUnavailable, Message: "pull-back failed: " + truncate(orDefault(p.Error, "see the placement timeline"), 500),
				Details: map[string]any{"code": "placement_failed", "placement": "failed"}}
		}
		return false, nil
	})
	if e != nil {
		return nil, e
	}
	return map[string]any{"ok": true, "key": sessionKeyFor(s.Agent, s.ID), "sessionId": s.ID, "placement": pl}, nil
}

// dispatchAndWait starts a dispatch (unless the session is already active on a worker of the
// profile) and waits until it is active.
func (c *conn) dispatchAndWait(ctx context.Context, sessionID, profileID, class string) (map[string]any, *errorShape) {
	s, err := c.srv.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return nil, errf(CodeUnavailable, err.Error())
	}
	cur, _ := c.srv.cfg.Placement(ctx, sessionID)
	if cur.ProfileID != profileID || !activeOrOnItsWay(cur.State) {
		if err := c.srv.cfg.Dispatch(ctx, sessionID, profileID, class); err != nil {
			return nil, envError(err)
		}
	}
	return c.waitPlacement(ctx, s, func(p Placement) (bool, *errorShape) {
		switch p.State {
		case "active":
			return true, nil
		case "failed":
			return false, &errorShape{Code: CodeUnavailable, Message: "dispatch failed: " + truncate(orDefault(p.Error, "see the placement timeline"), 500),
				Details: map[string]any{"code": "placement_failed", "placement": "failed"}}
		case "local", "reclaimed":
			if p.Generation > cur.Generation+1 {
				return false, errf(CodeUnavailable, "the session came back to the gateway before it was active on a worker")
			}
		}
		return false, nil
	})
}

func activeOrOnItsWay(state string) bool {
	switch state {
	case "requested", "provisioning", "syncing", "starting", "active":
		return true
	}
	return false
}

// waitPlacement re-reads the session's placement at each change of it on the gateway-wide feed
// (placement.updated) until done says it rests; a dropped feed is re-joined and read again.
func (c *conn) waitPlacement(ctx context.Context, s sessions.Session, done func(Placement) (bool, *errorShape)) (map[string]any, *errorShape) {
	for {
		sub := c.srv.cfg.Sessions.SubscribeChanges(c.srv.cfg.Sessions.ChangesCursor())
		for {
			p, ok := c.srv.cfg.Placement(ctx, s.ID)
			if !ok {
				p = Placement{State: "local"}
			}
			fin, e := done(p)
			if e != nil {
				sub.Close()
				return nil, e
			}
			if fin {
				sub.Close()
				return c.placementShape(s, p), nil
			}
			if !c.nextChangeOf(ctx, sub, s.ID) {
				why := sub.Err() // (before Close, which records its own reason)
				sub.Close()
				// ErrClosed: the feed is gone (the gateway is stopping); joining again would spin.
				if ctx.Err() != nil || errors.Is(why, sessions.ErrClosed) {
					return nil, &errorShape{Code: CodeUnavailable, Message: fmt.Sprintf("the placement is still %s; it goes on in the gateway (follow it in sessions.list)", p.State),
						Retryable: true, RetryAfterMs: 5000}
				}
				break // the feed dropped this lagging subscriber: join it again and read afresh
			}
		}
	}
}

// checkOS refuses an operating-system choice other than Linux: every box this gateway leases
// runs Linux.
func checkOS(os string) *errorShape {
	if os != "" && !strings.EqualFold(os, "linux") {
		return errf(CodeInvalidRequest, "os "+truncate(os, 64)+" is not offered: this gateway's workers run linux")
	}
	return nil
}

// existingSession resolves a key to an existing session.
func (c *conn) existingSession(ctx context.Context, key string) (sessions.Session, *errorShape) {
	s, e := c.resolveKey(ctx, key)
	if e != nil {
		return sessions.Session{}, e
	}
	if s.ID == "" {
		return sessions.Session{}, errf(CodeInvalidRequest, "no session for key "+truncate(key, 128))
	}
	return s, nil
}

type envSessionParams struct {
	SessionKey     string `json:"sessionKey"`
	AgentID        string `json:"agentId"`
	EnvironmentID  string `json:"environmentId"`
	ProfileID      string `json:"profileId"`
	IdempotencyKey string `json:"idempotencyKey"`
	MachineClass   string `json:"machineClass"`
	OS             string `json:"os"`
	Presentation   string `json:"presentation"`
}

// environmentsSessionCreate attaches a worker environment of a profile to a conversation: on this
// gateway that is the session dispatched to a worker of that profile (its turns and tools run
// there; its workspace synced out). It answers once the session is active there.
func (c *conn) environmentsSessionCreate(f inFrame) (any, *errorShape) {
	if e := c.placementWired(); e != nil {
		return nil, e
	}
	var p envSessionParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	switch {
	case p.SessionKey == "":
		return nil, errf(CodeInvalidRequest, "sessionKey is required for operator environment requests")
	case p.ProfileID == "" || p.IdempotencyKey == "" || len(p.IdempotencyKey) > 256:
		return nil, errf(CodeInvalidRequest, "environments.session.create needs profileId and an idempotencyKey of at most 256 bytes")
	case p.Presentation != "":
		return nil, errf(CodeInvalidRequest, "presentation "+truncate(p.Presentation, 32)+" is not offered: this gateway's workers have no desktop")
	}
	if e := checkOS(p.OS); e != nil {
		return nil, e
	}
	ctx, cancel := context.WithTimeout(c.ctx, PlacementWait)
	defer cancel()
	s, e := c.existingSession(ctx, p.SessionKey)
	if e != nil {
		return nil, e
	}
	if _, e := c.dispatchAndWait(ctx, s.ID, p.ProfileID, p.MachineClass); e != nil {
		return nil, e
	}
	return c.attachment(ctx, s, "")
}

// environmentsSessionStatus is the conversation's attached environment, if any.
func (c *conn) environmentsSessionStatus(f inFrame) (any, *errorShape) {
	if e := c.placementWired(); e != nil {
		return nil, e
	}
	var p envSessionParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, e := c.existingSession(ctx, p.SessionKey)
	if e != nil {
		return nil, e
	}
	return c.attachment(ctx, s, p.EnvironmentID)
}

// environmentsSessionDestroy detaches the conversation's environment: the session is pulled
// back (its work comes home first) and the environment destroyed with proof of teardown.
func (c *conn) environmentsSessionDestroy(f inFrame) (any, *errorShape) {
	if e := c.placementWired(); e != nil {
		return nil, e
	}
	var p envSessionParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, PlacementWait)
	defer cancel()
	s, e := c.existingSession(ctx, p.SessionKey)
	if e != nil {
		return nil, e
	}
	cur, _ := c.srv.cfg.Placement(ctx, s.ID)
	envID := cur.EnvironmentID
	if p.EnvironmentID != "" && p.EnvironmentID != envID {
		return nil, errf(CodeInvalidRequest, "Conversation environment target changed")
	}
	if envID == "" || cur.State == "local" {
		return map[string]any{"stopped": true}, nil
	}
	if cur.State != "reclaimed" {
		if err := c.srv.cfg.Reclaim(ctx, s.ID, false); err != nil {
			return nil, envError(err)
		}
		if _, e := c.waitPlacement(ctx, s, func(p Placement) (bool, *errorShape) {
			if p.State == "failed" {
				return false, errf(CodeUnavailable, "pull-back failed, the environment is kept: "+truncate(orDefault(p.Error, "see the placement timeline"), 500))
			}
			return p.State == "local" || p.State == "reclaimed", nil
		}); e != nil {
			return nil, e
		}
	}
	env, err := c.srv.cfg.DestroyEnvironment(ctx, envID, false)
	if err != nil {
		return nil, envError(err)
	}
	return map[string]any{"stopped": true, "environment": summary(env)}, nil
}

// attachment answers environments.session.status for a session: its worker environment while the
// session is placed on one.
func (c *conn) attachment(ctx context.Context, s sessions.Session, wantEnv string) (any, *errorShape) {
	p, ok := c.srv.cfg.Placement(ctx, s.ID)
	if !ok || p.EnvironmentID == "" || p.State == "local" || p.State == "reclaimed" {
		if wantEnv != "" {
			return nil, errf(CodeInvalidRequest, "Conversation environment target changed")
		}
		return map[string]any{"attachment": nil}, nil
	}
	if wantEnv != "" && wantEnv != p.EnvironmentID {
		return nil, errf(CodeInvalidRequest, "Conversation environment target changed")
	}
	out := map[string]any{"attachment": map[string]any{"sessionId": s.ID, "sessionKey": sessionKeyFor(s.Agent, s.ID),
		"environmentId": p.EnvironmentID, "profileId": p.ProfileID, "placementState": p.State, "closedAtMs": nil}, "closed": false}
	if c.srv.cfg.Environments != nil {
		envs, err := c.srv.cfg.Environments(ctx)
		if err != nil {
			return nil, errf(CodeUnavailable, err.Error())
		}
		for _, e := range envs {
			if e.ID == p.EnvironmentID {
				out["environment"] = summary(e)
			}
		}
	}
	return out, nil
}

// nextChangeOf waits for a change of the session on the feed: false when ctx ends or the feed
// dropped the subscriber.
func (c *conn) nextChangeOf(ctx context.Context, sub *sessions.Subscription[*sessions.Change], id string) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case ch, ok := <-sub.C():
			if !ok {
				return false
			}
			if ch.ID == id {
				return true
			}
		}
	}
}

// placementWired refuses a placement method on a gateway that places no sessions.
func (c *conn) placementWired() *errorShape {
	if c.srv.cfg.Dispatch == nil || c.srv.cfg.Reclaim == nil || c.srv.cfg.Placement == nil {
		return errf(CodeUnavailable, "this gateway places no sessions on workers")
	}
	return nil
}

type resolveParams struct {
	Key       string `json:"key"`
	SessionID string `json:"sessionId"`
	Label     string `json:"label"`
	Reference *struct {
		Key string `json:"key"`
	} `json:"reference"`
	ShortID      string `json:"shortId"`
	AgentID      string `json:"agentId"`
	AllowMissing bool   `json:"allowMissing"`
}

// maxResolveCandidates is how many sessions an ambiguous sessions.resolve names (the protocol's
// bound).
const maxResolveCandidates = 10

// sessionsResolve finds the session a key, a session id, a label or a short id names (what the
// Control UI calls for a deep link such as /chat/<agent>/<session id>).
func (c *conn) sessionsResolve(f inFrame) (any, *errorShape) {
	var p resolveParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.Reference != nil && p.Key == "" {
		p.Key = p.Reference.Key
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	found := func(s sessions.Session) map[string]any {
		title := s.Title
		if title == "" {
			title = s.ID
		}
		return map[string]any{"key": sessionKeyFor(s.Agent, s.ID), "agentId": s.Agent, "displayName": title}
	}
	missing := func() (any, *errorShape) {
		if p.AllowMissing {
			return map[string]any{"ok": false}, nil
		}
		return nil, errf(CodeInvalidRequest, "no session found")
	}
	switch {
	case p.Key != "" || p.SessionID != "":
		key := p.Key
		if key == "" {
			key = p.SessionID
		}
		s, e := c.resolveKey(ctx, key)
		if e != nil || s.ID == "" || (p.AgentID != "" && s.Agent != p.AgentID) {
			return missing()
		}
		out := found(s)
		out["ok"] = true
		return out, nil
	case p.Label != "" || p.ShortID != "":
		if len(p.Label) > 512 || len(p.ShortID) > 128 {
			return nil, errf(CodeInvalidRequest, "label or shortId too long")
		}
		list, err := c.srv.cfg.Sessions.List(ctx)
		if err != nil {
			return nil, errf(CodeUnavailable, err.Error())
		}
		var hits []sessions.Session
		for _, s := range list {
			if s.ArchivedAt != nil || (p.AgentID != "" && s.Agent != p.AgentID) {
				continue
			}
			if (p.Label != "" && s.Title == p.Label) || (p.ShortID != "" && len(p.ShortID) >= 6 && strings.HasPrefix(strings.TrimPrefix(s.ID, "ses_"), strings.TrimPrefix(p.ShortID, "ses_"))) {
				hits = append(hits, s)
			}
		}
		switch len(hits) {
		case 0:
			return missing()
		case 1:
			out := found(hits[0])
			out["ok"] = true
			return out, nil
		}
		cands := []map[string]any{}
		for _, s := range hits[:min(len(hits), maxResolveCandidates)] {
			cands = append(cands, found(s))
		}
		return map[string]any{"ok": false, "candidates": cands}, nil
	}
	return nil, errf(CodeInvalidRequest, "sessions.resolve needs key, sessionId, label or shortId")
}

type sessionsSendParams struct {
	Key            string `json:"key"`
	AgentID        string `json:"agentId"`
	Message        string `json:"message"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// sessionsSend is chat.send by session key (what the Control UI sends a new session's first
// message with, once its placement is active); without an idempotency key the request's own id
// stands for one.
func (c *conn) sessionsSend(f inFrame) (any, *errorShape) {
	var p sessionsSendParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.Key == "" {
		return nil, errf(CodeInvalidRequest, "sessions.send needs key")
	}
	if p.IdempotencyKey == "" {
		p.IdempotencyKey = "sessions.send:" + c.connID + ":" + truncate(f.ID, 128)
	}
	params, _ := json.Marshal(sendParams{SessionKey: p.Key, Message: p.Message, IdempotencyKey: p.IdempotencyKey, AgentID: p.AgentID})
	return c.chatSend(inFrame{Type: f.Type, ID: f.ID, Method: "chat.send", Params: params})
}
