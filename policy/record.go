package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// Attempt is an attempt's report.
type Attempt struct {
	PermitID string
	Source   string
	Outcome  Outcome
	// RetryAfter is the upstream's Retry-After (0 if none): a floor of the
	// backoff, and of the OPEN a dead source causes.
	RetryAfter time.Duration
	// ActualTokens settles the TPM charge; < 0 keeps the estimate.
	ActualTokens int64
	HTTPStatus   int
	Detail       string
	// Latency is the attempt's time from grant to report (filled in by RecordOutcome).
	Latency time.Duration
	// Number is the attempt's number in the call, from 1; Probe and Epoch
	// are its permit's (filled in by RecordOutcome, for observers).
	Number int
	Probe  bool
	Epoch  uint64
}

// Recorded is RecordOutcome's answer.
type Recorded struct {
	Next Action
	// Effect says what the outcome did to the breaker (stale outcomes change nothing).
	Effect  gate.Effect
	Breaker gate.BreakerView
	// Released: the permit still held its slot.
	Released bool
}

// RecordOutcome settles the call's permit with the attempt's outcome, feeds
// the breaker, pacer and the call's budgets, and returns the next action. It
// is idempotent per permit: reporting the same permit again returns the first
// answer. ctx's cancellation does not cut the settling short (see record).
func (s *Scope) RecordOutcome(ctx context.Context, c *Call, a Attempt) (Recorded, error) {
	rec, a, st, err := s.record(ctx, c, a)
	if err != nil || !st.settled {
		return rec, err // an error, or a repeated report
	}
	s.absorb(st.events)
	if st.released {
		s.freed(st.handoff)
	}
	s.observer.Settled(c, a, rec)
	return rec, nil
}

// settled is what RecordOutcome does after record with the backend's
// settlement: a few fields, so that the settlement (a breaker view) neither
// escapes to the heap nor is copied through the frames of the report.
type settled struct {
	settled  bool // false: a repeated report, answered from the call's memory
	released bool
	handoff  string
	events   []gate.Event
}

// record settles the call's permit.
func (s *Scope) record(ctx context.Context, c *Call, a Attempt) (Recorded, Attempt, settled, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.answer(a.PermitID); ok {
		return prev, a, settled{}, nil
	}
	if c.permit == nil || c.permit.ID != a.PermitID {
		return Recorded{}, a, settled{}, fmt.Errorf("%w: %s", ErrPermitNotOfCall, a.PermitID)
	}
	r, ok := outcomes[a.Outcome]
	if !ok {
		return Recorded{}, a, settled{}, fmt.Errorf("%w: %d", ErrUnknownOutcome, a.Outcome)
	}
	// An upstream hint is a floor with a ceiling: a dead source's OPEN
	// lasts at least the hint, at most max_cooldown.
	var floor time.Duration
	if a.Outcome == SourceDead {
		floor = min(a.RetryAfter, c.permitSrc.Breaker.MaxCooldown)
	}
	p := c.permit
	cfg, _ := s.snapshot()
	handoff := s.lineHandoff()
	// As in Pick, the caller's cancellation does not cut the decision (the
	// backend's own timeout bounds it): a shared backend may apply an outcome
	// whose reply the caller no longer waits for, and the answer must be
	// recorded for the retry of the report.
	tc := s.tenant(c.Tenant)
	st, err := s.backend.Settle(context.WithoutCancel(ctx), gate.SettleRequest{
		Scope: s.name, Source: c.permitSrc, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe,
		Verdict: r.verdict, Floor: floor, ActualTokens: a.ActualTokens, Progress: a.Outcome == Success,
		Line: handoff, Tenant: tc,
	})
	if err != nil {
		return Recorded{}, a, settled{}, err // the permit stays the call's; the report may be retried
	}
	s.tenantFreed(tc, st.Released)
	now := time.Now()
	a.Source, a.Latency = p.Source, now.Sub(c.grantedAt)
	a.Number, a.Probe, a.Epoch = c.attempts, p.Probe, p.Epoch
	s.remember(p.Source, st.Breaker, now)
	if src := s.source(p.Source); src != nil {
		switch a.Outcome {
		case Success:
			src.pacer.Success()
		case RateLimited:
			src.pacer.RateLimited()
		}
		if r.failed {
			src.markFailed(now)
		}
	}
	if !r.refunded {
		c.productive += a.Latency
	}
	if r.charged {
		c.charged++
	}
	if r.failed {
		c.failures++
		if c.failedIn == nil {
			c.failedIn = make(map[string]int, 1)
		}
		c.failedIn[p.Source]++
	}
	c.permit = nil

	var dead []gate.Rejection
	if a.Outcome == SourceDead {
		dead = s.deadEverywhere(ctx, cfg, c.Tokens, p.Source, st.Breaker, now)
	}
	rec := Recorded{Next: s.next(c, cfg, r, a, st.ProgressAge, dead, now), Effect: st.Effect, Breaker: st.Breaker, Released: st.Released}
	c.keepAnswer(a.PermitID, rec)
	c.finish(rec.Next)
	return rec, a, settled{settled: true, released: st.Released, handoff: st.Handoff, events: st.Events}, nil
}

// deadEverywhere is, after a SOURCE_DEAD outcome whose breaker (view v of
// source name) now refuses as dead, with source_dead: fail_fast, every
// source's refusal when each of them is refused by a breaker OPEN because
// of a SOURCE_DEAD outcome; nil otherwise. A retry would only be refused
// and fail source_dead in OnNoRunnable one backoff later, so the call ends
// now. A scope of one source needs no other read; otherwise one Peek (a
// dead key is rare), whose failure leaves the retry to find out.
func (s *Scope) deadEverywhere(ctx context.Context, cfg *config.Scope, tokens int64, name string, v gate.BreakerView, now time.Time) []gate.Rejection {
	if cfg.SourceDead != config.FailFast || !refusedDead(v) {
		return nil
	}
	_, srcs := s.snapshot()
	if len(srcs) == 1 && srcs[0].cfg.Name == name {
		return []gate.Rejection{{Source: name, Reason: v.Reason, RetryAfter: v.RetryAfter}}
	}
	snap, err := s.backend.Peek(context.WithoutCancel(ctx), s.peekRequest(srcs, tokens))
	if err != nil {
		return nil
	}
	out := make([]gate.Rejection, 0, len(snap.Sources))
	for _, sv := range snap.Sources {
		s.remember(sv.Source, sv.Breaker, now)
		if !refusedDead(sv.Breaker) {
			return nil
		}
		out = append(out, gate.Rejection{Source: sv.Source, Reason: sv.Breaker.Reason, RetryAfter: sv.Breaker.RetryAfter})
	}
	return out
}

// refusedDead reports whether a breaker refuses because a SOURCE_DEAD
// outcome opened it (not an override, not failures).
func refusedDead(v gate.BreakerView) bool {
	return v.Reason == gate.ReasonCircuitOpen && v.Cause == gate.OpenCauseSourceDead
}

// next is the outcome table's last column. Both budgets are checked at every
// failed attempt, so a call ends with whichever runs out first; a backoff is
// clamped to the rest of the stall budget (plus one poll interval) while
// there is some left, and is never shorter than an upstream Retry-After.
// dead, when set, are the refusals of a scope whose every source is now
// dead (deadEverywhere): the call fails source_dead at once.
func (s *Scope) next(c *Call, cfg *config.Scope, r rule, a Attempt, progressAge time.Duration, dead []gate.Rejection, now time.Time) Action {
	switch r.then {
	case thenDone:
		return Action{Done: true}
	case thenFailNonRetryable:
		return Action{Failure: &Failure{Reason: FailNonRetryable}}
	case thenClose:
		return Action{Failure: &Failure{Reason: FailCancelled}}
	case thenRetry:
		if dead != nil {
			return Action{Failure: &Failure{Reason: FailSourceDead, RetryAfter: minRetryAfter(dead), Sources: dead}}
		}
		if c.charged >= cfg.MaxAttempts {
			return Action{Failure: &Failure{Reason: FailRetryExhausted}}
		}
	}
	stalled := c.stalledFor(now)
	if stalled > cfg.StallWindow && progressAge > cfg.StallWindow {
		return Action{Failure: &Failure{Reason: FailStalled, RetryAfter: ceilMs(a.RetryAfter)}}
	}
	backoff := Backoff(cfg.BackoffBase, cfg.BackoffMax, c.failures, 0, s.rand)
	if left := cfg.StallWindow - stalled + cfg.PollInterval; left > 0 {
		// Not past the stall budget: do not sleep beyond it. (Past it, the
		// scope is making progress, or the call would have failed stalled:
		// the full backoff applies.)
		backoff = min(backoff, left)
	}
	hint := a.RetryAfter
	switch {
	case a.Outcome == SourceDead:
		// The hint lengthened the source's OPEN (up to max_cooldown); the
		// retry may go to another source.
		hint = min(hint, c.permitSrc.Breaker.MaxCooldown, cfg.MaxRetryAfter)
	case hint > cfg.MaxRetryAfter:
		return Action{Failure: &Failure{Reason: FailRetryAfterTooLong, RetryAfter: ceilMs(hint)}}
	}
	backoff = max(backoff, ceilMs(hint))
	if !c.Deadline.IsZero() && now.Add(backoff).After(c.Deadline) {
		return Action{Failure: &Failure{Reason: FailDeadlineExceeded, RetryAfter: backoff}}
	}
	return Action{Retry: &backoff}
}
