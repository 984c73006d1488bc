package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// batchFixture is a Backend over a client whose calls callHook sees.
func batchFixture(t *testing.T, o redisgate.Options) (*redisgate.Backend, *callHook, *redis.Client) {
	t.Helper()
	c := redistest.Start(t).Client(t)
	h := &callHook{}
	c.AddHook(h)
	return must(redisgate.New(c, o))(t), h, c
}

// gather holds the scope's next call (made by a starter op), starts ops
// one after another, each once the one before gathers behind the held
// call, and returns release (which lets the call go; the gathered ops then
// go together in the next) and wait (for every op to return).
func gather(t *testing.T, b *redisgate.Backend, h *callHook, scope string, ops ...func()) (release, wait func()) {
	t.Helper()
	warm(t, b, scope)
	held, rel := h.holdNext()
	var wg sync.WaitGroup
	starter := gatetest.Src("zz-starter")
	wg.Go(func() { _, _ = b.Settle(context.Background(), staleSettle(scope, starter)) })
	<-held
	for i, f := range ops {
		wg.Go(f)
		deadline := time.Now().Add(30 * time.Second)
		for b.Gathering(scope) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("op %d not gathering", i+1)
			}
			runtime.Gosched()
		}
	}
	return rel, wg.Wait
}

// TestBatchSameAsMemory: random calls of several ops (admits with and
// without waiters, over several candidates; settles of permits held, with
// handoffs) answer as the memory backend answers the same ops one at a
// time in the order a call runs them: its settles first, then its admits,
// each in arrival order.
func TestBatchSameAsMemory(t *testing.T) {
	clock := gatetest.NewClock()
	b, h, _ := batchFixture(t, redisgate.Options{Clock: clock.Now})
	mem := inmem.New(clock.Now)
	ctx := testCtx(t)
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		scope := fmt.Sprint("random-", seed)
		var srcs []*gate.Source
		for _, n := range []string{"a", "b", "c"} {
			srcs = append(srcs, gatetest.Src(n, func(s *gate.Source) {
				s.Limits.MaxConcurrency = 1 + rng.IntN(3)
				s.Limits.RPM = []int64{0, 0, 4}[rng.IntN(3)]
				s.Limits.TPM = []int64{0, 0, 90}[rng.IntN(3)]
				s.Limits.Lease = time.Duration(500+rng.IntN(3000)) * time.Millisecond
				s.Breaker.FailThreshold = 2
			}))
		}
		type held struct{ mem, red gate.Permit }
		var permits []held
		next := 0
		for round := range 12 {
			type step struct {
				admit  *gate.AdmitRequest
				settle *gate.SettleRequest
				p      held
			}
			var steps []step
			for range 1 + rng.IntN(8) {
				if len(permits) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(permits))
					p := permits[i]
					permits = slices.Delete(permits, i, i+1)
					v := []gate.Verdict{gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictNone, gate.VerdictForceOpen}[rng.IntN(4)]
					src := srcs[slices.IndexFunc(srcs, func(s *gate.Source) bool { return s.Name == p.mem.Source })]
					steps = append(steps, step{settle: &gate.SettleRequest{Scope: scope, Source: src, Verdict: v,
						ActualTokens: int64(rng.IntN(50)) - 10, Progress: v == gate.VerdictSuccess,
						Line: &gate.LineHandoff{Replica: "r", Lease: time.Second}}, p: p})
					continue
				}
				next++
				r := &gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("p", next), Tokens: int64(rng.IntN(40))}
				for _, i := range rng.Perm(3)[:1+rng.IntN(3)] {
					r.Candidates = append(r.Candidates, gate.Candidate{Source: srcs[i], Ceiling: srcs[i].Limits.MaxConcurrency})
				}
				if rng.IntN(2) == 0 {
					r.Line = &gate.Waiter{ID: fmt.Sprint("w", rng.IntN(4)), Replica: "r", Tenant: "t", Weight: 1, OtherWeight: 1, MaxTenants: 4, Lease: time.Second}
				}
				steps = append(steps, step{admit: r})
			}
			answers := make([]any, len(steps))
			ops := make([]func(), len(steps))
			for i, s := range steps {
				ops[i] = func() {
					if s.admit != nil {
						answers[i] = must(b.Admit(ctx, *s.admit))(t)
						return
					}
					r := *s.settle
					r.PermitID, r.Epoch, r.Probe = s.p.red.ID, s.p.red.Epoch, s.p.red.Probe
					answers[i] = must(b.Settle(ctx, r))(t)
				}
			}
			release, wait := gather(t, b, h, scope, ops...)
			release()
			wait()
			order := slices.Clone(steps)
			slices.SortStableFunc(order, func(x, y step) int {
				if (x.admit == nil) == (y.admit == nil) {
					return 0
				}
				if x.admit == nil {
					return -1
				}
				return 1
			})
			for _, s := range order {
				i := slices.IndexFunc(steps, func(x step) bool { return x.admit == s.admit && x.settle == s.settle })
				if s.admit != nil {
					want := must(mem.Admit(ctx, *s.admit))(t)
					got := answers[i].(gate.Admission)
					if got.Granted != want.Granted || got.Permit != want.Permit || !reflect.DeepEqual(got.Rejections, want.Rejections) ||
						len(got.Places)+len(want.Places) > 0 && !reflect.DeepEqual(got.Places, want.Places) {
						t.Fatalf("seed %d round %d admit %s:\nredis  %+v\nmemory %+v", seed, round, s.admit.PermitID, got, want)
					}
					if got.Granted {
						permits = append(permits, held{want.Permit, got.Permit})
					}
					continue
				}
				r := *s.settle
				r.PermitID, r.Epoch, r.Probe = s.p.mem.ID, s.p.mem.Epoch, s.p.mem.Probe
				want := must(mem.Settle(ctx, r))(t)
				got := answers[i].(gate.Settlement)
				if got.Released != want.Released || got.Effect != want.Effect || got.Breaker != want.Breaker || got.Handoff != want.Handoff {
					t.Fatalf("seed %d round %d settle %s:\nredis  %+v\nmemory %+v", seed, round, r.PermitID, got, want)
				}
			}
			clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
	}
	if !slices.ContainsFunc(h.takeSizes(), func(n int) bool { return n > 3 }) {
		t.Fatal("no call of several ops")
	}
}

// TestBatchOpRaisesAlone: an op whose source's record cannot be read fails
// alone; the others of its call are answered.
func TestBatchOpRaisesAlone(t *testing.T) {
	b, h, c := batchFixture(t, redisgate.Options{})
	ctx := testCtx(t)
	good, bad := gatetest.Src("good"), gatetest.Src("bad")
	must(c.Set(ctx, b.SourceKey("raise", "bad", "state"), "\xc1", 0).Result())(t) // no msgpack value
	var okErr, badErr error
	release, wait := gather(t, b, h, "raise",
		func() { _, badErr = b.Admit(ctx, admitReq("raise", "p1", bad)) },
		func() { _, okErr = b.Admit(ctx, admitReq("raise", "p2", good)) })
	release()
	wait()
	if okErr != nil || badErr == nil || errors.Is(badErr, gate.ErrUnavailable) {
		t.Fatalf("good: %v; bad: %v (want a script error)", okErr, badErr)
	}
}

// TestBatchOpsShareACall: ops that arrive while a call of their scope is
// in flight go out together, as the next call.
func TestBatchOpsShareACall(t *testing.T) {
	b, h, _ := batchFixture(t, redisgate.Options{})
	ctx := testCtx(t)
	src := gatetest.Src("s")
	var ops []func()
	for i := range 10 {
		ops = append(ops, func() { must(b.Admit(ctx, admitReq("share", fmt.Sprint("p", i), src)))(t) })
	}
	release, wait := gather(t, b, h, "share", ops...)
	release()
	wait()
	if sizes := h.takeSizes(); sizes[len(sizes)-1] != 10 {
		t.Fatalf("calls of %v ops, want the last of 10", sizes)
	}
	if s := b.BatchStats(); s.Ops < 11 || s.Calls > s.Ops {
		t.Fatalf("stats %+v", s)
	}
}

// TestBatchCallerGivesUp: an admit whose caller gives up while it gathers
// is never sent; a settle is sent all the same; a permit granted to a
// caller that gave up after its op was sent is given back.
func TestBatchCallerGivesUp(t *testing.T) {
	b, h, _ := batchFixture(t, redisgate.Options{})
	ctx := testCtx(t)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
	p := must(b.Admit(ctx, admitReq("gone", "held", src)))(t).Permit
	gone, cancel := context.WithCancel(ctx)
	release, wait := gather(t, b, h, "gone",
		func() { _, _ = b.Admit(gone, admitReq("gone", "dropped", src)) },
		func() {
			_, _ = b.Settle(gone, gate.SettleRequest{Scope: "gone", Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1})
		})
	h.takeSizes()
	cancel()
	for b.Gathering("gone") != 1 {
		runtime.Gosched()
	}
	release()
	wait()
	if sizes := h.takeSizes(); !slices.Equal(sizes, []int{1}) {
		t.Fatalf("calls of %v ops after the starter's, want the settle alone", sizes)
	}
	// The settle's caller gave up before its call was answered: wait for
	// the call, not for the caller.
	for deadline := time.Now().Add(10 * time.Second); inFlight(t, b, "gone", src) != 0; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("in flight not 0 within 10s of the settle, want 0")
		}
	}

	// Given up after the op was sent: the grant is nobody's.
	held, rel := h.holdNext()
	late, cancelLate := context.WithCancel(ctx)
	done := make(chan error)
	go func() { _, err := b.Admit(late, admitReq("gone", "late", src)); done <- err }()
	<-held
	cancelLate()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("admit after its caller gave up: %v", err)
	}
	rel()
	runGiveBacks(t, b)
	waitFor(t, func() bool { return inFlight(t, b, "gone", src) == 0 }, "the late grant given back")
}

// TestBatchQueueBound: past the bound of waiting ops an op fails at once
// as unavailable, and a settle is kept for Redis.
func TestBatchQueueBound(t *testing.T) {
	defer redisgate.SetMaxQueuedOps(1)()
	b, h, _ := batchFixture(t, redisgate.Options{})
	ctx := testCtx(t)
	src := gatetest.Src("s")
	release, wait := gather(t, b, h, "bound", func() { _, _ = b.Admit(ctx, admitReq("bound", "p1", src)) })
	_, err := b.Admit(ctx, admitReq("bound", "p2", src))
	_, serr := b.Settle(ctx, gate.SettleRequest{Scope: "bound", Source: src, PermitID: "p0", Verdict: gate.VerdictSuccess, ActualTokens: -1})
	release()
	wait()
	if !errors.Is(err, gate.ErrUnavailable) || !errors.Is(serr, gate.ErrUnavailable) {
		t.Fatalf("past the bound: admit %v, settle %v; want unavailable", err, serr)
	}
	if q := b.GiveBacks().Queued; q != 1 {
		t.Fatalf("%d settles kept, want 1", q)
	}
}

// TestBatchFailedCallOwes: a call that fails gives back each of its
// admits (each may have granted) and repeats each of its settles once Redis
// answers again.
func TestBatchFailedCallOwes(t *testing.T) {
	b, h, _ := batchFixture(t, redisgate.Options{Timeout: 200 * time.Millisecond})
	ctx := testCtx(t)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 3 })
	p := must(b.Admit(ctx, admitReq("owe", "held", src)))(t).Permit
	h.failing(true)
	_, aerr := b.Admit(ctx, admitReq("owe", "lost", src))
	_, serr := b.Settle(ctx, gate.SettleRequest{Scope: "owe", Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1})
	if !errors.Is(aerr, gate.ErrUnavailable) || !errors.Is(serr, gate.ErrUnavailable) {
		t.Fatalf("failed call: admit %v, settle %v; want unavailable", aerr, serr)
	}
	// (A caller's own timeout may answer it before its call fails.)
	waitFor(t, func() bool { return b.GiveBacks().Queued == 2 }, "both owed")
	h.failing(false)
	runGiveBacks(t, b)
	waitFor(t, func() bool { return b.GiveBacks().Queued == 0 }, "the owed settles confirmed")
	if n := inFlight(t, b, "owe", src); n != 0 {
		t.Fatalf("in flight %d, want 0", n)
	}
}

// warm makes the scope known to Redis and to b (its marker), so that its
// next admits are not a first look.
func warm(t *testing.T, b *redisgate.Backend, scope string) {
	t.Helper()
	src := gatetest.Src("zz-warm")
	p := must(b.Admit(context.Background(), admitReq(scope, "warm-"+scope, src)))(t).Permit
	must(b.Settle(context.Background(), gate.SettleRequest{Scope: scope, Source: src, PermitID: p.ID, Epoch: p.Epoch, ActualTokens: -1}))(t)
}

func admitReq(scope, id string, srcs ...*gate.Source) gate.AdmitRequest {
	r := gate.AdmitRequest{Scope: scope, PermitID: id}
	for _, s := range srcs {
		r.Candidates = append(r.Candidates, gate.Candidate{Source: s, Ceiling: s.Limits.MaxConcurrency})
	}
	return r
}

func inFlight(t *testing.T, b *redisgate.Backend, scope string, src *gate.Source) int {
	t.Helper()
	return must(b.Peek(context.Background(), gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}}))(t).Sources[0].Quota.InFlight
}

// runGiveBacks runs the Backend's give-back loop for the rest of the test.
func runGiveBacks(t *testing.T, b *redisgate.Backend) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.RunGiveBacks(ctx, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor waits until cond holds, failing the test after a generous bound.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
