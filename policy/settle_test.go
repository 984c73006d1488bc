package policy_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// slowSettle applies every Settle at once but answers only when release is
// closed, or with ctx's error when ctx ends first: a shared backend that
// applied the outcome while its client gave up waiting for the reply.
type slowSettle struct {
	gate.Backend
	release chan struct{}
}

func (b slowSettle) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	st, err := b.Backend.Settle(ctx, req)
	select {
	case <-b.release:
		return st, err
	case <-ctx.Done():
		return gate.Settlement{}, ctx.Err()
	}
}

// A caller that gives up mid-settle does not cut the settling short: the
// outcome is applied and answered, and a retried report gets that first
// answer, not a stale one.
func TestSettleIsNotCancellable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newScope(t, `sources: [{name: only, max_concurrency: 1}]`)
		slow := slowSettle{Backend: b, release: make(chan struct{})}
		s = policy.NewScope(s.Config(), slow, policy.Options{Rand: half})
		defer s.Close()
		c := newCall(s)
		g := grant(t, s, c)
		a := policy.Attempt{PermitID: g.Permit.ID, Outcome: policy.Success, ActualTokens: -1}

		callerCtx, cancel := context.WithCancel(context.Background())
		var first policy.Recorded
		var firstErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			first, firstErr = s.RecordOutcome(callerCtx, c, a)
		}()
		synctest.Wait()
		cancel()
		synctest.Wait()
		close(slow.release)
		<-done
		if firstErr != nil || !first.Released || first.Next.Done != true {
			t.Fatalf("report cancelled mid-settle: %+v %v, want released and done", first, firstErr)
		}
		again, err := s.RecordOutcome(ctx(t), c, a)
		if err != nil || again.Effect != first.Effect || again.Released != first.Released || again.Next.Done != first.Next.Done {
			t.Fatalf("retried report: %+v %v, want the first answer %+v", again, err, first)
		}
	})
}
