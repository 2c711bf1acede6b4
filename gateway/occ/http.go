// Package occ exposes the gateway as OCC's Compute side: the ComputeDriver and
// CredentialGatewayDriver contracts over HTTP under /occ/v1/, behind their own bearer token.
//
// # HTTP shape
//
//	GET  /occ/v1/compute                      the compute driver's Descriptor
//	POST /occ/v1/compute/{method}             one ComputeDriver method
//	GET  /occ/v1/credential-gateway           the credential gateway's Descriptor
//	POST /occ/v1/credential-gateway/{method}  one CredentialGatewayDriver method
//
// {method} is the TypeScript method name verbatim. A POST body is a JSON object whose keys are
// the method's parameter names ({"revision": …, "context": …}); for the credential gateway the
// context's fields are flattened into it ({"namespace", "source", "input"}). The 200 answer is
// the method's result as JSON ({} for void). Errors are {"error":{"code","message","retryable"}}:
// 400 invalid input (the field named), 401 a missing or wrong token, 404 an unknown method, 409 a
// permanent failure, 413 a body over the limit, 501 a method this driver does not implement, 503
// a retryable dependency failure.
//
// # Registering a driver
//
// A driver is a Descriptor and a map from method names to Methods. gateway.Run builds one Server
// and registers both sides on it before serving:
//
//	srv := occ.NewServer(occ.ServerConfig{DataDir: dataDir, Log: log, MaxBody: cfg.OCC.MaxRequestBytes})
//	srv.RegisterCompute(computeDriver)           // this package: NewCompute(...).Driver()
//	srv.RegisterCredentialGateway(credGWDriver)  // credgw.go: the credential gateway's Driver
//
// Register* may be called once per side; a side never registered answers 501 for its descriptor
// and every method. A Method receives the raw body (already checked to be a JSON object within
// the size bound) and decodes it with Bind; it returns an *Error for every failure OCC should see
// (any other error is logged and answered as a retryable 503 with a fixed message, so provider
// output never reaches OCC). Methods must be idempotent for the same inputs and safe across a
// gateway restart.
package occ

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"sync"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/internal/tokenfile"
)

// Method is one driver method: it gets the request body (a JSON object) and returns the result,
// marshalled as the 200 answer (nil means {}).
type Method func(ctx context.Context, body json.RawMessage) (any, error)

// Descriptor is what GET /occ/v1/{side} answers. Methods is filled by the server from the
// driver's method map (sorted).
type Descriptor struct {
	ID                    string   `json:"id"`
	Capability            string   `json:"capability"`
	Implementation        string   `json:"implementation"`
	Methods               []string `json:"methods"`
	ActivationOrder       string   `json:"activationOrder,omitempty"`
	MaintenanceIntervalMs int64    `json:"maintenanceIntervalMs,omitempty"`
	RuntimeLogging        string   `json:"runtimeLogging,omitempty"`
}

// Driver is one side's descriptor and methods.
type Driver struct {
	Descriptor Descriptor
	Methods    map[string]Method
}

// Capabilities of the two sides.
const (
	CapabilityCompute           = "compute"
	CapabilityCredentialGateway = "credential_gateway"
)

// TokenFile is the name of OCC's bearer token inside the data dir (separate from gateway.token,
// so OCC's access can be revoked alone).
const TokenFile = "occ.token"

// DefaultMaxRequestBytes bounds a request body unless occ.maxRequestBytes says otherwise.
const DefaultMaxRequestBytes = 1 << 20

// ServerConfig configures the HTTP adapter.
type ServerConfig struct {
	// DataDir holds occ.token; the token is read from it on every request, so a rotation takes
	// effect at once without a restart.
	DataDir string
	Log     *slog.Logger
	// MaxBody bounds a request body (0: DefaultMaxRequestBytes).
	MaxBody int64
}

// Server serves /occ/v1/.
type Server struct {
	cfg ServerConfig
	mux *http.ServeMux

	mu    sync.RWMutex
	sides map[string]*Driver // "compute", "credential-gateway"
}

// Path segments of the two sides.
const (
	sideCompute           = "compute"
	sideCredentialGateway = "credential-gateway"
)

// NewServer builds the adapter; register the drivers before serving.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxRequestBytes
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), sides: map[string]*Driver{}}
	for _, side := range []string{sideCompute, sideCredentialGateway} {
		s.mux.HandleFunc("GET /occ/v1/"+side, func(w http.ResponseWriter, r *http.Request) { s.describe(w, side) })
		s.mux.HandleFunc("POST /occ/v1/"+side+"/{method}", func(w http.ResponseWriter, r *http.Request) {
			s.call(w, r, side, r.PathValue("method"))
		})
	}
	s.mux.HandleFunc("/occ/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Status: http.StatusNotFound, Code: CodeUnknownMethod,
			Message: fmt.Sprintf("no OCC route %s %s", r.Method, r.URL.Path)})
	})
	return s
}

// RegisterCompute registers the ComputeDriver side.
func (s *Server) RegisterCompute(d Driver) { s.register(sideCompute, CapabilityCompute, d) }

// RegisterCredentialGateway registers the CredentialGatewayDriver side.
func (s *Server) RegisterCredentialGateway(d Driver) {
	s.register(sideCredentialGateway, CapabilityCredentialGateway, d)
}

func (s *Server) register(side, capability string, d Driver) {
	d.Descriptor.Capability = capability
	d.Descriptor.Methods = slices.Sorted(func(yield func(string) bool) {
		for name := range d.Methods {
			if !yield(name) {
				return
			}
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.sides[side]; dup {
		panic("occ: " + side + " registered twice")
	}
	s.sides[side] = &d
}

func (s *Server) side(name string) *Driver {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sides[name]
}

// ServeHTTP checks the bearer token and serves /occ/v1/.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="occ"`)
		writeError(w, &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized,
			Message: "missing or wrong bearer token (see <data-dir>/" + TokenFile + ")"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) authorized(r *http.Request) bool {
	tok, err := ReadToken(s.cfg.DataDir)
	if err != nil {
		s.cfg.Log.Warn("occ token unreadable", "err", err)
		return false
	}
	return auth.BearerIs(r, tok) // the scheme in any case: "bearer" is "Bearer"
}

func (s *Server) describe(w http.ResponseWriter, side string) {
	d := s.side(side)
	if d == nil {
		writeError(w, NotImplemented(side))
		return
	}
	writeJSON(w, http.StatusOK, d.Descriptor)
}

func (s *Server) call(w http.ResponseWriter, r *http.Request, side, method string) {
	d := s.side(side)
	if d == nil {
		writeError(w, NotImplemented(side))
		return
	}
	m, ok := d.Methods[method]
	if !ok {
		writeError(w, &Error{Status: http.StatusNotFound, Code: CodeUnknownMethod,
			Message: fmt.Sprintf("%s has no method %q", side, truncate(method, 64))})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeBodyTooLarge,
				Message: fmt.Sprintf("body: must be at most %d bytes (occ.maxRequestBytes)", s.cfg.MaxBody)})
			return
		}
		writeError(w, Invalid("body", "could not be read"))
		return
	}
	if e := checkObject(body); e != nil {
		writeError(w, e)
		return
	}
	res, err := m(r.Context(), body)
	if err != nil {
		e, raw := asError(err)
		if raw {
			s.cfg.Log.Warn("occ method failed", "side", side, "method", method, "err", err)
		}
		writeError(w, e)
		return
	}
	if res == nil {
		res = struct{}{}
	}
	writeJSON(w, http.StatusOK, res)
}

// checkObject requires body to be one JSON object.
func checkObject(body []byte) *Error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return Invalid("body", "must be a JSON object keyed by the method's parameter names")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Invalid("body", "must be exactly one JSON object")
	}
	return nil
}

func writeError(w http.ResponseWriter, e *Error) {
	writeJSON(w, e.Status, map[string]*Error{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"INTERNAL","message":"the result could not be encoded","retryable":false}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ReadToken returns OCC's bearer token from dir/occ.token.
func ReadToken(dir string) (string, error) {
	return tokenfile.Read(filepath.Join(dir, TokenFile), occTokenFix)
}

// occTokenFix is what an operator does about a broken occ.token.
const occTokenFix = "run openclaw occ token --rotate"

// EnsureToken returns OCC's bearer token, generating dir/occ.token (mode 0600) on first start
// and tightening its mode when it allows more.
func EnsureToken(dir string) (string, error) {
	return tokenfile.Ensure(filepath.Join(dir, TokenFile), "", occTokenFix)
}

// RotateToken writes a new token to dir/occ.token (0600) and returns it; the old one stops
// working at once, also for a running gateway.
func RotateToken(dir string) (string, error) {
	return tokenfile.New(filepath.Join(dir, TokenFile), "")
}
