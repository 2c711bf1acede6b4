package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Every route that creates something refuses bad input with a 400 that names the field, before
// anything is written: no environment leased, no profile, credential, session, placement or turn.
func TestCreateRoutesRefuseBadInputBeforeWriting(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), "")
	ws := filepath.Join(root, "ws")
	userWorkspace(t, ws, false)
	sid := g.newSession(ws, "")

	// rows counts what the routes under test could have written.
	rows := func() map[string]int {
		t.Helper()
		out := map[string]int{}
		for name, path := range map[string]string{
			"environments": "/api/v1/environments?all=true", "profiles": "/api/v1/profiles",
			"credentials": "/api/v1/credentials", "sessions": "/api/v1/sessions",
			"placements": "/api/v1/placements", "turns": "/api/v1/sessions/" + sid + "/turns",
		} {
			var list []json.RawMessage
			if _, err := g.do("GET", path, nil, &list); err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			out[name] = len(list)
		}
		return out
	}
	before := rows()
	cases := []struct {
		method, path, body, field string
	}{
		{"POST", "/api/v1/environments", `{"profileId":"nope"}`, "profileId"},
		{"POST", "/api/v1/environments", `{}`, "profileId"},
		{"POST", "/api/v1/environments", `{"profileId":"local","colour":1}`, "colour"},
		{"POST", "/api/v1/environments", `["local"]`, "body"},
		{"POST", "/api/v1/profiles", `{"id":"x","provider":"nope"}`, "provider"},
		{"POST", "/api/v1/profiles/apply", `{"profiles":[{"id":"fine","provider":"local"},{"id":"Bad ID","provider":"local"}]}`, "profiles[1].id"},
		{"POST", "/api/v1/profiles/apply", `[{"id":"fine","provider":"local"}]`, "body"},
		{"PUT", "/api/v1/credentials/bad%20name", `{"value":"x"}`, "name"},
		{"PUT", "/api/v1/credentials/good", `{"value":""}`, "value"},
		{"PUT", "/api/v1/credentials/good", `{"value":"x","extra":1}`, "extra"},
		{"PUT", "/api/v1/credentials/good", `{"value":7}`, "value"},
		{"POST", "/api/v1/sessions", `{"title":"t","workspace":"` + ws + `","bogus":1}`, "bogus"},
		{"POST", "/api/v1/sessions", `{"title":"t","workspace":"` + ws + `","target":{"kind":"profile","profileId":"nope"}}`, "target.profileId"},
		{"POST", "/api/v1/sessions/" + sid + "/dispatch", `{"profileId":"nope"}`, "profileId"},
		{"POST", "/api/v1/sessions/" + sid + "/dispatch", `{"profileId":"local","bogus":1}`, "bogus"},
		{"POST", "/api/v1/sessions/" + sid + "/dispatch", `{"profileId":"local","machineClass":"huge"}`, "machineClass"},
		{"POST", "/api/v1/sessions/" + sid + "/dispatch", `not json`, "body"},
		{"POST", "/api/v1/sessions/" + sid + "/dispatch", ``, "body"},
		{"POST", "/api/v1/sessions/" + sid + "/messages", `{"text":"hi","bogus":1}`, "bogus"},
		{"POST", "/api/v1/sessions/" + sid + "/messages", `{"text":""}`, "text"},
		{"POST", "/api/v1/sessions/" + sid + "/move", `{"to":"box"}`, "to"},
		{"POST", "/api/v1/sessions/" + sid + "/pullback", `{"force":"yes"}`, "force"},
		{"POST", "/api/v1/agents/spawn", `{}`, "task"},
		{"POST", "/api/v1/agents/spawn", `{"task":"x","dir":"` + ws + `"}`, "profile"},
		{"POST", "/api/v1/agents/spawn", `{"task":"x","dir":"` + ws + `","profile":"nope"}`, "profile"},
		{"POST", "/api/v1/agents/spawn", `{"task":"x","dir":"` + ws + `","profile":"local","bogus":1}`, "bogus"},
		{"POST", "/api/v1/agents/" + sid + "/send", `{"message":"x","bogus":1}`, "bogus"},
		{"POST", "/api/v1/models/probe", `{"model":"x/y"}`, "model"},
		{"POST", "/api/v1/models/probe", `{"modl":"x/y"}`, "body"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s %s %s", c.method, strings.TrimPrefix(c.path, "/api/v1"), c.body), func(t *testing.T) {
			req, _ := http.NewRequestWithContext(g.ctx(), c.method, "http://"+g.addr+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+g.client.Token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb struct {
				Error struct{ Code, Message, Field string } `json:"error"`
			}
			_ = json.Unmarshal(b, &eb)
			if resp.StatusCode != http.StatusBadRequest || eb.Error.Code != "invalid-field" || eb.Error.Field != c.field {
				t.Errorf("got %d %s, want 400 invalid-field naming %s", resp.StatusCode, b, c.field)
			}
			if after := rows(); !reflect.DeepEqual(after, before) {
				t.Errorf("rows written by a refused request: before %v, after %v", before, after)
			}
		})
	}
}
