package inference_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/credentials/credentialstest"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
)

func TestAPINeverReturnsCredentialValues(t *testing.T) {
	ctx := inferencetest.Context(t)
	dir := t.TempDir()
	creds, _ := credentialstest.Open(t, dir)
	cat, err := inference.NewCatalog(parse(t, exampleYAML), creds, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	inference.RegisterAPI(e.Group("/api/v1"), cat, creds)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	const secret = "sk-ant-api03-VERY-secret-value"
	var bodies []string
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, string(b))
		return resp.StatusCode, string(b)
	}
	if code, _ := do(http.MethodPut, "/api/v1/credentials/anthropic", `{"value":"`+secret+`\n"}`); code != http.StatusOK {
		t.Fatalf("PUT: %d", code)
	}
	if got, _ := creds.Get(ctx, "anthropic"); got != secret {
		t.Fatalf("stored %q", got)
	}
	if code, _ := do(http.MethodPut, "/api/v1/credentials/bad%20name", `{"value":"`+secret+`"}`); code < 400 {
		t.Fatalf("bad name accepted: %d", code)
	}
	if code, _ := do(http.MethodPut, "/api/v1/credentials/x", `{"value":"`+secret+`", "extra": 1}`); code < 400 {
		t.Fatalf("unknown field accepted: %d", code)
	}
	code, body := do(http.MethodGet, "/api/v1/credentials", "")
	var list []inference.CredentialInfo
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list) != 1 || list[0].Name != "anthropic" || list[0].UsedBy[0] != "anthropic" {
		t.Fatalf("list: %d %s", code, body)
	}
	code, body = do(http.MethodGet, "/api/v1/models", "")
	var models inference.ModelsResponse
	if err := json.Unmarshal([]byte(body), &models); code != 200 || err != nil || models.Default != "anthropic/claude-sonnet-4-5" || len(models.Models) != 3 {
		t.Fatalf("models: %d %s", code, body)
	}
	if strings.Contains(body, `"script"`) || strings.Contains(body, "X-") {
		t.Errorf("models listing shows internal fields: %s", body)
	}
	if code, _ := do(http.MethodDelete, "/api/v1/credentials/anthropic", ""); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if code, _ := do(http.MethodDelete, "/api/v1/credentials/anthropic", ""); code < 400 {
		t.Fatalf("second DELETE: %d", code)
	}
	for _, b := range bodies {
		if strings.Contains(b, secret) {
			t.Errorf("response contains the value: %s", b)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s contains the value", filepath.Base(f))
		}
	}
}
