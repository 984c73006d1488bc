package policy

import (
	"sort"
	"sync"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// line orders the callers of a scope that wait for capacity (concurrency,
// RPM, TPM, pacer): higher priority first (aged by priority_aging), then the
// tenant with the least weighted share of the line's grants (virtual time:
// grants / weight), then first come, first served.
//
// A Pick of a call behind the head is refused with ReasonQueued without
// asking the backend; the head, and a waiter handed a released slot, ask the
// backend. A released slot is handed to one waiter (handoff), so that one
// release makes one Pick. The line is this sidecar's; breakers are not
// ordered (a refusal by every breaker leaves the line).
//
// A waiter handed a slot that does not ask for it within one poll interval
// (its client is gone) is set aside by the poller; it takes its place back
// if it ever asks again. Its lock (mu) is a leaf.
type line struct {
	mu      sync.Mutex
	seq     uint64
	round   uint64 // the poller's reads
	entries map[*Call]*place
	vt      map[string]float64 // tenant bucket → grants from the line / weight
}

// place is a call's place in line; it is kept on the Call so that a call set
// aside takes the same place back.
type place struct {
	prio   int32
	tenant string // the bucket: the tenant, or overflowTenant
	seq    uint64
	joined time.Time
	wake   chan struct{} // one slot handed over
	called bool
	when   uint64 // the round it was handed a slot
}

// overflowTenant is the bucket of tenants beyond max_tenants.
const overflowTenant = "~other"

func newLine() *line {
	return &line{entries: make(map[*Call]*place), vt: make(map[string]float64)}
}

// effective is p's priority after aging at now, saturating.
func (p *place) effective(aging time.Duration, now time.Time) int64 {
	e := int64(p.prio)
	if aging > 0 {
		e += int64(now.Sub(p.joined) / aging)
	}
	return e
}

// before reports whether a ranks ahead of b.
func (l *line) before(a, b *place, aging time.Duration, now time.Time) bool {
	if ea, eb := a.effective(aging, now), b.effective(aging, now); ea != eb {
		return ea > eb
	}
	if va, vb := l.vt[a.tenant], l.vt[b.tenant]; va != vb {
		return va < vb
	}
	return a.seq < b.seq
}

// head is the first of the line (nil when empty); uncalled: the first of
// those not handed a slot yet.
func (l *line) head(cfg *config.Scope, now time.Time, uncalled bool) *place {
	var best *place
	for _, p := range l.entries {
		if uncalled && p.called {
			continue
		}
		if best == nil || l.before(p, best, cfg.PriorityAging, now) {
			best = p
		}
	}
	return best
}

// admit decides whether a Pick of c goes to the backend (false) or is
// refused as queued (true): a waiter goes when it is the head or was handed
// a slot; a newcomer (not waiting) goes when nobody waits or it would rank
// before the head. Called with c.mu held.
func (l *line) admit(c *Call, cfg *config.Scope, now time.Time) (queued bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, in := l.entries[c]
	if !in && c.place != nil {
		l.enter(c.place) // set aside earlier: back to its place
		l.entries[c] = c.place
		p, in = c.place, true
	}
	if len(l.entries) == 0 {
		return false
	}
	head := l.head(cfg, now, false)
	if in {
		return !p.called && head != p
	}
	tenant := l.bucket(c.Tenant, cfg)
	probe := &place{prio: c.Priority, tenant: tenant, seq: l.seq + 1, joined: now}
	saved, had := l.vt[tenant]
	l.vt[tenant] = l.startVT(tenant)
	ahead := l.before(probe, head, cfg.PriorityAging, now)
	if had {
		l.vt[tenant] = saved
	} else {
		delete(l.vt, tenant)
	}
	return !ahead
}

// after records a Pick's result for a waiter: a grant leaves the line (and
// counts in the tenant's share); a refusal for capacity keeps its place (the
// slot it was handed, if any, is spent); a refusal by every breaker leaves
// the line. Called with c.mu held.
func (l *line) after(c *Call, cfg *config.Scope, granted, capacity bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, in := l.entries[c]
	if granted {
		c.place = nil // a later attempt queues anew
	}
	if !in {
		return
	}
	switch {
	case granted:
		delete(l.entries, c)
		l.vt[p.tenant] += 1 / float64(max(1, cfg.TenantWeight(p.tenant)))
		l.tidy()
	case capacity:
		p.called = false
		select {
		case <-p.wake:
		default:
		}
	default:
		l.remove(c)
	}
}

// join gives a call that waits for capacity its place in line (at the end
// of its tenant's queue, or the place it had). Called with c.mu held.
func (l *line) join(c *Call, cfg *config.Scope, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, in := l.entries[c]; in {
		return
	}
	if c.place == nil {
		l.seq++
		c.place = &place{prio: c.Priority, tenant: l.bucket(c.Tenant, cfg), seq: l.seq, joined: now, wake: make(chan struct{}, 1)}
	}
	l.enter(c.place)
	l.entries[c] = c.place
}

// bucket is the tenant's bucket: itself, or the shared one beyond max_tenants.
func (l *line) bucket(tenant string, cfg *config.Scope) string {
	if _, known := l.vt[tenant]; !known && len(l.vt) >= cfg.MaxTenants {
		return overflowTenant
	}
	return tenant
}

// startVT is where a tenant's share starts when it joins: a tenant that had
// nobody waiting starts at the least virtual time of those waiting, so that
// it banks no share while idle.
func (l *line) startVT(tenant string) float64 {
	least, found := 0.0, false
	for _, q := range l.entries {
		if q.tenant == tenant {
			return l.vt[tenant]
		}
		if v := l.vt[q.tenant]; !found || v < least {
			least, found = v, true
		}
	}
	return max(l.vt[tenant], least)
}

// enter puts p in line (the caller adds it to entries).
func (l *line) enter(p *place) {
	l.vt[p.tenant] = l.startVT(p.tenant)
	p.called = false
}

// remove takes c out of the line.
func (l *line) remove(c *Call) {
	if _, in := l.entries[c]; in {
		delete(l.entries, c)
		l.tidy()
	}
}

// tidy forgets the tenants' shares when nobody waits, keeping memory bounded.
func (l *line) tidy() {
	if len(l.entries) == 0 {
		clear(l.vt)
	}
}

// leave takes c out of the line: its call ended or its client is gone.
func (l *line) leave(c *Call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remove(c)
}

// waker is the channel that hands c a slot (nil when c is not in line).
func (l *line) waker(c *Call) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, in := l.entries[c]; in {
		return p.wake
	}
	return nil
}

// handoff hands a released slot to the first waiter not handed one yet, and
// reports whether anyone waits.
func (l *line) handoff(cfg *config.Scope, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) == 0 {
		return false
	}
	l.call(cfg, now)
	return true
}

func (l *line) call(cfg *config.Scope, now time.Time) {
	if p := l.head(cfg, now, true); p != nil {
		p.called, p.when = true, l.round
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// polled is the poller's finding that a source would admit: a waiter handed
// a slot a whole round ago that has not asked is set aside, and, when no
// handed slot is outstanding, the next waiter is handed one. It reports
// whether anyone waits.
func (l *line) polled(cfg *config.Scope, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.round++
	outstanding := false
	for c, p := range l.entries {
		if !p.called {
			continue
		}
		if l.round-p.when > 1 {
			delete(l.entries, c)
			continue
		}
		outstanding = true
	}
	if len(l.entries) == 0 {
		l.tidy()
		return false
	}
	if !outstanding {
		l.call(cfg, now)
	}
	return true
}

// LineGroup counts the waiters of one priority and tenant.
type LineGroup struct {
	Priority int32
	Tenant   string
	Waiting  int
}

// LineState is the line as DescribeScope shows it.
type LineState struct {
	Length     int
	OldestWait time.Duration
	Groups     []LineGroup // highest priority first, then by tenant
}

func (l *line) state(now time.Time) LineState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LineState{Length: len(l.entries)}
	count := map[LineGroup]int{}
	for _, p := range l.entries {
		st.OldestWait = max(st.OldestWait, now.Sub(p.joined))
		count[LineGroup{Priority: p.prio, Tenant: p.tenant}]++
	}
	for g, n := range count {
		g.Waiting = n
		st.Groups = append(st.Groups, g)
	}
	sort.Slice(st.Groups, func(i, j int) bool {
		a, b := st.Groups[i], st.Groups[j]
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.Tenant < b.Tenant
	})
	return st
}

// inLine adapts OnNoRunnable's hold to the line: a call that waits for
// capacity takes its place in line and is woken by a slot handed to it, not
// by every release; a call that failed leaves the line.
func (s *Scope) inLine(c *Call, t ticket, d Decision, circuit bool) ticket {
	if d.Failure != nil {
		s.line.leave(c)
		return t
	}
	if !circuit && !d.Woken {
		cfg, _ := s.snapshot()
		c.mu.Lock()
		if c.end == nil && cfg.Mode != config.Shadow {
			s.line.join(c, cfg, time.Now())
		}
		c.mu.Unlock()
	}
	if ch := s.line.waker(c); ch != nil {
		t.freed = ch
	}
	return t
}

// queuedRefusal reports whether a refusal was the line's (no backend asked).
func queuedRefusal(nr *NoRunnable) bool {
	for _, r := range nr.Sources {
		if r.Reason == gate.ReasonQueued {
			return true
		}
	}
	return false
}
