package mcp

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/internal/tokenfile"
)

// TokenFile is the MCP token's file in the gateway's data dir (mode 0600). The token opens /mcp
// and nothing else: it cannot reach /api/v1 (no profiles, credentials, audit or Control UI).
const TokenFile = "mcp.token"

// EnsureToken returns the MCP token of a data dir, generating it when missing or when rotate is
// set (the old token stops working at once).
func EnsureToken(dataDir string, rotate bool) (string, error) {
	if !rotate {
		tok, err := ReadToken(dataDir)
		if !errors.Is(err, os.ErrNotExist) {
			return tok, err
		}
	}
	return tokenfile.New(filepath.Join(dataDir, TokenFile), "ocmcp_")
}

// ReadToken reads the MCP token of a data dir; a missing file is os.ErrNotExist.
func ReadToken(dataDir string) (string, error) {
	return tokenfile.Read(filepath.Join(dataDir, TokenFile), "run `openclaw mcp token --rotate`")
}

// HTTPHandler serves the MCP server over streamable HTTP. A request must carry
// "Authorization: Bearer T" with T the operator's gateway token or the MCP token of dataDir
// (read at each request, so a rotated token takes effect at once).
func (s *Server) HTTPHandler(operatorToken, dataDir string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		SessionTimeout: s.cfg.SessionTimeout,
		Logger:         slog.New(demoteInfo{s.cfg.Log.Handler()}),
	})
	caps := s.caps
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r, operatorToken, dataDir) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="openclaw-mcp"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "unauthorized",
				"message": "missing or wrong bearer token: use the gateway token or the MCP token (`openclaw mcp token`)"}})
			return
		}
		// A tool call's reply streams for as long as the call runs (a dispatch can take many
		// minutes): lift the API server's read and write deadlines for this request.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		// Close ends every request in flight here (a client's standalone SSE stream stays open
		// otherwise, and would hold up the gateway's stop until its drain deadline).
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel)
		defer stop()
		caps.serve(w, r.WithContext(ctx), h)
	})
}

func (s *Server) authorized(r *http.Request, operatorToken, dataDir string) bool {
	got, ok := auth.Bearer(r) // the scheme in any case: "bearer" is "Bearer"
	if !ok || got == "" {
		return false
	}
	if operatorToken != "" && subtle.ConstantTimeCompare([]byte(got), []byte(operatorToken)) == 1 {
		return true
	}
	tok, err := ReadToken(dataDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.cfg.Log.Warn("MCP token", "err", err)
		}
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(tok)) == 1
}

// LoopbackURL is the URL at which this machine reaches a listener bound to addr: an unspecified
// address (0.0.0.0, ::) becomes the loopback address of its family.
func LoopbackURL(addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String()
	}
	ip := ta.IP
	switch {
	case ip == nil || ip.IsUnspecified() && ip.To4() != nil:
		ip = net.IPv4(127, 0, 0, 1)
	case ip.IsUnspecified():
		ip = net.IPv6loopback
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}
