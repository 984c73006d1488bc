package server

import (
	"testing"
	"testing/synctest"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"google.golang.org/grpc/codes"
)

// An ended call keeps answering its last RecordOutcome the same way for at
// least endedRetention, however often the sessions are swept, and is
// forgotten by the time its generation is dropped.
func TestEndedCallsAreRememberedForTheirRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{})
		sweepFor := func(d time.Duration) {
			for step := time.Second; d > 0; d -= step {
				time.Sleep(min(step, d))
				h.srv.Sweep()
			}
		}
		sweepFor(7 * time.Second) // not aligned with a generation
		p := h.pick(t, &admissionv1.PickRequest{Scope: "other"})
		first := h.record(t, "other", p, admissionv1.Outcome_OUTCOME_SUCCESS)
		if first.GetDone() == nil {
			t.Fatalf("RecordOutcome: %v, want Done", first)
		}
		if n := h.srv.LiveCalls("other"); n != 0 {
			t.Fatalf("live calls after the end: %d, want 0", n)
		}
		sweepFor(endedRetention - time.Millisecond)
		if again := h.record(t, "other", p, admissionv1.Outcome_OUTCOME_SUCCESS); again.GetDone() == nil || again.Effect != first.Effect {
			t.Fatalf("RecordOutcome again within the retention: %v, want %v", again, first)
		}
		sweepFor(endedRetention / (endedGenerations - 1))
		_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "other", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
		wantStatus(t, err, codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_CALL, "")
	})
}

// A clock that jumps past every generation forgets every ended call at once,
// and the idle live calls as before.
func TestEndedCallsAfterAClockJump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, harnessOpts{}) // calls.idle_timeout: 1m
		ended := h.pick(t, &admissionv1.PickRequest{Scope: "other"})
		h.record(t, "other", ended, admissionv1.Outcome_OUTCOME_SUCCESS)
		h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
		time.Sleep(4 * endedRetention) // past every generation, within the harness's RPC timeout
		if dropped := h.srv.calls.sweep(); len(dropped) != 1 {
			t.Fatalf("sweep dropped %d idle calls, want 1", len(dropped))
		}
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other", CallId: ended.CallId})
		wantStatus(t, err, codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_CALL, "")
		if n := h.srv.LiveCalls("chat"); n != 0 {
			t.Fatalf("idle live call after the jump: %d live, want it expired", n)
		}
	})
}
