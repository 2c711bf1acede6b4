package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

func (s *Server) listProfiles(c echo.Context) error {
	ps, err := s.cfg.Profiles.List(c.Request().Context())
	if err != nil {
		return err
	}
	page, err := paging.Page(c.Request(), c.Response().Header(), ps,
		func(p providers.Profile) paging.Key { return paging.Key{ID: p.ID} }, paging.Ascending)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (s *Server) getProfile(c echo.Context) error {
	p, err := s.cfg.Profiles.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	if strings.HasPrefix(c.Request().Header.Get("Accept"), yamlType) {
		b, err := profileYAML(p)
		if err != nil {
			return err
		}
		return c.Blob(http.StatusOK, yamlType+"; charset=utf-8", b)
	}
	return c.JSON(http.StatusOK, p)
}

// yamlType is the media type of a profile written as YAML (the Control UI's editor).
const yamlType = "application/yaml"

// profileYAML writes a profile as the YAML document PUT /profiles/:id takes back (without the
// warnings, which are not stored).
func profileYAML(p providers.Profile) ([]byte, error) {
	p.Warnings = nil
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var generic yaml.Node
	if err := yaml.Unmarshal(b, &generic); err != nil {
		return nil, err
	}
	// JSON is YAML in flow style; write it back in block style.
	var clear func(n *yaml.Node)
	clear = func(n *yaml.Node) {
		n.Style = 0
		for _, c := range n.Content {
			clear(c)
		}
	}
	clear(&generic)
	return yaml.Marshal(&generic)
}

// bindProfile decodes a profile from JSON or, with Content-Type application/yaml, from one YAML
// document: the YAML is turned into JSON first so that both name a bad field the same way.
func bindProfile(c echo.Context, p *providers.Profile) error {
	if !strings.HasPrefix(c.Request().Header.Get("Content-Type"), yamlType) {
		return bind(c, p)
	}
	var doc any
	dec := yaml.NewDecoder(c.Request().Body)
	if err := dec.Decode(&doc); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return apiErr(http.StatusBadRequest, "invalid-body", "the profile YAML is empty")
		}
		return apiErr(http.StatusBadRequest, "invalid-body", "invalid YAML: %v", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return apiErr(http.StatusBadRequest, "invalid-body", "the profile YAML must be a mapping (id: …, provider: …)")
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return apiErr(http.StatusBadRequest, "invalid-body", "the profile YAML has a value JSON cannot hold: %v", err)
	}
	c.Request().Body = io.NopCloser(bytes.NewReader(b))
	return bind(c, p)
}

func (s *Server) createProfile(c echo.Context) error {
	var p providers.Profile
	if err := bindProfile(c, &p); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.cfg.Profiles.Get(ctx, p.ID); err == nil {
		return apiErr(http.StatusConflict, "exists", "profile %q already exists (use PUT /api/v1/profiles/%s to replace it)", p.ID, p.ID)
	}
	if _, err := s.cfg.Profiles.Put(ctx, &p); err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, p)
}

func (s *Server) putProfile(c echo.Context) error {
	var p providers.Profile
	if err := bindProfile(c, &p); err != nil {
		return err
	}
	if p.ID == "" {
		p.ID = c.Param("id")
	}
	if p.ID != c.Param("id") {
		return providers.Fieldf("id", "%q does not match the URL (%q)", p.ID, c.Param("id"))
	}
	created, err := s.cfg.Profiles.Put(c.Request().Context(), &p)
	if err != nil {
		return err
	}
	return createdJSON(c, created, p)
}

// createdJSON answers v with 201 Created when the request created it, else 200 OK (it was there).
func createdJSON(c echo.Context, created bool, v any) error {
	if created {
		return c.JSON(http.StatusCreated, v)
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Server) deleteProfile(c echo.Context) error {
	if err := s.cfg.Profiles.Delete(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type createEnvRequest struct {
	ProfileID      string `json:"profileId"`
	IdempotencyKey string `json:"idempotencyKey"`
}

func (s *Server) createEnv(c echo.Context) error {
	var req createEnvRequest
	if err := bind(c, &req); err != nil {
		return err
	}
	if req.ProfileID == "" {
		return providers.Fieldf("profileId", "is required")
	}
	if len(req.IdempotencyKey) > 200 {
		return providers.Fieldf("idempotencyKey", "must be at most 200 characters")
	}
	if _, err := s.cfg.Profiles.Get(c.Request().Context(), req.ProfileID); errors.Is(err, store.ErrNotFound) {
		return providers.Fieldf("profileId", "no profile %q (see `openclaw profile list`)", req.ProfileID)
	}
	env, created, err := s.cfg.Envs.Create(c.Request().Context(), req.ProfileID, req.IdempotencyKey)
	if err != nil {
		return err
	}
	return createdJSON(c, created, env)
}

func (s *Server) listEnvs(c echo.Context) error {
	all, _ := strconv.ParseBool(c.QueryParam("all"))
	list, err := s.cfg.Envs.List(c.Request().Context(), all)
	if err != nil {
		return err
	}
	// newest created first
	list, err = paging.Page(c.Request(), c.Response().Header(), list,
		func(e envs.Environment) paging.Key { return paging.Key{Sort: store.FormatTime(e.CreatedAt), ID: e.ID} }, paging.Descending)
	if err != nil {
		return err
	}
	for i := range list {
		s.served(c.Request().Context(), &list[i])
	}
	return c.JSON(http.StatusOK, list)
}

// served fills in the sessions an environment serves.
func (s *Server) served(ctx context.Context, e *envs.Environment) {
	if s.cfg.Served != nil {
		if ids := s.cfg.Served(ctx, e.ID); len(ids) > 0 {
			e.AttachedSessionIDs = ids
		}
	}
}

func (s *Server) getEnv(c echo.Context) error {
	e, err := s.cfg.Envs.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	s.served(c.Request().Context(), &e)
	out := EnvironmentView{Environment: e}
	if s.cfg.WorkerInfo != nil {
		w := s.cfg.WorkerInfo(e.ID)
		out.Inference, out.Shedding = &w.Inference, w.Shedding
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) envEvents(c echo.Context) error {
	evs, err := s.cfg.Envs.Events(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	// oldest first, by id
	evs, err = paging.Page(c.Request(), c.Response().Header(), evs,
		func(e envs.Event) paging.Key { return paging.Key{ID: fmt.Sprintf("%020d", e.ID)} }, paging.Ascending)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, evs)
}

// envTimeline answers the environment's timeline: its provisioning attempts, bootstrap and
// setup steps (name, start, duration, result, output tail).
func (s *Server) envTimeline(c echo.Context) error {
	steps, err := s.cfg.Envs.Timeline(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, steps)
}

// destroyEnv starts teardown and waits up to ?wait= (default 0) for proof of it: 200 with the
// destroyed environment, or 202 while the gateway keeps retrying in the background.
func (s *Server) destroyEnv(c echo.Context) error {
	force, _ := strconv.ParseBool(c.QueryParam("force"))
	wait := time.Duration(0)
	if w := c.QueryParam("wait"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d < 0 || d > 10*time.Minute {
			return providers.Fieldf("wait", "must be a duration up to 10m, got %q", w)
		}
		wait = d
	}
	ctx := c.Request().Context()
	e, err := s.cfg.Envs.RequestDestroy(ctx, c.Param("id"), force)
	if err != nil {
		return err
	}
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		if got, err := s.cfg.Envs.WaitFor(wctx, e.ID, func(e envs.Environment) bool { return e.State == envs.Destroyed }); err == nil || got.ID != "" {
			e = got
		}
	}
	if e.State == envs.Destroyed {
		return c.JSON(http.StatusOK, e)
	}
	return c.JSON(http.StatusAccepted, e)
}

func (s *Server) sweep(c echo.Context) error {
	rep, err := s.cfg.Envs.Sweep(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// ApplyProfilesRequest is the body of POST /profiles/apply: profiles to create or replace
// together. Every one is validated before any is written; with DryRun none is.
type ApplyProfilesRequest struct {
	Profiles []providers.Profile `json:"profiles"`
	DryRun   bool                `json:"dryRun,omitempty"`
}

// AppliedProfile is what POST /profiles/apply did (or, dry, would do) to one profile:
// created, updated or unchanged.
type AppliedProfile struct {
	Profile providers.Profile `json:"profile"`
	Action  string            `json:"action"`
}

func (s *Server) applyProfiles(c echo.Context) error {
	var req ApplyProfilesRequest
	if err := bind(c, &req); err != nil {
		return err
	}
	if len(req.Profiles) == 0 {
		return providers.Fieldf("profiles", "is empty")
	}
	ctx := c.Request().Context()
	out := make([]AppliedProfile, len(req.Profiles))
	seen := map[string]bool{}
	for i := range req.Profiles {
		p := &req.Profiles[i]
		if err := s.cfg.Profiles.Prepare(p); err != nil {
			var fe *providers.FieldError
			if errors.As(err, &fe) {
				return &providers.FieldError{Field: fmt.Sprintf("profiles[%d].%s", i, fe.Field), Message: fe.Message}
			}
			return err
		}
		if seen[p.ID] {
			return providers.Fieldf(fmt.Sprintf("profiles[%d].id", i), "duplicate id %q", p.ID)
		}
		seen[p.ID] = true
		out[i] = AppliedProfile{Profile: *p, Action: "created"}
		old, err := s.cfg.Profiles.Get(ctx, p.ID)
		switch {
		case err == nil && sameProfile(old, *p):
			out[i].Action = "unchanged"
		case err == nil:
			out[i].Action = "updated"
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
	}
	if !req.DryRun {
		for i := range req.Profiles {
			if out[i].Action == "unchanged" {
				continue
			}
			if _, err := s.cfg.Profiles.Put(ctx, &req.Profiles[i]); err != nil {
				return fmt.Errorf("profiles[%d] (%s): %w", i, req.Profiles[i].ID, err)
			}
		}
	}
	return c.JSON(http.StatusOK, out)
}

// sameProfile compares two profiles by their JSON form (settings canonicalised, warnings aside).
func sameProfile(a, b providers.Profile) bool {
	canon := func(p providers.Profile) string {
		p.Warnings = nil
		var settings any
		if len(p.Settings) > 0 && json.Unmarshal(p.Settings, &settings) == nil {
			p.Settings, _ = json.Marshal(settings)
		}
		if len(p.Hygiene) == 0 {
			p.Hygiene = nil
		}
		if len(p.Sync.Include) == 0 {
			p.Sync.Include = nil
		}
		if len(p.Sync.Exclude) == 0 {
			p.Sync.Exclude = nil
		}
		b, _ := json.Marshal(p)
		return string(b)
	}
	return canon(a) == canon(b)
}
