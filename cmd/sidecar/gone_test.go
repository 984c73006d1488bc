package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCallersGoneBetweenRPCsDoNotHoldTheLine: callers that wait in line
// once, are answered Wait at their RPC's deadline and leave without a word
// (no CancelCall) cost a live caller behind them at most one poll interval
// plus one lease in total, however many: each place lapses on its own
// clock. On Redis also with the live caller on another sidecar, where only
// the fleet's line knows of the callers gone.
func TestCallersGoneBetweenRPCsDoNotHoldTheLine(t *testing.T) {
	const poll = 50 * time.Millisecond
	lease := max(3*poll, time.Second) // the line's lease (docs/configuration.md, the line)
	scope := fmt.Sprintf(`  chat:
    quota_full: wait
    backpressure: {poll_interval: %v}
    sources: [{name: only, max_concurrency: 1, timeout: 20s}]
`, poll)
	for _, setup := range []struct {
		name  string
		be    orderBackend
		fleet bool // the live caller on another sidecar
	}{
		{"Memory", orderBackends[0], false},
		{"Redis", orderBackends[1], false},
		{"RedisFleet", orderBackends[1], true},
	} {
		for _, n := range []int{20, 40} {
			t.Run(fmt.Sprint(setup.name, "/", n), func(t *testing.T) {
				backend := setup.be.config(t)
				_, client := startScope(t, scope, backend)
				liveClient := client
				if setup.fleet {
					_, liveClient = startScope(t, scope, backend)
				}
				q := newQueue(t, client, "chat", 0)
				release := q.hold()
				var gone sync.WaitGroup
				var waited atomic.Int32
				for i := range n {
					gone.Go(func() {
						if leaveAfterOneWait(t, q.ctx, client, i) {
							waited.Add(1)
						}
					})
				}
				gone.Wait()
				// A caller whose RPC deadline passed before the answer came
				// left with its RPC (and the line at once): the others are
				// the callers gone between two RPCs.
				t.Logf("%d of %d callers answered Wait before leaving", waited.Load(), n)
				if waited.Load() == 0 {
					t.Fatal("no caller was answered Wait: none left between two RPCs")
				}

				granted := make(chan time.Time, 1)
				waitLive(t, q.ctx, liveClient, granted)
				if setup.fleet {
					// A live caller behind it on the first sidecar keeps that
					// sidecar heard of by the line, as a busy replica is: the
					// places of the callers gone do not leave with it.
					ctx, cancel := context.WithCancel(q.ctx)
					t.Cleanup(cancel)
					waitLive(t, ctx, client, nil)
				}
				start := time.Now()
				release()
				select {
				case at := <-granted:
					took := at.Sub(start)
					t.Logf("%d callers gone: the live caller granted %v after the release", n, took.Round(time.Millisecond))
					if took > poll+lease {
						t.Fatalf("%d callers gone cost the live caller %v, want at most a poll interval and a lease (%v)", n, took.Round(time.Millisecond), poll+lease)
					}
				case <-q.ctx.Done():
					t.Fatalf("the live caller was not granted within %v of the release", time.Since(start).Round(time.Millisecond))
				}
			})
		}
	}
}

// leaveAfterOneWait opens a call that is refused, waits in line once under
// a 300 ms RPC deadline and leaves without a word. It reports whether the
// wait was answered Wait (on a busy machine the answer, due just before the
// deadline, may come after it: the RPC then ends DeadlineExceeded).
func leaveAfterOneWait(t *testing.T, ctx context.Context, c admissionv1.AdmissionServiceClient, i int) bool {
	p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || p.GetNoRunnable() == nil {
		t.Errorf("caller %d: %v %v, want a refusal", i, p, err)
		return false
	}
	rpc, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	d, err := c.OnNoRunnable(rpc, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
	if status.Code(err) == codes.DeadlineExceeded {
		return false
	}
	if err != nil || d.GetWait() == nil {
		t.Errorf("caller %d: OnNoRunnable: %v %v, want a wait", i, d, err)
	}
	return d.GetWait() != nil
}

// waitLive starts a live caller that Picks and waits until granted (then
// sends the time on granted, if any), and returns once its first Pick is
// refused.
// It stops quietly when ctx ends.
func waitLive(t *testing.T, ctx context.Context, c admissionv1.AdmissionServiceClient, granted chan<- time.Time) {
	t.Helper()
	refused := make(chan struct{})
	go func() {
		req := &admissionv1.PickRequest{Scope: "chat"}
		for first := true; ; first = false {
			p, err := c.Pick(ctx, req)
			if err == nil && p.GetGrant() != nil {
				if granted != nil {
					granted <- time.Now()
				}
				return
			}
			if err == nil && p.GetNoRunnable() == nil {
				err = fmt.Errorf("%v, want a grant or a refusal", p)
			}
			if err == nil {
				if first {
					close(refused)
				}
				req.CallId = p.GetCallId()
				_, err = c.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
			}
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("live caller: %v", err)
				}
				return
			}
		}
	}()
	select {
	case <-refused:
	case <-ctx.Done():
		t.Fatal("the live caller was never refused")
	}
}
