// Package mirror brings a box's plain-mode workspace back into its anchor: a manifest diff against
// the base, with drift detection and a deletion brake.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// DefaultMaxDeleteShare is the share of the base's files a sync may delete without Force.
const DefaultMaxDeleteShare = 0.5

// FetchFunc fetches the files of plan from the box and applies them below root with opts (for
// example stream.Remote.Pack bound to the box directory).
type FetchFunc func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error)

// Config configures one inbound mirror.
type Config struct {
	// Anchor is the gateway-owned directory the workspace comes back to.
	Anchor string
	// Base is the immutable base manifest recorded when the workspace was sent out.
	Base *manifest.Manifest
	// Box is the box's manifest (decoded with manifest.Decode).
	Box *manifest.Manifest
	// Mode and the Exclude and Include rules are those the base was built with.
	Mode             manifest.Mode
	Exclude, Include []string
	Fetch            FetchFunc
	// MaxDeleteShare (0..1] of the base's files may be deleted without Force; default 0.5.
	MaxDeleteShare float64
	Force          bool
	Limits         stream.Limits
	// Space, when set, keeps free space on the anchor's filesystem and those it names
	// (stream.ApplyOptions.Space).
	Space *stream.SpaceCheck
	Cache *manifest.Cache
	// Inspect, when set, sees what the box sent, staged and verified, before it is committed
	// (stream.ApplyOptions.Inspect): an error leaves the anchor untouched.
	Inspect func(staging string, plan *stream.Plan) error
}

// DriftError reports that the anchor no longer matches the base manifest; nothing was changed.
type DriftError struct{ Paths []string }

func (e *DriftError) Error() string {
	shown := e.Paths
	if len(shown) > 20 {
		shown = shown[:20]
	}
	quoted := make([]string, len(shown))
	for i, p := range shown {
		quoted[i] = strconv.Quote(p)
	}
	return fmt.Sprintf("anchor drifted from the base manifest (%d paths: %s); nothing was changed",
		len(e.Paths), strings.Join(quoted, ", "))
}

// TooManyDeletesError stops a sync that would delete more than the allowed share; rerun with Force.
type TooManyDeletesError struct {
	Deletes, Files int
	Max            float64
}

func (e *TooManyDeletesError) Error() string {
	return fmt.Sprintf("the box deleted %d of %d files, more than %.0f%%; nothing was changed (use --force to apply)",
		e.Deletes, e.Files, e.Max*100)
}

// Result is what a mirror did.
type Result struct {
	Plan  stream.Plan
	Stats stream.Stats
}

// Drift lists the paths where anchor differs from base.
func Drift(ctx context.Context, anchor string, base *manifest.Manifest, opts manifest.Options) ([]string, error) {
	cur, _, err := manifest.Build(ctx, anchor, opts)
	if err != nil {
		return nil, fmt.Errorf("manifest of anchor: %w", err)
	}
	c := manifest.Diff(base, cur)
	var paths []string
	for _, l := range [][]manifest.Entry{c.Added, c.Changed, c.Deleted} {
		paths = append(paths, manifest.Paths(l)...)
	}
	return paths, nil
}

// Filter drops the entries of m that the rules exclude (a box may hold files the base never had,
// such as build output a profile excludes).
func Filter(m *manifest.Manifest, exclude, include []string) *manifest.Manifest {
	ex, in := manifest.ParseRules(exclude), manifest.ParseRules(include)
	out := &manifest.Manifest{Version: m.Version, BaseCommit: m.BaseCommit}
	for _, e := range m.Entries {
		if ex.Match(e.Path, e.Type == manifest.TypeDir) && !in.Match(e.Path, e.Type == manifest.TypeDir) {
			continue
		}
		out.Entries = append(out.Entries, e)
	}
	return out
}

// CheckDeletes applies the deletion brake to a plan against base.
func CheckDeletes(plan stream.Plan, base *manifest.Manifest, maxShare float64, force bool) error {
	if maxShare <= 0 {
		maxShare = DefaultMaxDeleteShare
	}
	files := base.Files()
	idx := base.Index()
	del := 0
	for _, d := range plan.Deletes {
		if e, ok := idx[d]; ok && e.Type != manifest.TypeDir {
			del++
		}
	}
	if !force && files > 0 && float64(del)/float64(files) > maxShare {
		return &TooManyDeletesError{Deletes: del, Files: files, Max: maxShare}
	}
	return nil
}

// Pull mirrors the box into the anchor. It stops with *DriftError when the anchor drifted from
// the base, and with *TooManyDeletesError when the deletion brake trips; an archive that fails any
// check is refused by stream.Apply. In all these cases the anchor is left untouched.
func Pull(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Anchor == "" || cfg.Base == nil || cfg.Box == nil || cfg.Fetch == nil {
		return Result{}, errors.New("mirror: anchor, base, box manifest and fetch are required")
	}
	drift, err := Drift(ctx, cfg.Anchor, cfg.Base, manifest.Options{Mode: cfg.Mode, Exclude: cfg.Exclude, Include: cfg.Include, Cache: cfg.Cache})
	if err != nil {
		return Result{}, err
	}
	if len(drift) > 0 {
		return Result{}, &DriftError{Paths: drift}
	}
	plan := stream.PlanFor(cfg.Base, Filter(cfg.Box, cfg.Exclude, cfg.Include))
	res := Result{Plan: plan}
	// Refuse what the box asks for before fetching anything (stream.Apply checks again).
	if err := stream.ValidatePlan(&plan, cfg.Limits, false); err != nil {
		return res, err
	}
	if err := CheckDeletes(plan, cfg.Base, cfg.MaxDeleteShare, cfg.Force); err != nil {
		return res, err
	}
	if plan.Empty() {
		return res, nil
	}
	st, err := cfg.Fetch(ctx, plan, cfg.Anchor, stream.ApplyOptions{Limits: cfg.Limits, Space: cfg.Space, Fsync: true, Inspect: cfg.Inspect})
	res.Stats = st
	if err != nil {
		return res, fmt.Errorf("mirror into %s: %w", cfg.Anchor, err)
	}
	return res, nil
}
