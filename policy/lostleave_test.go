package policy_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// lostJoinAndLeave is lostJoin whose Leave also fails while down is set:
// the read that joined a line lost its answer, and the backend still does
// not answer when the sidecar takes the call out of that line again (a
// stalled Redis, which runs the join when it resumes).
type lostJoinAndLeave struct {
	gate.Backend
	down *atomic.Bool
}

func (l lostJoinAndLeave) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	if l.down.Load() && req.Line != nil && req.Line.Join != nil {
		_, _ = l.Backend.Peek(ctx, req)
		return gate.Snapshot{}, gate.ErrUnavailable
	}
	return l.Backend.Peek(ctx, req)
}

func (l lostJoinAndLeave) Leave(ctx context.Context, req gate.LeaveRequest) error {
	if l.down.Load() {
		return gate.ErrUnavailable
	}
	return l.Backend.Leave(ctx, req)
}

// TestLostJoinWhoseLeaveFailsDoesNotStallTheLine: a read that joined the
// line and lost its answer, and whose leave failed too, leaves a place in
// the backend that this replica no longer knows (TestLostJoinLeavesNoPlace
// is the case where the leave succeeds). Its call then ends (cancelled),
// another caller waits behind that place, and the RPM frees up without a
// release to hand off. The place is this replica's, kept alive by its own
// poller's reads, and the poller neither wakes it nor sets it aside (it
// only sets aside heads it knows it woke): the waiter behind it must still
// be woken within a lease and a poll, as behind a head whose client died
// (TestWokenHeadThatNeverAsksIsSetAside), not held until its stall budget.
func TestLostJoinWhoseLeaveFailsDoesNotStallTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := config.Parse([]byte("scopes:\n  s:\n"+indent(`
backpressure: {poll_interval: 1s, stall_window: 600s}
sources: [{name: only, rpm: 1}]
`)), nil)
		if err != nil {
			t.Fatal(err)
		}
		down := &atomic.Bool{}
		s := policy.NewScope(cfg.Scopes["s"], lostJoinAndLeave{inmem.New(time.Now), down}, policy.Options{Rand: half})
		t.Cleanup(s.Close)
		grant(t, s, newCall(s)) // the minute's one request

		ghost := newCall(s)
		if p := pick(t, s, ghost); p.NoRunnable == nil {
			t.Fatalf("%+v, want a refusal", p)
		}
		down.Store(true)
		if _, err := s.OnNoRunnable(ctx(t), ghost); err == nil {
			t.Fatal("OnNoRunnable answered although its read failed")
		}
		down.Store(false) // the backend answers again
		if ended, _, err := s.Cancel(ctx(t), ghost); err != nil || !ended {
			t.Fatalf("cancel of the call whose join was lost: ended %v, %v", ended, err)
		}

		out := park(t, s, newCall(s))
		time.Sleep(time.Minute) // the RPM is free again
		synctest.Wait()
		time.Sleep(5 * time.Second) // a lease and a poll, as for a woken head that never asks
		synctest.Wait()
		select {
		case d := <-out:
			if !d.Woken {
				t.Fatalf("the waiter: %+v, want woken", d)
			}
		default:
			t.Fatal("the waiter is still held behind the lost join's place, which nobody asks for or sets aside")
		}
	})
}
