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
	c.answers[a.PermitID] = rec
	c.finish(rec.Next)
	return rec, nil
}

// EndRemoved ends a live call of a removed scope that holds no permit (it is
// between attempts) with scope_removed, and returns that failure; nil when
// the call has ended already or holds a permit (its report ends it).
func (c *Call) EndRemoved() *Failure {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.end != nil || c.permit != nil {
		return nil
	}
	f := &Failure{Reason: FailScopeRemoved}
	c.finish(Action{Failure: f})
	return f
}
