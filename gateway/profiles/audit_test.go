package profiles_test

import (
	"context"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// TestAuditRowsAreDatedByTheStoresClock: the audit row of a profile change is dated by the
// clock the store was given, as the profile's own row is, not by the machine's: a gateway (or a
// test) on another clock shows one time for both.
func TestAuditRowsAreDatedByTheStoresClock(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	s := profiles.New(db, providers.Registry{"fake": fake.New()}, nil)
	at := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	s.Clock = clock.NewManual(at)
	if _, err := s.Put(ctx, &providers.Profile{ID: "p", Provider: "fake"}); err != nil {
		t.Fatal(err)
	}
	rows, err := db.ListAudit(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Kind != "profile.create" || rows[0].At != store.FormatTime(at) {
		t.Fatalf("audit rows %+v, want one profile.create at %s", rows, store.FormatTime(at))
	}
}
