package hub

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// maxRefusalKeys bounds the environments counted separately in one audit window; refusals of any
// further (claimed) environment are counted under the empty environment.
const maxRefusalKeys = 1024

// refusals counts refused connections and calls per (audit kind, environment) and writes one audit
// row per key per window, so a flood of refusals costs one row, not one fsync each.
type refusals struct {
	clock  clock.Clock // dates each window; set by New
	mu     sync.Mutex
	counts map[refusalKey]*refusalCount
}

type refusalKey struct{ kind, env string }

type refusalCount struct {
	since  time.Time
	n      int
	codes  map[protocol.Code]int
	sample map[protocol.Code]string // the first message of each code
}

// add counts one refusal.
func (r *refusals) add(kind, env string, e *protocol.Error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[refusalKey]*refusalCount{}
	}
	k := refusalKey{kind, env}
	c := r.counts[k]
	if c == nil {
		if len(r.counts) >= maxRefusalKeys {
			k.env = ""
			c = r.counts[k]
		}
		if c == nil {
			c = &refusalCount{since: r.clock.Now(), codes: map[protocol.Code]int{}, sample: map[protocol.Code]string{}}
			r.counts[k] = c
		}
	}
	c.n++
	c.codes[e.Code]++
	if _, ok := c.sample[e.Code]; !ok {
		c.sample[e.Code] = fmt.Sprintf("%.200s", e.Message)
	}
}

// take returns and forgets the counts of the window.
func (r *refusals) take() map[refusalKey]*refusalCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.counts
	r.counts = nil
	return out
}

// detail is the audit row of one window: "3 refused since …: unauthorized ×2 (first: …); …".
func (c *refusalCount) detail() string {
	codes := make([]protocol.Code, 0, len(c.codes))
	for code := range c.codes {
		codes = append(codes, code)
	}
	slices.Sort(codes)
	parts := make([]string, 0, len(codes))
	for _, code := range codes {
		parts = append(parts, fmt.Sprintf("%s: ×%d (first: %s)", code, c.codes[code], c.sample[code]))
	}
	return fmt.Sprintf("%d refused since %s; %s", c.n, store.FormatTime(c.since), strings.Join(parts, "; "))
}

// flushRefusals writes the window's counts, one audit row per kind and environment, in one transaction.
func (s *Server) flushRefusals(ctx context.Context) {
	counts := s.refused.take()
	if len(counts) == 0 {
		return
	}
	keys := make([]refusalKey, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b refusalKey) int { return strings.Compare(a.kind+"\x00"+a.env, b.kind+"\x00"+b.env) })
	if err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		for _, k := range keys {
			if err := store.Audit(ctx, tx, s.cfg.Clock.Now(), k.kind, k.env, counts[k].detail()); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		s.log.Error("audit refusals", "rows", len(keys), "err", err)
	}
}

// refusalLoop flushes the refusal counts every window until Close has ended every connection, then
// once more.
func (s *Server) refusalLoop() {
	defer close(s.refusalsDone)
	for {
		t := s.cfg.Clock.NewTimer(s.cfg.Limits.RejectAuditWindow)
		select {
		case <-t.C():
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.flushRefusals(ctx)
			cancel()
		case <-s.refusalsStop:
			t.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.flushRefusals(ctx)
			cancel()
			return
		}
	}
}
