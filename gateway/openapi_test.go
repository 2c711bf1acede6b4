package gateway

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// startInProcess runs the real gateway in this process on a loopback port and returns its API
// server (for its router), its address and its token.
func startInProcess(t *testing.T) (*api.Server, string, string) {
	t.Helper()
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	srvc := make(chan *api.Server, 1)
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{DataDir: dataDir, Listen: "127.0.0.1:0"}, Deps{
			Providers: func(*store.DB, string, *slog.Logger) (providers.Registry, error) {
				return providers.Registry{"fake": fake.New()}, nil
			},
			OnAPI:   func(s *api.Server) { srvc <- s },
			OnReady: func(addr string) { addrc <- addr },
			Log:     slog.New(slog.DiscardHandler),
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway run: %v", err)
		}
	})
	wctx := testenv.Context(t, 30*time.Second)
	var srv *api.Server
	var addr string
	for srv == nil || addr == "" {
		select {
		case srv = <-srvc:
		case addr = <-addrc:
		case err := <-done:
			t.Fatalf("gateway stopped: %v", err)
		case <-wctx.Done():
			t.Fatal("gateway did not start")
		}
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	return srv, addr, strings.TrimSpace(string(tok))
}

// undocumentedOK are the routes outside the OpenAPI document: /mcp is the MCP protocol over
// streamable HTTP (docs/agents.md), /* the Control UI's pages and assets, /api/v1/* the JSON 404
// of unknown API paths, /occ/v1 its own API.
func undocumentedOK(r *echo.Route) bool {
	return r.Path == "/mcp" || r.Path == "/*" || r.Path == "/api/v1/*" || r.Method == echo.RouteNotFound ||
		strings.HasPrefix(r.Path, "/occ/v1") || r.Path == "/api/v1" && r.Method == echo.RouteNotFound
}

// TestOpenAPIDocumentsEveryRoute walks the gateway's router: every route (but the ones
// undocumentedOK names) and every query parameter its handler reads must be in api.Operations, and
// every documented route must be served.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	srv, addr, token := startInProcess(t)
	docs := map[string]api.Operation{}
	for _, op := range api.Operations {
		k := op.Method + " " + op.Path
		if _, dup := docs[k]; dup {
			t.Errorf("api.Operations lists %s twice", k)
		}
		docs[k] = op
	}
	src := newSourceIndex(t, "..")
	served := map[string]bool{}
	routes := srv.Echo.Routes()
	sort.Slice(routes, func(i, j int) bool { return routes[i].Path+routes[i].Method < routes[j].Path+routes[j].Method })
	for _, r := range routes {
		if undocumentedOK(r) {
			continue
		}
		k := r.Method + " " + r.Path
		served[k] = true
		op, ok := docs[k]
		if !ok {
			t.Errorf("route %s (handler %s) is not in the OpenAPI document: add to api.Operations in gateway/api/openapi.go\n\t{Method: %q, Path: %q, Summary: \"…\", Body: <request type or nil>, Status: 200, Response: <response type>},",
				k, r.Name, r.Method, r.Path)
			continue
		}
		read, resolved := src.queryParams(r)
		var listed []string
		for _, q := range op.Query {
			listed = append(listed, q.Name)
		}
		for _, q := range read {
			if !slices.Contains(listed, q) {
				t.Errorf("route %s reads query parameter %q, which its entry in api.Operations (gateway/api/openapi.go) does not list: add\n\tQuery: []Param{{%q, \"string|integer|boolean\", \"…\"}},", k, q, q)
			}
		}
		if resolved {
			for _, q := range listed {
				if !slices.Contains(read, q) {
					t.Errorf("route %s: api.Operations lists query parameter %q, which its handler never reads: remove it from gateway/api/openapi.go", k, q)
				}
			}
		}
	}
	for k := range docs {
		if !served[k] {
			t.Errorf("api.Operations documents %s, which the gateway does not serve: remove it from gateway/api/openapi.go (or fix its method/path)", k)
		}
	}

	// The document is served, and holds every operation.
	get := func(tok string) (int, []byte) {
		req, _ := http.NewRequestWithContext(testenv.Context(t, 10*time.Second), "GET", "http://"+addr+"/api/v1/openapi.json", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("GET /api/v1/openapi.json without the token: %d, want 401", code)
	}
	code, body := get(token)
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Params []struct{ Name, In string } `json:"parameters"`
		} `json:"paths"`
		Comps struct{ Schemas map[string]json.RawMessage } `json:"components"`
	}
	if err := json.Unmarshal(body, &doc); code != 200 || err != nil {
		t.Fatalf("GET /api/v1/openapi.json: %d %v %.200s", code, err, body)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi = %q, want 3.1.0", doc.OpenAPI)
	}
	for _, op := range api.Operations {
		p, ok := doc.Paths[api.OpenAPIPath(op.Path)][strings.ToLower(op.Method)]
		if !ok {
			t.Errorf("served document lacks %s %s", op.Method, op.Path)
			continue
		}
		for _, seg := range strings.Split(op.Path, "/") {
			if name, isParam := strings.CutPrefix(seg, ":"); isParam && !slices.ContainsFunc(p.Params, func(q struct{ Name, In string }) bool { return q.Name == name && q.In == "path" }) {
				t.Errorf("served document: %s %s lacks path parameter %s", op.Method, op.Path, name)
			}
		}
	}
	if _, ok := doc.Comps.Schemas["sessions_Session"]; !ok {
		t.Errorf("served document has no schema of sessions.Session; schemas: %d", len(doc.Comps.Schemas))
	}
}

// sourceIndex finds a route's handler in the module's source and the query parameters it reads.
type sourceIndex struct {
	t    *testing.T
	root string
	pkgs map[string][]*ast.File
}

func newSourceIndex(t *testing.T, root string) *sourceIndex {
	return &sourceIndex{t: t, root: root, pkgs: map[string][]*ast.File{}}
}

const modulePath = "github.com/openclaw/cloudworkers/"

func (s *sourceIndex) files(pkg string) []*ast.File {
	if fs, ok := s.pkgs[pkg]; ok {
		return fs
	}
	dir := filepath.Join(s.root, strings.TrimPrefix(pkg, modulePath))
	matches, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	var fs []*ast.File
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), m, nil, 0)
		if err != nil {
			s.t.Fatalf("parse %s: %v", m, err)
		}
		fs = append(fs, f)
	}
	s.pkgs[pkg] = fs
	return fs
}

// queryParams returns the query parameters r's handler reads (following calls to functions and
// methods of its package), and whether the handler was found.
func (s *sourceIndex) queryParams(r *echo.Route) ([]string, bool) {
	// r.Name is the handler's function name: <import path>.<func>[.funcN] or .(*T).m-fm
	slash := strings.LastIndex(r.Name, "/")
	dot := strings.Index(r.Name[slash+1:], ".")
	if slash < 0 || dot < 0 || !strings.HasPrefix(r.Name, modulePath) {
		return nil, false
	}
	files := s.files(r.Name[:slash+1+dot])
	var handler ast.Node
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != r.Method {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			p, _ := strconv.Unquote(lit.Value)
			if !strings.HasPrefix(p, "/") || !strings.HasSuffix(r.Path, p) {
				return true
			}
			switch h := call.Args[1].(type) {
			case *ast.FuncLit:
				handler = h.Body
			case *ast.SelectorExpr:
				handler = s.decl(files, h.Sel.Name)
			case *ast.Ident:
				handler = s.decl(files, h.Name)
			}
			return true
		})
	}
	if handler == nil {
		return nil, false
	}
	seen := map[string]bool{}
	var params []string
	var walk func(n ast.Node)
	walk = func(n ast.Node) {
		ast.Inspect(n, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var callee string
			switch f := call.Fun.(type) {
			case *ast.Ident:
				callee = f.Name
			case *ast.SelectorExpr:
				callee = f.Sel.Name
				if name := queryName(call, f); name != "" && !slices.Contains(params, name) {
					params = append(params, name)
				}
			}
			if callee != "" && !seen[callee] {
				seen[callee] = true
				if d := s.decl(files, callee); d != nil {
					walk(d)
				}
			}
			return true
		})
	}
	walk(handler)
	sort.Strings(params)
	return params, true
}

// queryName is the parameter of c.QueryParam("x"), r.URL.Query().Get("x") or .Has("x").
func queryName(call *ast.CallExpr, f *ast.SelectorExpr) string {
	if len(call.Args) != 1 {
		return ""
	}
	lit, ok := call.Args[0].(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	name, _ := strconv.Unquote(lit.Value)
	switch f.Sel.Name {
	case "QueryParam":
		return name
	case "Get", "Has":
		if inner, ok := f.X.(*ast.CallExpr); ok {
			if s, ok := inner.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "Query" || s.Sel.Name == "QueryParams") {
				return name
			}
		}
	}
	return ""
}

// decl is the body of the package's function or method named name.
func (s *sourceIndex) decl(files []*ast.File, name string) ast.Node {
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == name && fd.Body != nil {
				return fd.Body
			}
		}
	}
	return nil
}
