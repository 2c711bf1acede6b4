package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// recorder is a gateway stand-in that records the escaped path and query of each request and
// answers with a fixed status and body.
func recorder(t *testing.T, status int, body string) (*Client, *[]string) {
	t.Helper()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return NewClient(srv.URL, "t"), &got
}

// TestClientEscapesIDs: an id is one path segment, whatever it holds; a hostile id such as
// "../audit" or "x?all=true" never reaches another route or adds a query.
func TestClientEscapesIDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	c, got := recorder(t, http.StatusOK, `null`)
	calls := []struct {
		call func() error
		want string
	}{
		{func() error { _, err := c.Profile(ctx, "../audit"); return err }, "GET /api/v1/profiles/..%2Faudit?"},
		{func() error { _, err := c.Environment(ctx, "x?all=true"); return err }, "GET /api/v1/environments/x%3Fall=true?"},
		{func() error { return c.DeleteProfile(ctx, "a/b") }, "DELETE /api/v1/profiles/a%2Fb?"},
		{func() error { return c.SetCredential(ctx, "k#1", "v") }, "PUT /api/v1/credentials/k%231?"},
		{func() error { _, err := c.Audit(ctx, "env&x=1"); return err }, "GET /api/v1/audit?environmentId=env%26x%3D1&limit=1000"},
	}
	for i, k := range calls {
		if err := k.call(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if (*got)[i] != k.want {
			t.Errorf("call %d sent %q, want %q", i, (*got)[i], k.want)
		}
	}
}

// TestDestroyEnvironmentOptions: force and wait reach the gateway as the query it reads.
func TestDestroyEnvironmentOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	c, got := recorder(t, http.StatusAccepted, `{"id":"e1","state":"destroying"}`)
	e, err := c.DestroyEnvironment(ctx, "e1", DestroyOptions{Force: true, Wait: 90 * time.Second})
	if err != nil || e.ID != "e1" || e.State != "destroying" {
		t.Fatalf("destroy: %+v %v", e, err)
	}
	if _, err := c.DestroyEnvironment(ctx, "e1", DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"DELETE /api/v1/environments/e1?force=true&wait=1m30s", "DELETE /api/v1/environments/e1?"}
	for i := range want {
		if (*got)[i] != want[i] {
			t.Errorf("request %d: %q, want %q", i, (*got)[i], want[i])
		}
	}
}

// TestClientReturnsTheGatewaysError: a refusal comes back as *Error with its status, code and
// field, not as a decoded empty value.
func TestClientReturnsTheGatewaysError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	c, _ := recorder(t, http.StatusBadRequest, `{"error":{"code":"invalid-field","message":"profileId: is required","field":"profileId"}}`)
	_, err := c.CreateEnvironment(ctx, "", "")
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != "invalid-field" || ae.Field != "profileId" {
		t.Fatalf("error %#v, want the gateway's 400 naming profileId", err)
	}
}
