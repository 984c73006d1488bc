package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// A reload that removes a scope strands nothing: the calls holding its
// permits can still report (RecordOutcome) or cancel, which frees their
// slots and ends them with scope_removed; new Picks answer NOT_FOUND; when the
// scope comes back, its slots are free.
func TestReload_RemovedScopeStrandsNothing(t *testing.T) {
	const base = `
scopes:
  chat:
    sources: [{name: a}]
`
	const extra = `  batch:
    circuit_open: wait
    sources: [{name: a, max_concurrency: 2}]
`
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(config string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base + extra)
	sc := sidecartest.Start(t, []string{"--config", file, "--listen", "127.0.0.1:0"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", sc.Logs())
		}
	})
	c := dial(t, sc.Addr, insecure.NewCredentials())
	ctx := ctxT(t)
	inFlight := func() int32 {
		t.Helper()
		d, err := c.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "batch"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetScope().GetSources()[0].GetInFlight()
	}

	// Two calls hold both slots of batch.
	var held [2]*admissionv1.PickResponse
	for i := range held {
		p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch"})
		if err != nil || p.GetGrant() == nil {
			t.Fatalf("Pick %d: %v %v; want a grant", i, p, err)
		}
		held[i] = p
	}
	if n := inFlight(); n != 2 {
		t.Fatalf("in_flight %d with two permits held; want 2", n)
	}

	write(base)
	sc.Signal(t, syscall.SIGHUP)
	eventually(t, "the reload removes batch", func() bool {
		_, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch"})
		return status.Code(err) == codes.NotFound
	})

	r, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "batch", CallId: held[0].GetCallId(),
		PermitId: held[0].GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT})
	if err != nil {
		t.Fatalf("RecordOutcome of a removed scope's permit: %v; want an answer", err)
	}
	if f := r.GetFailure(); f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED {
		t.Fatalf("RecordOutcome answered %v; want Failure scope_removed", r)
	}
	again, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "batch", CallId: held[0].GetCallId(),
		PermitId: held[0].GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT})
	if err != nil || again.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED {
		t.Fatalf("the same report again: %v %v; want the same answer", again, err)
	}
	cancelled, err := c.CancelCall(ctx, &admissionv1.CancelCallRequest{Scope: "batch", CallId: held[1].GetCallId()})
	if err != nil || !cancelled.GetEndedNow() {
		t.Fatalf("CancelCall of a removed scope's call: %v %v; want ended now", cancelled, err)
	}
	if _, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch", CallId: held[0].GetCallId()}); status.Code(err) != codes.NotFound {
		t.Fatalf("Pick on the removed scope: %v; want NOT_FOUND", err)
	}

	write(base + extra)
	sc.Signal(t, syscall.SIGHUP)
	eventually(t, "the reload adds batch back", func() bool {
		_, err := c.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "batch"})
		return err == nil
	})
	if n := inFlight(); n != 0 {
		t.Fatalf("in_flight %d after the holders reported; want 0", n)
	}
	for i := range 2 {
		if p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch"}); err != nil || p.GetGrant() == nil {
			t.Fatalf("Pick %d after batch came back: %v %v; want a grant (its slots are free)", i, p, err)
		}
	}
}

// A reload that removes a scope answers the calls held in its OnNoRunnable
// at once with scope_removed, which ends them; when the scope comes back,
// its line holds none of them.
func TestReload_RemovedScopeTellsItsWaiters(t *testing.T) {
	const base = `
scopes:
  chat:
    sources: [{name: a}]
`
	const extra = `  batch:
    quota_full: wait
    backpressure: {stall_window: 300s, poll_interval: 50ms}
    sources: [{name: a, max_concurrency: 1}]
`
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(config string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base + extra)
	sc := sidecartest.Start(t, []string{"--config", file, "--listen", "127.0.0.1:0"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", sc.Logs())
		}
	})
	c := dial(t, sc.Addr, insecure.NewCredentials())
	ctx := ctxT(t)
	line := func() int32 {
		t.Helper()
		d, err := c.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "batch"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetScope().GetSources()[0].GetLine().GetLength()
	}
	if p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch"}); err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick: %v %v; want a grant", p, err)
	}
	const waiters = 3
	answers := make(chan *admissionv1.OnNoRunnableResponse, waiters)
	for range waiters {
		p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "batch"})
		if err != nil || p.GetNoRunnable() == nil {
			t.Fatalf("Pick: %v %v; want a refusal", p, err)
		}
		go func() {
			d, err := c.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "batch", CallId: p.GetCallId()})
			if err != nil {
				t.Errorf("OnNoRunnable: %v", err)
			}
			answers <- d
		}()
	}
	eventually(t, "the waiters are held in line", func() bool { return line() == waiters })

	write(base)
	reload := time.Now()
	sc.Signal(t, syscall.SIGHUP)
	for range waiters {
		d := <-answers
		if f := d.GetFailure(); f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED {
			t.Fatalf("a held call was answered %v after the reload; want Failure scope_removed", d)
		}
	}
	t.Logf("%d held calls answered scope_removed within %v of SIGHUP", waiters, time.Since(reload).Round(time.Millisecond))

	write(base + extra)
	sc.Signal(t, syscall.SIGHUP)
	eventually(t, "the reload adds batch back", func() bool {
		_, err := c.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "batch"})
		return err == nil
	})
	if n := line(); n != 0 {
		t.Fatalf("line of %d when batch came back; want none of the removed scope's waiters", n)
	}
}
