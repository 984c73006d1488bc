package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
)

func redisChaosConfig(addr, onUnavailable string, redisTimeout, pollInterval time.Duration, maxConcurrency int, timeout, leaseGrace time.Duration) string {
	return fmt.Sprintf(`
backend:
  kind: redis
  redis: {addrs: ["%s"], timeout: %s, on_unavailable: %s}
scopes:
  chaos:
    quota_full: wait
    lease_grace: %s
    backpressure: {stall_window: 60s, poll_interval: %s}
    sources:
      - {name: primary, max_concurrency: %d, timeout: %s, attributes: {base_url: "http://127.0.0.1:1"}}
`, addr, redisTimeout, onUnavailable, leaseGrace, pollInterval, maxConcurrency, timeout)
}

// Redis stalls for 3 s (SIGSTOP, then SIGCONT) under a load of twice
// max_concurrency callers. Invariants: never more holders than
// max_concurrency; every answer during the stall within the Redis timeout
// (plus scheduling slack); once the load has drained after SIGCONT, the
// source's in_flight equals the real holders (0) within one poll_interval
// plus the Redis timeout. The test logs what it measured either way.
func TestChaos_RedisStall(t *testing.T) {
	const (
		stall          = 3 * time.Second
		maxConcurrency = 4
		callers        = 2 * maxConcurrency
		redisTimeout   = 300 * time.Millisecond
		pollInterval   = 20 * time.Millisecond
		sourceTimeout  = 5 * time.Second
		leaseGrace     = time.Second
		lease          = sourceTimeout + leaseGrace
		hold           = 20 * time.Millisecond
		// answerSlack is a loaded machine's scheduling, not a speed claim.
		answerSlack = 100 * time.Millisecond
	)
	for _, mode := range []string{"fail_closed", "local"} {
		t.Run(mode, func(t *testing.T) {
			rs := redistest.Start(t)
			sc := startChaosSidecar(t, redisChaosConfig(rs.Addr, mode, redisTimeout, pollInterval, maxConcurrency, sourceTimeout, leaseGrace))
			ctx := ctxT(t)
			load := startLoad(t, sc.raw, "chaos", callers, maxConcurrency, hold, pollInterval)
			ctl := startControl(t, sc.conn, pollInterval)
			eventually(t, "the load is granted permits", func() bool { return load.grants.Load() >= 20 })

			stopped := time.Now()
			rs.Pause()
			time.Sleep(stall) // the fault's length, the scenario's parameter
			rs.Resume()
			resumed := time.Now()
			load.drain()
			drained := time.Now()
			free := waitInFlight(ctx, sc, load, "chaos", "primary")
			if free.freeAt.IsZero() {
				t.Fatalf("in_flight %d never came back to the real holders (0) within %v of SIGCONT (shared backend back: %v)", free.inFlight, timeout, !free.backAt.IsZero())
			}
			// The clock of "slots free again" starts when the load has
			// drained and the sidecar reads Redis again, whichever is later.
			from := drained
			if free.backAt.After(from) {
				from = free.backAt
			}

			during := load.stats(stopped, resumed)
			t.Logf("%s: Redis stopped %v; during the stall: %v (redis timeout %v)", mode, stall, during, redisTimeout)
			t.Logf("%s: after SIGCONT: load drained in %v, Redis read again after %v with in_flight %d, in_flight equal to the real holders (0) %v after SIGCONT (lease %v, bound poll_interval + timeout = %v)",
				mode, drained.Sub(resumed).Round(time.Millisecond), free.backAt.Sub(resumed).Round(time.Millisecond), free.firstInFlight,
				free.freeAt.Sub(resumed).Round(time.Millisecond), lease, pollInterval+redisTimeout)
			t.Logf("%s: whole run: %v; peak holders %d of max_concurrency %d", mode, load.stats(time.Time{}, time.Now()), load.peak.Load(), maxConcurrency)

			if v := load.violations.Load(); v > 0 {
				t.Errorf("%d grants made more than max_concurrency %d holders (peak %d)", v, maxConcurrency, load.peak.Load())
			}
			// The bound is the timeout, plus what the machine's scheduling
			// can add to an answer (the worst backend-free answer during the
			// stall: on a loaded machine a process waits for a CPU in bursts
			// that one sample does not catch), plus slack. Backend-free are
			// the control's answers (it never waits on Redis) and, with
			// local, the load's answers under the timeout during the stall:
			// the memory gate serves them, the same work as the answer that
			// waited on Redis first (a wait on the stopped Redis lasts the
			// whole timeout). With fail_closed every answer of the load
			// waits on Redis. A backend wait past the timeout still shows.
			w := during.worst
			sched := ctl.worst(stopped, resumed)
			if mode == "local" {
				sched = max(sched, load.worstBelow(stopped, resumed, redisTimeout))
			}
			t.Logf("%s: the worst answer during the stall took %v (%s) against the %v timeout; backend-free answers meanwhile took up to %v",
				mode, w.took.Round(time.Millisecond), w.rpc, redisTimeout, sched.Round(time.Millisecond))
			if w.took > redisTimeout+sched+answerSlack {
				t.Errorf("an answer during the stall took %v (%s), over the %v timeout + %v of scheduling + %v",
					w.took.Round(time.Millisecond), w.rpc, redisTimeout, sched.Round(time.Millisecond), answerSlack)
			}
			if late := free.freeAt.Sub(from); late > pollInterval+redisTimeout {
				t.Errorf("in_flight came back to the real holders %v after the load drained and Redis answered, over poll_interval + timeout = %v",
					late.Round(time.Millisecond), pollInterval+redisTimeout)
			}
		})
	}
}

// Redis is killed with SIGKILL under load and restarted on the same port,
// with AOF (appendfsync always) and without persistence. Invariants: never
// more holders than max_concurrency; an operator's FORCE_OPEN (with actor and
// reason) and a breaker OPEN by a SOURCE_DEAD outcome are still in force
// afterwards — kept by Redis with AOF, re-asserted by the sidecar, which says
// that Redis lost the scopes' state, without — and refuse Picks; once the
// load has drained, in_flight equals the real holders (0) within one
// poll_interval plus the Redis timeout.
func TestChaos_RedisKill9Restart(t *testing.T) {
	const (
		maxConcurrency = 4
		redisTimeout   = 300 * time.Millisecond
		pollInterval   = 20 * time.Millisecond
		sourceTimeout  = 5 * time.Second
		leaseGrace     = time.Second
		hold           = 20 * time.Millisecond
		cooldown       = 300 * time.Second // outlasts the test: the OPEN must still be in force at the end
		lossLine       = "redis lost the scope's state"
	)
	for _, persist := range []bool{true, false} {
		t.Run(map[bool]string{true: "aof", false: "no persistence"}[persist], func(t *testing.T) {
			var extra []string
			if persist {
				extra = redistest.AppendFsyncAlways
			}
			rs := redistest.Start(t, extra...)
			cfg := redisChaosConfig(rs.Addr, "fail_closed", redisTimeout, pollInterval, maxConcurrency, sourceTimeout, leaseGrace) +
				"  held:\n    sources: [{name: primary, attributes: {base_url: \"http://127.0.0.1:1\"}}]\n" +
				fmt.Sprintf("  dead:\n    breaker: {cooldown: %s, max_cooldown: %s}\n    sources: [{name: primary, attributes: {base_url: \"http://127.0.0.1:1\"}}]\n", cooldown, cooldown)
			sc := startChaosSidecar(t, cfg)
			ctx := ctxT(t)
			prot := sc.protect(ctx, "held", "dead")
			watch, err := sc.raw.WatchEvents(ctx, &admissionv1.WatchEventsRequest{Scope: "held"})
			if err != nil {
				t.Fatal(err)
			}
			load := startLoad(t, sc.raw, "chaos", 2*maxConcurrency, maxConcurrency, hold, pollInterval)
			eventually(t, "the load is granted permits", func() bool { return load.grants.Load() >= 20 })

			rs.Stop() // kill -9
			killed := time.Now()
			rs.Start()
			restarted := time.Now()
			eventually(t, "the load is granted permits again", func() bool {
				return load.stats(restarted, time.Now()).grants > 0
			})
			granting := time.Now()
			load.drain()
			drained := time.Now()
			free := waitInFlight(ctx, sc, load, "chaos", "primary")
			if free.freeAt.IsZero() {
				t.Fatalf("in_flight %d never came back to the real holders (0) within %v", free.inFlight, timeout)
			}
			// Without persistence the sidecar re-asserts before its next
			// admission of the scope, or in the background (every
			// poll_interval) for scopes without admissions, as here: wait
			// for it, then check.
			var held, dead *admissionv1.SourceState
			var readAt time.Time
			eventually(t, "the override and the OPEN breaker read back", func() bool {
				held, dead, readAt, err = prot.read(ctx, sc)
				return err == nil && inForce(held, dead)
			})
			t.Logf("Redis down %v; grants again %v after the restart; from the kill until then: %v",
				restarted.Sub(killed).Round(time.Millisecond), granting.Sub(restarted).Round(time.Millisecond), load.stats(killed, granting))
			t.Logf("after draining: in_flight %d, equal to the real holders (0) %v after the drain; override after the restart: %v by %q; breaker %v, reopens %d, retry_after %v; peak holders %d of %d",
				free.firstInFlight, free.freeAt.Sub(drained).Round(time.Millisecond), held.GetOverride(), held.GetOverrideActor(),
				dead.GetState(), dead.GetReopens(), dead.GetRetryAfter().AsDuration().Round(time.Second), load.peak.Load(), maxConcurrency)

			if v := load.violations.Load(); v > 0 {
				t.Errorf("%d grants made more than max_concurrency %d holders (peak %d)", v, maxConcurrency, load.peak.Load())
			}
			// A re-asserted OPEN keeps the cooldown left when the re-assert
			// was sent: it may end up to its round trip (at most the timeout)
			// later.
			prot.check(t, ctx, sc, held, dead, readAt, cooldown, map[bool]time.Duration{true: 0, false: redisTimeout}[persist])
			from := drained // or the first read of Redis after it, whichever is later
			if free.backAt.After(from) {
				from = free.backAt
			}
			if late := free.freeAt.Sub(from); late > pollInterval+redisTimeout {
				t.Errorf("in_flight came back to the real holders %v after the drain, over poll_interval + timeout = %v", late.Round(time.Millisecond), pollInterval+redisTimeout)
			}
			// DescribeScope says what this replica saw of the loss.
			for _, scope := range []string{"held", "dead", "chaos"} {
				d, err := sc.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
				if err != nil {
					t.Fatal(err)
				}
				want := map[bool]uint64{true: 0, false: 1}[persist]
				if l := d.GetScope().GetStateLoss(); l.GetCount() != want || l.GetReassertPending() || (want > 0) != (l.GetLast() != nil) {
					t.Errorf("DescribeScope(%s).state_loss = %v; want %d losses, none pending", scope, l, want)
				}
			}
			if persist {
				if strings.Contains(sc.proc.Logs(), lossLine) {
					t.Errorf("Redis with AOF kept its state, yet the sidecar logged %q", lossLine)
				}
			} else {
				eventually(t, "the sidecar says Redis lost the state", func() bool { return strings.Contains(sc.proc.Logs(), lossLine) })
				for {
					ev, err := watch.Recv()
					if err != nil {
						t.Fatalf("WatchEvents(held) ended before a backend event said the state was lost: %v", err)
					}
					if h := ev.GetBackendHealth(); h != nil && strings.Contains(h.GetDetail(), lossLine) {
						t.Logf("WatchEvents: %v", h)
						break
					}
				}
			}
		})
	}
}

// While Redis is stopped (SIGSTOP), every RPC that needs it is answered
// UNAVAILABLE with the ErrorInfo reason BACKEND_UNAVAILABLE — not
// DEADLINE_EXCEEDED while the callers' own deadlines are far off — within
// one Redis timeout (plus scheduling): an OnNoRunnable whose read joins a
// line does not wait for the leave that follows its failure too. The Go
// SDK reports it as ErrUnavailable. A scope in shadow mode grants its Picks
// and says what enforcement would have answered.
func TestChaos_RedisStallAnswersUnavailable(t *testing.T) {
	const (
		redisTimeout = 500 * time.Millisecond
		pollInterval = 50 * time.Millisecond
		waiters      = 3
		// answerSlack is a loaded machine's scheduling beyond what the
		// control saw, not a speed claim: an answer that waits for two
		// backend calls takes two timeouts, one more than the bound.
		answerSlack = 100 * time.Millisecond
	)
	rs := redistest.Start(t)
	sc := startChaosSidecar(t, fmt.Sprintf(`
backend:
  kind: redis
  redis: {addrs: ["%s"], timeout: %s, on_unavailable: fail_closed}
scopes:
  line:
    quota_full: wait
    backpressure: {stall_window: 300s, poll_interval: %s}
    sources: [{name: only, max_concurrency: 1, attributes: {base_url: "http://127.0.0.1:1"}}]
  shadowed:
    mode: shadow
    sources: [{name: a, tpm: 1000, attributes: {base_url: "http://127.0.0.1:1"}}, {name: b, tpm: 1000, attributes: {base_url: "http://127.0.0.1:1"}}]
`, rs.Addr, redisTimeout, pollInterval))
	ctx := ctxT(t)
	if p, err := sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "line"}); err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick: %v %v; want the only slot", p, err)
	}
	var refused []string
	for range waiters {
		p, err := sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "line"})
		if err != nil || p.GetNoRunnable() == nil {
			t.Fatalf("Pick: %v %v; want a refusal", p, err)
		}
		refused = append(refused, p.GetCallId())
	}
	sdk, err := polygate.Dial(sc.proc.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdk.Close() })
	ctl := startControl(t, sc.conn, pollInterval)

	stopped := time.Now()
	rs.Pause()
	t.Cleanup(rs.Resume)
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	ask := func(rpc string, call func() error) {
		wg.Go(func() {
			start := time.Now()
			err := call()
			a := answer{rpc: rpc, start: start, took: time.Since(start), code: status.Code(err)}
			if a.code != codes.Unavailable || errorReason(err) != admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE.String() {
				t.Errorf("%s during the stall: %v; want UNAVAILABLE with BACKEND_UNAVAILABLE", rpc, err)
			}
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		})
	}
	for _, id := range refused {
		ask("OnNoRunnable", func() error {
			_, err := sc.raw.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "line", CallId: id})
			return err
		})
	}
	ask("Pick", func() error {
		_, err := sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "line"})
		return err
	})
	wg.Wait()
	_, sdkErr := polygate.Do(ctx, sdk, "line", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		t.Error("an attempt ran while Redis was stopped")
		return 0, polygate.Result{Outcome: polygate.Success}
	})
	var shadow [2]*admissionv1.PickResponse
	var shadowErr [2]error
	for i, tokens := range []int64{100, 5000} {
		shadow[i], shadowErr[i] = sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "shadowed", EstimatedTokens: tokens})
	}
	sched := ctl.worst(stopped, time.Now())
	rs.Resume()

	if !errors.Is(sdkErr, polygate.ErrUnavailable) {
		t.Errorf("the Go SDK's call during the stall: %v; want ErrUnavailable", sdkErr)
	}
	for i, want := range []admissionv1.ErrorReason{admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE, admissionv1.ErrorReason_ERROR_REASON_ESTIMATE_TOO_LARGE} {
		if g := shadow[i].GetGrant(); shadowErr[i] != nil || !g.GetShadow() || g.GetShadowError() != want {
			t.Errorf("shadow Pick %d during the stall: %v %v; want a shadow grant with shadow_error %v", i, shadow[i], shadowErr[i], want)
		}
	}
	for _, a := range answers {
		t.Logf("%s answered %v after %v (Redis timeout %v; the machine's scheduling meanwhile up to %v)", a.rpc, a.code, a.took.Round(time.Millisecond), redisTimeout, sched.Round(time.Millisecond))
		if a.took > redisTimeout+sched+answerSlack {
			t.Errorf("%s took %v during the stall, over the %v timeout + %v of scheduling + %v", a.rpc, a.took.Round(time.Millisecond), redisTimeout, sched.Round(time.Millisecond), answerSlack)
		}
	}
}

// errorReason is the ErrorInfo reason of a gRPC error ("" if none).
func errorReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// Replica K1 opens a breaker with SOURCE_DEAD and forces another open;
// replica K2, started after, only sees them (its Picks are refused). K1 is killed, then
// Redis restarts empty. K2 re-asserts what it saw before it grants
// anything: it grants neither source, not once in 200 Picks of each, and
// its reads show both in force.
func TestChaos_RedisLossAfterTheSetterLeft(t *testing.T) {
	const cooldown = 300 * time.Second
	rs := redistest.Start(t)
	cfg := redisChaosConfig(rs.Addr, "fail_closed", 300*time.Millisecond, 20*time.Millisecond, 4, 5*time.Second, time.Second) +
		"  held:\n    sources: [{name: primary, attributes: {base_url: \"http://127.0.0.1:1\"}}]\n" +
		fmt.Sprintf("  dead:\n    breaker: {cooldown: %s, max_cooldown: %s}\n    sources: [{name: primary, attributes: {base_url: \"http://127.0.0.1:1\"}}]\n", cooldown, cooldown)
	k1 := startChaosSidecar(t, cfg)
	ctx := ctxT(t)
	prot := k1.protect(ctx, "held", "dead")
	k2 := startChaosSidecar(t, cfg) // it hears no announcement of them
	refused := func(scope string) bool {
		pk, err := k2.raw.Pick(ctx, &admissionv1.PickRequest{Scope: scope})
		if err != nil {
			t.Fatalf("K2 Pick(%s): %v", scope, err)
		}
		return pk.GetGrant() == nil
	}
	eventually(t, "K2's Picks refused on both", func() bool { return refused("held") && refused("dead") })
	k1.kill9()
	rs.Stop()
	rs.Start()
	for i := range 200 {
		for _, scope := range []string{"held", "dead"} {
			if !refused(scope) {
				t.Fatalf("K2 granted %s at Pick %d after Redis restarted empty", scope, i+1)
			}
		}
	}
	held, dead, _, err := prot.read(ctx, k2)
	if err != nil || !inForce(held, dead) {
		t.Fatalf("K2 reads after the loss: %v, %v, %v; want both in force", held, dead, err)
	}
}
