package policy

import "context"

// RecordRemoved is RecordOutcome for a call whose scope a reload removed (s
// is the removed scope): the permit is settled with the outcome as usual, so
// the breaker learns it and the slot is freed at once, and the call ends.
// An answer that would have continued the call (a retry) becomes a failure
// with scope_removed; a success stays Done and a failure keeps its reason.
// A repeated report gets the same answer.
func (s *Scope) RecordRemoved(ctx context.Context, c *Call, a Attempt) (Recorded, error) {
	rec, err := s.RecordOutcome(ctx, c, a)
	if err != nil || rec.Next.Retry == nil {
		return rec, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec.Next = Action{Failure: &Failure{Reason: FailScopeRemoved}}
	c.keepAnswer(a.PermitID, rec)
	c.finish(rec.Next)
	return rec, nil
}

// Remove stops the scope after a reload removed it from the configuration:
// every call held in OnNoRunnable is answered at once with scope_removed,
// and every later OnNoRunnable of its calls too (Close, at shutdown,
// answers the held calls with the rest of their sleep instead).
func (s *Scope) Remove() {
	s.removed.Store(true)
	s.wait.close()
}

// removedDecision is OnNoRunnable for a call of a removed scope: a call
// between attempts (no permit held) ends with scope_removed and leaves the
// scope's lines, where it would never be served; the observers are told.
func (s *Scope) removedDecision(c *Call) (Decision, error) {
	d, err := s.endRemoved(c)
	if err == nil {
		s.observer.Decided(c, d)
	}
	return d, err
}

// endRemoved ends c for removedDecision.
func (s *Scope) endRemoved(c *Call) (Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.end != nil:
		return Decision{}, ErrCallEnded
	case c.permit != nil:
		return Decision{}, ErrNoRefusal
	}
	f := &Failure{Reason: FailScopeRemoved}
	c.finish(Action{Failure: f})
	s.leave(c)
	return Decision{Failure: f}, nil
}
