package server

import (
	"context"
	"maps"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
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

// The sweep reads only the calls no RPC is in, in the order they went idle:
// it forgets exactly the live calls a scan of every live call would (idle,
// and idle for calls.idle_timeout), over random opens, RPCs, ends, reloads
// of the timeout and steps of the clock.
func TestSweepForgetsWhatAFullScanWould(t *testing.T) {
	for seed := range uint64(50) {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			s := newSessions(1000, 10*time.Second)
			cfg, err := config.Parse([]byte("scopes:\n  scope:\n    sources: [{name: only}]\n"), nil)
			if err != nil {
				t.Fatal(err)
			}
			sc := policy.NewScope(cfg.Scopes["scope"], inmem.New(time.Now), policy.Options{})
			defer sc.Close()
			var all []*session
			for step := range 400 {
				switch op := rng.IntN(10); {
				case op < 2:
					sess, err := s.open("scope", "", 0, 0, 0, liveCap{})
					if err != nil {
						t.Fatal(err)
					}
					all = append(all, sess)
				case op < 4 && len(all) > 0: // an RPC of a call ends
					if sess := all[rng.IntN(len(all))]; sess.busy > 0 {
						if rng.IntN(4) == 0 {
							_, _, _ = sc.Cancel(context.Background(), sess.call) // its last
						}
						s.release(sess)
					}
				case op < 6 && len(all) > 0: // an RPC of a call starts
					if sess := all[rng.IntN(len(all))]; !sess.call.Ended() {
						s.acquire(sess.call.ID, "scope") // a forgotten call's is refused
					}
				case op < 7:
					s.configure(1000, time.Duration(1+rng.IntN(20))*time.Second)
				case op < 9:
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
				default:
					want := map[string]bool{}
					now := time.Now()
					for id, sess := range s.live {
						if sess.busy == 0 && now.Sub(sess.touched) >= s.idle {
							want[id] = true
						}
					}
					got := map[string]bool{}
					for _, c := range s.sweep() {
						got[c.ID] = true
					}
					if !maps.Equal(got, want) {
						t.Fatalf("seed %d step %d: sweep forgot %v, a full scan %v", seed, step, got, want)
					}
				}
			}
		})
	}
}

// BenchmarkSweepWhileCallsAreHeld: a sweep with 10 000 live calls each in an
// RPC (held in OnNoRunnable) and none idle.
func BenchmarkSweepWhileCallsAreHeld(b *testing.B) {
	s := newSessions(20000, time.Minute)
	for range 10000 {
		if _, err := s.open("scope", "", 0, 0, 0, liveCap{}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if dropped := s.sweep(); len(dropped) != 0 {
			b.Fatalf("dropped %d", len(dropped))
		}
	}
}

// A call held in OnNoRunnable keeps its session and its call, one
// allocation: keep it within the 288-byte size class (busy and the flags
// share a word so that it fits).
func TestSessionStaysSmall(t *testing.T) {
	if n := unsafe.Sizeof(sessionCall{}); n > 288 {
		t.Fatalf("a session and its call are %d bytes, more than the 288 a held call is budgeted", n)
	}
}
