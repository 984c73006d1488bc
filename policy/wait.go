package policy

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// Decision is OnNoRunnable's answer: wait Sleep more (after the sleep the
// sidecar already did), or fail.
type Decision struct {
	Sleep   time.Duration
	Failure *Failure
	// Slept is how long the sidecar held the caller before answering; Woken
	// says a change of the scope ended that wait early.
	Slept time.Duration
	Woken bool
	// Uncertain: there was no certain time to wait for (a probe in flight, a
	// full pool), so the sidecar held the caller until something changed.
	Uncertain bool
	// forTenant: the call waits for its tenant's limits (holdTenant).
	forTenant bool
	// reasons are the call's per-source reasons as the decision's read saw
	// them (see current).
	reasons []gate.Rejection
}

// OnNoRunnable decides, after a NoRunnable Pick, whether the call waits or
// fails (the formula in docs/design.md, OnNoRunnable, dispatched by the reason of the refusal), and does
// the wait here, inside the sidecar. When every source is refused by a
// breaker OPEN because of a SOURCE_DEAD outcome, the call fails at once with
// source_dead (unless the scope's source_dead is wait), whatever circuit_open
// says: a dead key does not come back by waiting. Otherwise:
//
//   - with a certain time to wait for (every source OPEN), it sleeps until
//     the earliest cooldown ends plus jitter, clamped to the stall budget, and
//     ends early when a breaker of the scope changes;
//   - without one (a probe in flight, a full pool, a pacer ceiling), it holds
//     the caller until something it waits for changes — a breaker transition,
//     a released permit, or a source the scope's poller finds admissible on
//     its read of the backend every poll_interval — and at most until the
//     stall budget (plus one poll_interval) is spent. A change is noticed
//     within one poll interval, as with the formula's polling (within the
//     poller's backed-off interval, at most 1 s, when every held caller waits
//     for a breaker change only: waiter.interval), but the caller makes one
//     round trip per change instead of one per poll interval.
//
// Either wait answers before ctx's deadline: a certain wait then leaves the
// rest of its sleep to the caller, an uncertain one leaves nothing (the caller
// asks again). Close answers every wait at once the same way.
func (s *Scope) OnNoRunnable(ctx context.Context, c *Call) (Decision, error) {
	if s.removed.Load() {
		return s.removedDecision(c)
	}
	// Take the wake-ups before reading the backend, so that no change between
	// the read and the hold can be missed.
	t := s.wait.ticket()
	defer s.wait.release(t)
	var bell <-chan struct{}
	if tenantRefusal(c.lastSources()).Reason != gate.ReasonNone {
		if tc := s.tenant(c.Tenant); tc != nil {
			bell = s.bells.take(tc.Name)
			defer s.bells.done(tc.Name)
		}
	}
	d, circuit, first, err := s.decide(ctx, c)
	if err != nil {
		return Decision{}, err
	}
	s.inLine(c, t, d)
	defer func() {
		cfg, _ := s.snapshot()
		s.line.detach(c, t, d.Sleep+lineGrace(cfg))
	}()
	if first {
		s.observer.Waiting(c, d.Sleep, d.reasons)
	}
	if d.Failure == nil && !d.Woken {
		nap := d.Sleep
		if within, ok := answerWithin(ctx); ok {
			nap = min(nap, within)
		}
		start := time.Now()
		if d.forTenant {
			// A call refused by its tenant waits for its tenant alone.
			s.wait.release(t)
			if !d.Uncertain {
				bell = nil // its minute or budget frees at the end of the nap
			}
			d.Woken, err = s.holdTenant(ctx, bell, nap)
		} else {
			d.Woken, err = s.wait.hold(ctx, t, nap, circuit, d.Uncertain)
		}
		if err != nil {
			c.mu.Lock()
			s.leave(c) // the client is gone
			c.mu.Unlock()
			return Decision{}, err
		}
		d.Slept = time.Since(start)
		if d.Woken || d.Uncertain || d.Slept >= d.Sleep {
			d.Sleep = 0
		} else {
			d.Sleep = ceilMs(d.Sleep - d.Slept)
		}
	}
	if d.Failure == nil && s.removed.Load() {
		// Removed while the call was held (Remove ended the hold).
		return s.removedDecision(c)
	}
	s.observer.Decided(c, d)
	return d, nil
}

// decide is OnNoRunnable without the wait. circuit reports that every source
// was refused by its breaker or the cooldown memo.
func (s *Scope) decide(ctx context.Context, c *Call) (d Decision, circuit, first bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.end != nil {
		return d, false, false, ErrCallEnded
	}
	nr := c.last
	if nr == nil {
		return d, false, false, ErrNoRefusal
	}
	cfg, srcs := s.snapshot()
	circuit = nr.GateRejections == len(srcs)
	refusal := tenantRefusal(nr.Sources)
	var tc *gate.TenantCall
	if refusal.Reason != gate.ReasonNone {
		tc = s.tenant(c.Tenant)
	}
	var snap gate.Snapshot
	me := ""
	if names := joins(cfg, srcs, c, nr, circuit); len(names) > 0 {
		// The read takes the call's places in line (or keeps them): the
		// call's own.
		req := s.peekRequest(srcs, c.Tokens)
		join := s.waiter(c, cfg)
		join.Due = longestHold(ctx, cfg) + lineGrace(cfg)
		req.Line = &gate.LineRead{Lease: lineLease(cfg), Join: join, Joins: names}
		s.line.left(c.ID)
		s.joining(c)
		// Not cancelled with the RPC (the backend bounds it): a read that
		// joined and then failed to answer leaves those lines at once, so
		// no place stays in the backend that this sidecar does not know it
		// holds (a ghost at a line's head would stall the line).
		if snap, err = s.backend.Peek(context.WithoutCancel(ctx), req); err != nil {
			places := maps.Clone(c.places)
			for _, n := range names {
				delete(places, n)
			}
			s.placed(c, places, false)
			s.leaveLater(c, names) // the error is answered now
			return d, false, false, err
		}
		s.joined(c, names, snap)
		me = c.ID
	} else if tc != nil {
		// The call's own read, with its tenant; apart, as the shared one.
		if snap, err = s.readTenant(ctx, srcs, c.Tokens, tc); err != nil {
			return d, false, false, err
		}
	} else if _, snap, err = s.reads.peek(ctx, c.Tokens, true); err != nil { // the caller may park for long: read apart
		return d, false, false, err
	}
	now := time.Now()
	hint := s.breakerWait(snap, now)
	var tenantWait gate.Rejection // the tenant's refusal now
	if tc != nil {
		tenantWait = tenantVerdict(snap, refusal)
	}
	reasons := current(nr.Sources, snap)
	fail := func(reason FailureReason, retryAfter time.Duration) (Decision, bool, bool, error) {
		f := &Failure{Reason: reason, RetryAfter: max(retryAfter, 0), Sources: reasons}
		c.finish(Action{Failure: f})
		return Decision{Failure: f}, circuit, false, nil
	}

	var left time.Duration
	if !c.Deadline.IsZero() {
		if left = c.Deadline.Sub(now); left <= 0 {
			return fail(FailDeadlineExceeded, 0)
		}
	}
	peeked := c.peeked
	c.peeked = false
	if s.admissible(snap, me) && tenantWait.Reason == gate.ReasonNone && !peeked && (me != "" || !queuedRefusal(nr)) {
		// Something changed between the Pick and this read (a permit released,
		// a breaker closed or reset elsewhere), before the wake-ups were
		// taken: that is a wake-up, not a reason to fail or to wait. Only
		// once in a row: if the Pick after it is refused again, the next
		// answer waits for a change, so a caller never spins.
		c.peeked = true
		return Decision{Woken: true}, circuit, false, nil
	}
	if circuit && cfg.SourceDead == config.FailFast && allDead(snap) {
		// A dead key does not come back by waiting: fail now, loudly,
		// whatever circuit_open says.
		return fail(FailSourceDead, hint)
	}
	stalled := c.stalledFor(now)
	switch {
	case circuit:
		if cfg.CircuitOpen == config.FailFast {
			return fail(FailCircuitOpen, hint)
		}
	case tenantWait.Reason == gate.ReasonTenantBudget:
		// A spent budget ends the call, unless waiting for the window to
		// free enough is a wait the scope's policy takes: quota_full wait,
		// and the time fits in the rest of the stall budget.
		wait := tenantWait.RetryAfter
		if cfg.QuotaFull == config.FailFast || wait <= 0 || wait > cfg.StallWindow-stalled {
			return fail(FailBudgetExhausted, wait)
		}
		hint = wait
	case tenantWait.Reason == gate.ReasonTenantLimit:
		if cfg.QuotaFull == config.FailFast {
			return fail(FailQuotaExhausted, tenantWait.RetryAfter)
		}
		hint = tenantWait.RetryAfter // the tenant's minute frees then; 0: one of its permits must end
	default:
		if cfg.QuotaFull == config.FailFast {
			return fail(FailQuotaExhausted, minRetryAfter(reasons))
		}
		hint = 0
	}
	if stalled > cfg.StallWindow && snap.ProgressAge > cfg.StallWindow {
		return fail(FailStalled, hint)
	}
	if left > 0 && hint > left {
		// The earliest certain moment is past the deadline: fail now, not then.
		return fail(FailDeadlineExceeded, hint)
	}
	// The formula of docs/design.md, with the stall budget as the bound of an uncertain
	// wait (see OnNoRunnable).
	jitter := time.Duration(float64(cfg.PollInterval) * (0.5 + 0.5*s.rand()))
	budget := cfg.StallWindow - stalled + cfg.PollInterval
	sleep, uncertain := budget, hint == 0
	if hint > 0 {
		sleep = hint + jitter
	}
	sleep = max(jitter, min(sleep, budget))
	if left > 0 {
		sleep = min(sleep, left)
	}
	first = !c.waiting
	c.waiting = true
	return Decision{Sleep: ceilMs(sleep), Uncertain: uncertain, forTenant: tenantWait.Reason != gate.ReasonNone, reasons: reasons}, circuit, first, nil
}

// readTenant reads srcs and the tenant tc for an attempt of tokens, on a
// goroutine of its own (as reads.peek reads apart: the caller may park for
// long after it) and without ctx's cancellation (the backend bounds it).
func (s *Scope) readTenant(ctx context.Context, srcs []*source, tokens int64, tc *gate.TenantCall) (snap gate.Snapshot, err error) {
	req := s.peekRequest(srcs, tokens)
	req.Tenants = []gate.TenantCall{*tc}
	done := make(chan struct{})
	go func() {
		defer close(done)
		snap, err = s.backend.Peek(context.WithoutCancel(ctx), req)
	}()
	<-done
	return snap, err
}

// current is each source's reason of a refusal (in its order) as read now
// in snap, so that an answer carries the values of the one read it was
// decided on, not the Pick's: a source refused by its breaker (or the
// cooldown memo) has its breaker's reason and wait, one refused for
// capacity what Admit would answer now; a source that would admit now keeps
// its reason with nothing to wait for, and one the read did not see is kept
// as it was.
func current(refused []gate.Rejection, snap gate.Snapshot) []gate.Rejection {
	out := make([]gate.Rejection, len(refused))
	for i, r := range refused {
		out[i] = r
		j := slices.IndexFunc(snap.Sources, func(v gate.SourceView) bool { return v.Source == r.Source })
		if j < 0 {
			continue
		}
		v := snap.Sources[j]
		now := v.Verdict
		if r.Reason.Gate() && v.Breaker.Reason != gate.ReasonNone {
			now = gate.Rejection{Reason: v.Breaker.Reason, RetryAfter: v.Breaker.RetryAfter}
		}
		if now.Reason == gate.ReasonNone {
			out[i].RetryAfter = 0
			continue
		}
		out[i].Reason, out[i].RetryAfter = now.Reason, now.RetryAfter
	}
	return out
}

// pollOnce is the poller's read of the backend: whether some source with
// nobody in its line would admit an attempt now, so that every held caller
// re-asks. Of a source with a line, only this replica's waiters at its
// front are woken: those handed a slot, and the head when the source admits
// (the read also tells the backend this replica is alive).
func (s *Scope) pollOnce() bool {
	cfg, srcs := s.snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), max(cfg.PollInterval, time.Second))
	defer cancel()
	req := s.peekRequest(srcs, 0)
	req.Line = &gate.LineRead{Lease: lineLease(cfg)}
	ringTenants := s.pollTenants(&req)
	snap, err := s.backend.Peek(ctx, req)
	if err != nil {
		return false
	}
	ringTenants(snap)
	found := s.admissible(snap, "")
	for _, v := range snap.Sources {
		// A slot handed to a waiter here by another replica is its to ask
		// for, whatever this read says; the head only when its source
		// admits.
		front := v.Line.Wake
		if v.Verdict.Reason == gate.ReasonNone && v.Line.Head != "" {
			front = append(slices.Clip(front), v.Line.Head)
		}
		for _, id := range front {
			// One whose client left between two RPCs, or one no call here
			// is in line as (a lost join whose leave failed), is set aside
			// (as the backend does with a place nobody keeps): it takes its
			// place back if its client asks again.
			if s.line.overdue(id) {
				_ = s.backend.Leave(ctx, gate.LeaveRequest{Scope: s.name, Waiter: id, Sources: []string{v.Source}})
				continue
			}
			s.line.wake(id)
		}
	}
	return found
}

// admissible reports whether the backend's verdict admits some source of a
// snapshot now for waiter id ("" none): a source with nobody in its line,
// or one where id is at the front. It refreshes the cooldown memo.
func (s *Scope) admissible(snap gate.Snapshot, id string) bool {
	now := time.Now()
	found := false
	for _, v := range snap.Sources {
		s.remember(v.Source, v.Breaker, now)
		front := v.Line.Length == 0 || (id != "" && (v.Line.Head == id || slices.Contains(v.Line.Wake, id)))
		found = found || (v.Verdict.Reason == gate.ReasonNone && front)
	}
	return found
}

// breakerWait is the earliest certain retry over a snapshot's breakers (the
// minimum of their waits), refreshing the cooldown memo from it.
func (s *Scope) breakerWait(snap gate.Snapshot, now time.Time) time.Duration {
	waits := make([]gate.Rejection, len(snap.Sources))
	for i, v := range snap.Sources {
		s.remember(v.Source, v.Breaker, now)
		waits[i] = gate.Rejection{RetryAfter: v.Breaker.RetryAfter}
	}
	return minRetryAfter(waits)
}

// allDead reports whether every source of a snapshot is OPEN because of a
// SOURCE_DEAD outcome (a source merely cooling down after failures, or one
// an operator forced open, is not dead).
func allDead(snap gate.Snapshot) bool {
	for _, v := range snap.Sources {
		if v.Breaker.Cause != gate.OpenCauseSourceDead {
			return false
		}
	}
	return len(snap.Sources) > 0
}

// minRetryAfter is the least retry_after of a list (0 for none).
func minRetryAfter(rs []gate.Rejection) time.Duration {
	var least time.Duration = -1
	for _, r := range rs {
		if least < 0 || r.RetryAfter < least {
			least = r.RetryAfter
		}
	}
	return max(least, 0)
}
