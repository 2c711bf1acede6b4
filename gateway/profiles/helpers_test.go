package profiles_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/providers"
)

// newStore is a profile store over reg on a fresh gateway database (closed when t ends).
func newStore(t *testing.T, reg providers.Registry) *profiles.Store {
	t.Helper()
	db := storetest.Open(t)
	return profiles.New(db, reg, nil)
}

// parseFirst is the first profile of a profiles: YAML document.
func parseFirst(t *testing.T, doc string) providers.Profile {
	t.Helper()
	ps, err := profiles.ParseYAML(strings.NewReader(doc))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return ps[0]
}

// putAndGet stores p in s and reads it back.
func putAndGet(t *testing.T, s *profiles.Store, p providers.Profile) providers.Profile {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Put(ctx, &p); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// wantField checks that Validate of profile "a" (provider fake) with the extra YAML extra names
// field, or with field "" accepts it.
func wantField(t *testing.T, extra, field string) {
	t.Helper()
	p := parseFirst(t, "profiles:\n  - id: a\n    provider: fake\n    "+extra+"\n")
	err := p.Validate()
	var fe *providers.FieldError
	switch {
	case field == "" && err != nil:
		t.Errorf("%s: %v", extra, err)
	case field != "" && (!errors.As(err, &fe) || fe.Field != field):
		t.Errorf("%s: error %v, want one naming %s", extra, err, field)
	}
}
