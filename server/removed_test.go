package server

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// A reload that removes a scope tells the calls held in OnNoRunnable at
// once: scope_removed, and the call ends. The calls that waited in its lines
// and never came back leave them too, so that the lines are empty when the
// scope comes back.
func TestRemovedScopeTellsItsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const base = `
scopes:
  chat:
    sources: [{name: primary}]
`
		const batch = `  batch:
    quota_full: wait
    backpressure: {stall_window: 300s, poll_interval: 10s}
    sources: [{name: only, max_concurrency: 1}]
`
		parse := func(yaml string) *config.Config {
			t.Helper()
			cfg, err := config.Parse([]byte(yaml), nil)
			if err != nil {
				t.Fatal(err)
			}
			return cfg
		}
		h := start(t, harnessOpts{yaml: base + batch})
		h.pick(t, &admissionv1.PickRequest{Scope: "batch"}) // holds the only slot
		refused := func() string {
			t.Helper()
			p := h.pick(t, &admissionv1.PickRequest{Scope: "batch"})
			if p.GetNoRunnable() == nil {
				t.Fatalf("Pick: %v; want a refusal", p)
			}
			return p.GetCallId()
		}
		// One call waits in line and leaves with its RPC's deadline: it is
		// between two RPCs when the scope goes, and never comes back.
		gone := refused()
		short, cancel := context.WithTimeout(h.ctx, time.Second)
		if d, err := h.client.OnNoRunnable(short, &admissionv1.OnNoRunnableRequest{Scope: "batch", CallId: gone}); err != nil || d.GetWait() == nil {
			t.Fatalf("OnNoRunnable with a 1s deadline: %v %v; want a Wait", d, err)
		}
		cancel()
		// Another is held in OnNoRunnable when the scope goes.
		held := refused()
		answer := make(chan *admissionv1.OnNoRunnableResponse, 1)
		go func() {
			d, err := h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "batch", CallId: held})
			if err != nil {
				t.Errorf("OnNoRunnable of the held call: %v", err)
			}
			answer <- d
		}()
		synctest.Wait()
		if line := h.line(t, "batch"); line != 2 {
			t.Fatalf("line of %d before the reload; want the 2 waiters", line)
		}

		removed := time.Now()
		h.srv.Apply(parse(base))
		d := <-answer
		if f := d.GetFailure(); f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED || time.Since(removed) != 0 {
			t.Fatalf("the held call was answered %v after %v; want Failure scope_removed at once", d, time.Since(removed))
		}
		if _, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "batch", CallId: held}); err == nil {
			t.Fatal("the held call went on after scope_removed; want it ended")
		}

		h.srv.Apply(parse(base + batch))
		synctest.Wait()
		if line := h.line(t, "batch"); line != 0 {
			t.Fatalf("line of %d when the scope came back; want none of the removed scope's waiters in it", line)
		}
	})
}

// line is the length of the first source's line of a scope.
func (h *harness) line(t *testing.T, scope string) int32 {
	t.Helper()
	d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return d.GetScope().GetSources()[0].GetLine().GetLength()
}
