package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/credentials/credentialstest"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
)

func TestCredentialAndModelsCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	creds, _ := credentialstest.Open(t, t.TempDir())
	cat, err := inference.NewCatalog(inference.CatalogConfig{}, creds, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	inference.RegisterAPI(e.Group("/api/v1"), cat, creds)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	var out bytes.Buffer
	oldOut, oldErr, oldIn := stdout, stderr, stdin
	stdout, stderr = &out, &out
	t.Cleanup(func() { stdout, stderr, stdin = oldOut, oldErr, oldIn })
	run := func(cmd *cobra.Command, args ...string) string {
		t.Helper()
		out.Reset()
		cmd.SetArgs(args)
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	g := func() *globals { return &globals{gateway: srv.URL, token: "t"} }

	const secret = "sk-from-stdin-123"
	stdin = strings.NewReader(secret + "\n")
	run(newCredentialCmd(g()), "set", "anthropic")
	t.Setenv("OC_TEST_KEY", "sk-from-env-456")
	run(newCredentialCmd(g()), "set", "openai", "--from-env", "OC_TEST_KEY")
	if v, _ := creds.Get(ctx, "anthropic"); v != secret {
		t.Fatalf("stdin value stored as %q", v)
	}
	if v, _ := creds.Get(ctx, "openai"); v != "sk-from-env-456" {
		t.Fatalf("env value stored as %q", v)
	}
	list := run(newCredentialCmd(g()), "list")
	if !strings.Contains(list, "anthropic") || !strings.Contains(list, "openai") || strings.Contains(list, "sk-") {
		t.Fatalf("list:\n%s", list)
	}
	run(newCredentialCmd(g()), "rm", "openai")
	if list := run(newCredentialCmd(g()), "list", "-o", "json"); strings.Contains(list, "openai") {
		t.Fatalf("after rm:\n%s", list)
	}
	if models := run(newModelsCmd(g()), "list"); !strings.Contains(models, "demo/demo (default)") || !strings.Contains(models, "scripted") {
		t.Fatalf("models list:\n%s", models)
	}
}
