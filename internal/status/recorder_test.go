package status

import (
	"strconv"
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

// TestRecorderKeepsFifteenMinutesPerScope: grants, refusals by reason,
// waits, failed attempts and failed calls land in the interval of their
// time; intervals older than Buckets are forgotten; an interval without
// events carries the calls waiting at the end of the one before.
func TestRecorderKeepsFifteenMinutesPerScope(t *testing.T) {
	start := time.Unix(1_800_000_000, 0) // a multiple of BucketWidth
	now := start
	r := NewRecorder(func() time.Time { return now })
	call := func(id string) *policy.Call { return policy.NewCall(id, "chat", 0, time.Time{}, now) }
	a, b := call("a"), call("b")
	r.Picked(a, policy.Pick{Grant: &policy.Grant{Skipped: []gate.Rejection{{Source: "x", Reason: gate.ReasonRateLimited}}}})
	r.Settled(a, policy.Attempt{Source: "y", Outcome: policy.Transient, HTTPStatus: 503}, policy.Recorded{})
	r.Picked(b, policy.Pick{NoRunnable: &policy.NoRunnable{Sources: []gate.Rejection{{Source: "x", Reason: gate.ReasonCircuitOpen}, {Source: "y", Reason: gate.ReasonCircuitOpen}}}})
	r.Waiting(b, time.Second, nil)

	now = start.Add(3 * BucketWidth) // two quiet intervals, then b fails
	r.Decided(b, policy.Decision{Failure: &policy.Failure{}})

	ivs := r.Scope("chat").Intervals
	if len(ivs) != Buckets {
		t.Fatalf("%d intervals, want %d", len(ivs), Buckets)
	}
	first, quiet, last := ivs[Buckets-4], ivs[Buckets-3], ivs[Buckets-1]
	if !first.Start.Equal(start) || first.Grants != 1 || first.FailedAttempts != 1 || first.WaitsStarted != 1 || first.Waiting != 1 ||
		first.Refusals["rate_limited"] != 1 || first.Refusals["circuit_open"] != 2 {
		t.Errorf("the first interval: %+v", first)
	}
	if quiet.Grants != 0 || quiet.Waiting != 1 {
		t.Errorf("a quiet interval while b waits: %+v, want 1 waiting", quiet)
	}
	if last.FailedCalls != 1 || last.Waiting != 1 || r.WaitingIn("chat") != 0 {
		t.Errorf("the interval b failed in: %+v (waiting now %d), want its one failed call, 1 waiting at most", last, r.WaitingIn("chat"))
	}
	for _, iv := range ivs[:Buckets-4] {
		if iv.Grants != 0 || iv.Waiting != 0 {
			t.Fatalf("an interval before anything happened: %+v", iv)
		}
	}

	now = start.Add(Buckets * BucketWidth) // the first interval leaves the window
	r.Picked(call("c"), policy.Pick{Grant: &policy.Grant{}})
	ivs = r.Scope("chat").Intervals
	var grants int64
	for _, iv := range ivs {
		grants += iv.Grants
	}
	if grants != 1 || ivs[Buckets-1].Grants != 1 {
		t.Errorf("%d grants in the window after it moved past the first, want the new one only", grants)
	}
}

// TestRecorderRemembersEachSourcesLastStatusAndOpenCause: the last HTTP
// status reported per source (a cancel reports none), and the cause of its
// last opening; a scope removed by a reload is forgotten.
func TestRecorderRemembersEachSourcesLastStatusAndOpenCause(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := NewRecorder(func() time.Time { return now })
	c := policy.NewCall("a", "chat", 0, time.Time{}, now)
	r.Settled(c, policy.Attempt{Source: "primary", Outcome: policy.Transient, HTTPStatus: 503}, policy.Recorded{})
	r.Breaker("chat", gate.Event{Kind: gate.EventTransition, Source: "primary", From: gate.Closed, To: gate.Open, Cause: gate.CauseConsecutiveFailures})
	now = now.Add(time.Second)
	r.Settled(c, policy.Attempt{Source: "primary", Outcome: policy.Cancelled}, policy.Recorded{})
	r.Settled(c, policy.Attempt{Source: "backup", Outcome: policy.SourceDead, HTTPStatus: 401}, policy.Recorded{})
	r.Breaker("chat", gate.Event{Kind: gate.EventOverride, Source: "backup", Override: gate.ForcedOpen, Action: gate.ActionForceOpen, Actor: "alice", Why: "key rotation"})

	got := r.Scope("chat").Sources
	if p := got["primary"]; p.Status != 503 || p.Outcome != "transient" || p.OpenCause != "consecutive_failures" || !p.StatusAt.Equal(now.Add(-time.Second)) {
		t.Errorf("primary: %+v, want 503 transient, opened by consecutive_failures, the cancel ignored", p)
	}
	if b := got["backup"]; b.Status != 401 || b.Outcome != "source_dead" || b.OpenCause != "" {
		t.Errorf("backup: %+v, want 401 source_dead and no opening (an override is not one)", b)
	}
	if tr := r.Transitions()[0]; tr.Kind != "override" || tr.Action != "force_open" || tr.Override != "forced_open" || tr.Cause != "" {
		t.Errorf("the override as kept: %+v", tr)
	}
	r.Keep([]string{"other"})
	if got := r.Scope("chat"); len(got.Sources) != 0 || len(got.Transitions) != 0 {
		t.Errorf("a removed scope is still kept: %+v", got)
	}
}

// TestRecorderIsBounded: scopes past maxScopes and sources past maxSources
// are not recorded.
func TestRecorderIsBounded(t *testing.T) {
	r := NewRecorder(time.Now)
	for i := range maxScopes + 10 {
		r.Breaker(strconv.Itoa(i), gate.Event{Kind: gate.EventTransition, Source: "a", To: gate.Open})
	}
	c := policy.NewCall("a", "0", 0, time.Time{}, time.Now())
	for i := range maxSources + 10 {
		r.Settled(c, policy.Attempt{Source: strconv.Itoa(i), Outcome: policy.Success, HTTPStatus: 200}, policy.Recorded{})
	}
	if n := len(r.scopes); n != maxScopes {
		t.Errorf("%d scopes kept, want %d", n, maxScopes)
	}
	if n := len(r.Scope("0").Sources); n != maxSources {
		t.Errorf("%d sources kept, want %d", n, maxSources)
	}
}

// TestRecorderDoesNotAllocateOnTheAttemptPath: once a scope and source were
// seen, counting a grant and keeping an outcome's status allocate nothing.
func TestRecorderDoesNotAllocateOnTheAttemptPath(t *testing.T) {
	r := NewRecorder(time.Now)
	c := policy.NewCall("a", "chat", 0, time.Time{}, time.Now())
	grant := policy.Pick{Grant: &policy.Grant{}}
	a := policy.Attempt{Source: "primary", Outcome: policy.Transient, HTTPStatus: 503}
	r.Picked(c, grant)
	r.Settled(c, a, policy.Recorded{})
	if n := testing.AllocsPerRun(100, func() {
		r.Picked(c, grant)
		r.Settled(c, a, policy.Recorded{})
	}); n != 0 {
		t.Errorf("%v allocations per grant and outcome, want 0", n)
	}
}
