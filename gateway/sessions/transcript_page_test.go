package sessions

import (
	"net/http"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

// GET /sessions/:id/transcript?limit=N[&before=ID] pages the newest entries (the Control UI's
// window); a bad limit or an unknown entry is named.
func TestTranscriptPages(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	base := newAPIServer(t, s)
	ses, _ := s.Create(ctx, CreateParams{})
	leaf := ""
	for i := range 5 {
		r, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: uint64(i + 1), BaseLeafID: leaf,
			Messages: []protocol.Message{userMsg(string(rune('a' + i)))}})
		if err != nil {
			t.Fatal(err)
		}
		leaf = r.NewLeafID
	}
	var all Transcript
	if code := doJSON(t, http.MethodGet, base+"/sessions/"+ses.ID+"/transcript", "", &all); code != 200 || len(all.Entries) != 5 {
		t.Fatalf("whole transcript: %d, %d entries", code, len(all.Entries))
	}
	var page TranscriptPage
	if code := doJSON(t, http.MethodGet, base+"/sessions/"+ses.ID+"/transcript?limit=2", "", &page); code != 200 ||
		len(page.Entries) != 2 || page.Entries[1].ID != all.Entries[4].ID || page.Offset != 3 || page.Total != 5 {
		t.Fatalf("newest 2: %d %+v", code, page)
	}
	page = TranscriptPage{}
	if code := doJSON(t, http.MethodGet, base+"/sessions/"+ses.ID+"/transcript?limit=2&before="+all.Entries[1].ID, "", &page); code != 200 ||
		len(page.Entries) != 1 || page.Entries[0].ID != all.Entries[0].ID || page.Offset != 0 {
		t.Fatalf("2 before the second: %d %+v", code, page)
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=x", "limit=10001", "before=" + all.Entries[1].ID, "limit=2&before=nope"} {
		var body struct {
			Error struct{ Code, Field, Message string } `json:"error"`
		}
		code := doJSON(t, http.MethodGet, base+"/sessions/"+ses.ID+"/transcript?"+q, "", &body)
		field := strings.SplitN(q, "=", 2)[0]
		if q == "limit=2&before=nope" {
			field = "before"
		}
		if code != http.StatusBadRequest || body.Error.Field != field {
			t.Fatalf("?%s: %d %+v, want 400 naming %s", q, code, body.Error, field)
		}
	}
}
