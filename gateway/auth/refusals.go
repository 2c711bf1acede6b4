package auth

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
)

// Bounds of the refused-authentication log.
const (
	// RefusalWindow is how long the refusals from one source are counted together.
	RefusalWindow = time.Minute
	// MaxRefusalSources bounds the sources counted at once; past it, refusals from new sources
	// are counted together under OtherSources.
	MaxRefusalSources = 1024
	// OtherSources names the sources counted together past MaxRefusalSources.
	OtherSources = "other"
)

// Refusals is the one log of refused authentications of every door (the API, the Control UI's
// sign-in, /mcp and /occ/v1). The first refusal from a source (the remote address, without port)
// in a window writes a WARN line "authentication failed" saying why, with method, path, remote
// address and source, never what was presented; the later ones of that window are only counted, and one
// WARN line "authentication failed repeatedly" gives their number when the window ends (Flush,
// which Run calls). So a client that retries a wrong token thousands of times a minute writes
// two lines a minute, not thousands.
type Refusals struct {
	log     *slog.Logger
	clock   clock.Clock
	proxies []netip.Prefix
	mu      sync.Mutex
	counts  map[string]*tally // by source
}

// tally is what a source was refused in its current window.
type tally struct {
	start     time.Time
	n         int
	door, why string // the last refusal's
}

// NewRefusals returns an empty refusal log writing to log, on clk (the real clock when nil).
// A refusal is counted by its client's address (ClientAddr): behind one of trusted, the address
// the proxy says it forwarded for.
func NewRefusals(log *slog.Logger, clk clock.Clock, trusted ...netip.Prefix) *Refusals {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Refusals{log: log, clock: clock.Or(clk), proxies: trusted, counts: map[string]*tally{}}
}

// Refuse records that door refused to authenticate r, and why. A nil Refusals records nothing.
func (l *Refusals) Refuse(r *http.Request, door, why string) {
	if l == nil {
		return
	}
	now := l.clock.Now()
	src := ClientAddr(r, l.proxies)
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.counts[src]
	if t != nil && now.Sub(t.start) >= RefusalWindow {
		l.summarise(src, t)
		delete(l.counts, src)
		t = nil
	}
	if t == nil && len(l.counts) >= MaxRefusalSources {
		src = OtherSources
		t = l.counts[src]
	}
	if t == nil {
		t = &tally{start: now}
		l.counts[src] = t
		l.log.Warn("authentication failed", "door", door, "reason", why, "method", r.Method, "path", r.URL.Path,
			"remote", r.RemoteAddr, "source", src)
	}
	t.n++
	t.door, t.why = door, why
}

// Flush writes the summary of every window that has ended, and forgets it.
func (l *Refusals) Flush() { l.flush(false) }

func (l *Refusals) flush(all bool) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for src, t := range l.counts {
		if all || now.Sub(t.start) >= RefusalWindow {
			l.summarise(src, t)
			delete(l.counts, src)
		}
	}
}

// summarise writes the count of a window with more than its first refusal.
func (l *Refusals) summarise(src string, t *tally) {
	if t.n <= 1 {
		return
	}
	l.log.Warn("authentication failed repeatedly", "source", src, "refused", t.n, "since", t.start.UTC().Format(time.RFC3339),
		"window", RefusalWindow.String(), "lastDoor", t.door, "lastReason", t.why)
}

// Run flushes the ended windows every RefusalWindow until ctx ends, then writes the counts of
// the windows still open.
func (l *Refusals) Run(ctx context.Context) {
	defer l.flush(true)
	for {
		tm := l.clock.NewTimer(RefusalWindow)
		select {
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C():
			l.Flush()
		}
	}
}
