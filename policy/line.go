package policy

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// Each source has a line of the callers that wait for its capacity
// (concurrency, RPM, TPM, pacer): higher priority first (aged by
// priority_aging), then weighted fair share across tenants, then first come,
// first served. The lines are the backend's (gate/line.go), so that on
// Redis they are the fleet's; they ride in the round trips a call makes
// anyway:
//   - in the backend's Admit walk, a candidate whose line has the call
//     behind its head refuses it as queued without asking its quota; the
//     head, a waiter handed a slot, and a newcomer ranked before the head
//     go on to the quota, and another source with free capacity and an
//     empty line may still grant;
//   - a call takes its place in the lines of the sources that refused it
//     for capacity when it waits (OnNoRunnable's read of the backend), not
//     when a Pick is refused, so that a caller that never waits does not
//     hold a line; a grant on any source leaves every line;
//   - a released slot is handed to one waiter of the released source's
//     line (handoff) by the Settle that released it; a local waiter is woken
//     at once, one on another replica by its replica's poller, within one
//     poll interval;
//   - the poller's read tells this replica which of its waiters are at the
//     front of the line of a source that would admit;
//   - a place belongs to a caller that is heard of: a Pick keeps it a lease,
//     a read that joins until the caller's next Pick is due plus a grace
//     (gate.Waiter.Due), and this replica sets aside a waiter of its own at
//     the front whose next RPC is overdue (its client left between two
//     RPCs), so that callers who left cost the line one due, however many,
//     rather than a lease each.
//
// Breakers are not ordered: a refusal by every breaker leaves the line.
// This side keeps only the wake-up channels of the calls it holds in line;
// its lock (mu) is a leaf.
type line struct {
	mu   sync.Mutex
	held map[string]*held // by call id
	// leaving are the leaves in flight (leaveLater), by call id: each is
	// closed when the backend has answered.
	leaving map[string]chan struct{}
}

// held is a call of this replica in line.
type held struct {
	hold   *holder // the call's hold, while it is held
	handed bool    // handed a slot while not held: its next hold ends at once
	woken  bool    // woken and not refused since
	// lapse is when, while it is not held, the call's caller counts as
	// gone: a lease after a Pick (its OnNoRunnable is due at once, and a
	// slow client's turnaround must not cost it its place), a grace after
	// the sleep OnNoRunnable answered; zero while an OnNoRunnable is on its
	// way.
	lapse time.Time
}

func newLine() *line {
	return &line{held: make(map[string]*held), leaving: make(map[string]chan struct{})}
}

// lineLease is how long the line trusts a replica it has not heard of, and
// how long a waiter handed a slot has to ask for it: a few poll intervals,
// at least a second.
func lineLease(cfg *config.Scope) time.Duration {
	return max(3*cfg.PollInterval, time.Second)
}

// lineGrace is how long past the end of its sleep a caller's next Pick may
// come before its place is set aside: one poll interval, the latency the
// scope allows itself for noticing a change.
func lineGrace(cfg *config.Scope) time.Duration { return cfg.PollInterval }

// waiter is c as the line's waiter, for a Pick: c's OnNoRunnable is due at
// once after it, and its place is kept a lease for it (a client that turns
// around slowly under load keeps its rank). Called with c.mu held.
func (s *Scope) waiter(c *Call, cfg *config.Scope) *gate.Waiter {
	t, named := cfg.Tenant(c.Tenant)
	return &gate.Waiter{
		ID: c.ID, Priority: c.Priority, Tenant: c.Tenant, Named: named,
		Weight: t.Weight, OtherWeight: cfg.DefaultTenant.Weight,
		MaxTenants: cfg.MaxTenants, Aging: cfg.PriorityAging, Lease: lineLease(cfg), Due: lineLease(cfg), Places: c.places,
	}
}

// placed records the backend's answer about c's places. spent: the answer
// is an Admit's, which spends a slot c was handed (a read does not). Called
// with c.mu held.
func (s *Scope) placed(c *Call, places map[string]string, spent bool) {
	c.places = places
	s.line.mu.Lock()
	defer s.line.mu.Unlock()
	if len(places) == 0 {
		delete(s.line.held, c.ID)
		return
	}
	h := s.line.held[c.ID]
	if h == nil {
		h = &held{}
		s.line.held[c.ID] = h
	}
	if spent { // in line still; its OnNoRunnable is due
		cfg, _ := s.snapshot()
		h.woken, h.handed, h.lapse = false, false, time.Now().Add(lineLease(cfg))
	}
}

// joining makes c a waiter of this replica before the read that joins its
// lines, so that a slot handed to it while the read is out (a release's
// handoff that lands between the backend's join and the answer) is kept
// for its hold, not lost until the poller's next read. Called with c.mu
// held.
func (s *Scope) joining(c *Call) {
	s.line.mu.Lock()
	defer s.line.mu.Unlock()
	if h := s.line.held[c.ID]; h != nil {
		h.lapse = time.Time{}
	} else {
		s.line.held[c.ID] = &held{}
	}
}

// leave takes c out of the line: its call ended or its client is gone.
// Called with c.mu held. The backend's answer is not waited for beyond a
// second: a waiter the backend could not be told about leaves with its
// lease, or is set aside when it does not take a slot handed to it.
func (s *Scope) leave(c *Call) {
	if sources := s.unplace(c); len(sources) > 0 {
		s.leaveLines(c, sources)
	}
}

// unplace forgets c's places and returns the sources whose lines it has to
// leave. Called with c.mu held.
func (s *Scope) unplace(c *Call) []string {
	if len(c.places) == 0 {
		return nil
	}
	sources := slices.Sorted(maps.Keys(c.places))
	s.placed(c, nil, false)
	return sources
}

// leaveLater takes c out of the lines of sources without making its caller
// wait for the backend, so that an answer costs at most one round trip: the
// leave runs on a goroutine of its own, and the call's next read that joins
// a line waits for it (left), so that a late leave never takes out a place
// joined after it. Called with c.mu held.
func (s *Scope) leaveLater(c *Call, sources []string) {
	done := make(chan struct{})
	s.line.mu.Lock()
	s.line.leaving[c.ID] = done
	s.line.mu.Unlock()
	go func() {
		s.leaveLines(c, sources)
		s.line.mu.Lock()
		delete(s.line.leaving, c.ID)
		s.line.mu.Unlock()
		close(done)
	}()
}

// left waits until the leave of call id in flight, if any, has been
// answered. Called with the call's lock held, so that no other leave of
// the call starts meanwhile.
func (l *line) left(id string) {
	l.mu.Lock()
	done := l.leaving[id]
	l.mu.Unlock()
	if done != nil {
		<-done
	}
}

// leaveLines takes c out of the lines of sources.
func (s *Scope) leaveLines(c *Call, sources []string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.backend.Leave(ctx, gate.LeaveRequest{Scope: s.name, Waiter: c.ID, Sources: sources})
}

// admitted records an Admit's answer about c's places: the candidates'
// lines answered for themselves; a place in the line of a source that was
// not a candidate (cooling down, TPM) is kept, unless c was granted, which
// leaves every line. Called with c.mu held.
func (s *Scope) admitted(c *Call, cands []gate.Candidate, adm gate.Admission) {
	var places map[string]string // nil for none: a call refused outside every line allocates nothing here
	if len(adm.Places) > 0 {
		places = maps.Clone(adm.Places)
	}
	var gone []string
	for src, p := range c.places {
		if slices.ContainsFunc(cands, func(c gate.Candidate) bool { return c.Source.Name == src }) {
			continue
		}
		if adm.Granted {
			gone = append(gone, src)
			continue
		}
		if places == nil {
			places = map[string]string{}
		}
		places[src] = p
	}
	s.placed(c, places, true)
	if len(gone) > 0 {
		s.leaveLines(c, gone)
	}
}

// joined records a read's answer about c's places in the lines it joined.
// Called with c.mu held.
func (s *Scope) joined(c *Call, joins []string, snap gate.Snapshot) {
	places := maps.Clone(c.places)
	for _, v := range snap.Sources {
		if !slices.Contains(joins, v.Source) {
			continue
		}
		if places == nil {
			places = map[string]string{}
		}
		if v.Line.Place == "" {
			delete(places, v.Source)
		} else {
			places[v.Source] = v.Line.Place
		}
	}
	s.placed(c, places, false)
}

// Forget takes a call the sidecar forgets (idle expiry) out of the line.
func (s *Scope) Forget(c *Call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.leave(c)
}

// wake hands a slot to the waiters named, those of this replica that are
// held and not woken yet.
func (l *line) wake(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if h := l.held[id]; h != nil && !h.woken {
			h.woken = true
			if h.hold != nil {
				h.hold.ring(wakeHanded)
			} else {
				h.handed = true
			}
		}
	}
}

// overdue reports whether id, a waiter of this replica at a line's front,
// holds the line for nobody: it is not held and past its lapse (its client
// is gone between two RPCs: the place the backend keeps until the due it
// last heard may last longer, when the answer came early), or no call of
// this replica is in line as id (a read that joined lost its answer and the
// leave after it failed: nobody would ever ask for that place).
func (l *line) overdue(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[id]
	return h == nil || h.hold == nil && !h.lapse.IsZero() && time.Now().After(h.lapse)
}

// attach makes t the hold that a slot handed to c rings, when c is in line
// (reported), and a hold that a release elsewhere does not end: a slot
// handed since the last Pick rings it at once. Call it from t's goroutine.
func (l *line) attach(c *Call, t *holder) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[c.ID]
	if h == nil {
		return false
	}
	h.hold, t.inLine = t, true
	if h.handed {
		h.handed = false
		t.ring(wakeHanded)
	}
	return true
}

// detach ends attach when OnNoRunnable answers c: a slot handed to c that
// t's hold did not take is kept for c's next hold, and c's caller counts as
// gone after lapse (the sleep it was answered, plus a grace).
func (l *line) detach(c *Call, t *holder, lapse time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.held[c.ID]; h != nil && h.hold == t {
		h.hold, h.lapse = nil, time.Now().Add(lapse)
		if wake(t.why.Load())&wakeHanded != 0 {
			h.handed = true
		}
	}
}

// LineGroup counts the waiters of one priority and tenant.
type LineGroup = gate.LineGroup

// LineState is a source's line as DescribeScope shows it.
type LineState struct {
	Length     int
	OldestWait time.Duration
	Groups     []LineGroup // highest priority first, then by tenant
}

// inLine adapts OnNoRunnable's hold to the line: a call in line is woken by
// a slot handed to it, not by every release (detach the hold after it); a
// call that failed leaves the line.
func (s *Scope) inLine(c *Call, t *holder, d Decision) {
	if d.Failure != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		if sources := s.unplace(c); len(sources) > 0 {
			s.leaveLater(c, sources) // the failure is answered at once
		}
		return
	}
	s.line.attach(c, t)
}

// joins names the lines c, refused by nr, takes its place in when it
// waits: those of the sources that refused it for capacity, when it would
// wait rather than fail and the scope enforces. A source whose tpm c's
// estimate exceeds never grants it: c does not wait in its line (at its
// head it would hold up the line).
func joins(cfg *config.Scope, srcs []*source, c *Call, nr *NoRunnable, circuit bool) []string {
	if circuit || cfg.QuotaFull == config.FailFast || cfg.Mode == config.Shadow {
		return nil
	}
	var names []string
	for _, r := range nr.Sources {
		i := slices.IndexFunc(srcs, func(s *source) bool { return s.cfg.Name == r.Source })
		tooBig := i >= 0 && srcs[i].cfg.TPM > 0 && c.Tokens > srcs[i].cfg.TPM
		if !tooBig && gate.CapacityRefused([]gate.Rejection{r}) {
			names = append(names, r.Source)
		}
	}
	return names
}

// queuedRefusal reports whether a refusal was a line's (no quota asked).
func queuedRefusal(nr *NoRunnable) bool {
	return slices.ContainsFunc(nr.Sources, func(r gate.Rejection) bool { return r.Reason == gate.ReasonQueued })
}

// answerWithin is how long OnNoRunnable may hold its caller: until just
// before the RPC's deadline (ok false: the RPC has none).
func answerWithin(ctx context.Context) (time.Duration, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	left := time.Until(deadline)
	return max(0, left-min(left/10, 50*time.Millisecond)), true
}

// longestHold bounds how long OnNoRunnable holds a caller that joins a
// line: its sleep (at most the stall budget plus a poll interval), cut short
// by the RPC's deadline. The caller's next Pick is due when the hold ends:
// a wait in line has no certain time, so its answer leaves nothing to sleep.
func longestHold(ctx context.Context, cfg *config.Scope) time.Duration {
	d := cfg.StallWindow + cfg.PollInterval
	if within, ok := answerWithin(ctx); ok {
		d = min(d, within)
	}
	return d
}
