package status

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// TestRecorderKeepsTheLastTransitionsNewestFirst: only transitions and
// overrides are kept, at most MaxTransitions, newest first.
func TestRecorderKeepsTheLastTransitionsNewestFirst(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	r := NewRecorder(func() time.Time { return now })
	r.Breaker("chat", gate.Event{Kind: gate.EventProbeLeased, Source: "a"})
	if got := r.Transitions(); len(got) != 0 {
		t.Fatalf("a probe event was kept: %+v", got)
	}
	for i := range MaxTransitions + 7 {
		now = start.Add(time.Duration(i) * time.Second)
		r.Breaker("chat", gate.Event{Kind: gate.EventTransition, Source: "a", From: gate.Closed, To: gate.Open, Cause: gate.CauseConsecutiveFailures, Epoch: uint64(i)})
	}
	got := r.Transitions()
	if len(got) != MaxTransitions {
		t.Fatalf("%d transitions kept, want %d", len(got), MaxTransitions)
	}
	for i, tr := range got {
		if want := uint64(MaxTransitions + 6 - i); tr.Epoch != want || tr.From != "closed" || tr.To != "open" || tr.Cause != "consecutive_failures" {
			t.Fatalf("transition %d: %+v, want epoch %d closed → open", i, tr, want)
		}
	}
}

// TestRecorderCountsWaitingCalls: a call waits from Waiting until a grant,
// a failure or its end; a refusal or a sleep handed to the client do not
// end the wait.
func TestRecorderCountsWaitingCalls(t *testing.T) {
	r := NewRecorder(time.Now)
	a := policy.NewCall("a", "chat", 0, time.Time{}, time.Now())
	b := policy.NewCall("b", "chat", 0, time.Time{}, time.Now())
	r.Waiting(a, time.Second, nil)
	r.Waiting(b, time.Second, nil)
	r.Waiting(b, time.Second, nil)
	if n := r.WaitingIn("chat"); n != 2 {
		t.Fatalf("%d waiting, want 2", n)
	}
	r.Picked(a, policy.Pick{})
	r.Decided(a, policy.Decision{Sleep: time.Second})
	if n := r.WaitingIn("chat"); n != 2 {
		t.Fatalf("%d waiting after a refusal and a client sleep, want 2", n)
	}
	r.Picked(a, policy.Pick{Grant: &policy.Grant{}})
	r.Abandoned(b, "expired")
	if n := r.WaitingIn("chat"); n != 0 {
		t.Fatalf("%d waiting after a grant and an expiry, want 0", n)
	}
}
