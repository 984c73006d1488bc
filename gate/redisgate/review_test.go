package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestGiveBackOfLostProbeEndsTheProbe: an Admit whose reply is lost while
// it took a HALF_OPEN breaker's probe (Redis stalled, the FCALL ran on
// resume) is given back without a verdict, as every lost Admit; the
// give-back is that probe's outcome and must end its lease ("every outcome
// of the probe ends its lease"), so that the next entrant probes. The
// give-back knows neither epoch nor probe flag: settled as stale, it leaves
// the probe held by nobody and the source refusing everyone
// (probe_in_flight) until the probe's TTL ends. The Backend's clock is a
// test clock that does not move, so the TTL never ends here.
func TestGiveBackOfLostProbeEndsTheProbe(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second, Clock: clock.Now})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	const scope = "lost-probe"
	src := gatetest.Src("s", func(s *gate.Source) { s.Breaker.FailThreshold = 1 })
	eventually(t, ctx, "a first admission", func() bool {
		a, err := b.Admit(ctx, admitReq(scope, "warm", src))
		if err == nil && a.Granted {
			_, _ = b.Settle(ctx, settleReq(scope, src, a.Permit, gate.VerdictSuccess))
		}
		return err == nil
	})
	waitQueue(t, ctx, b)
	openBreaker(t, ctx, b, scope, src)
	clock.Advance(2 * src.Breaker.Cooldown)

	srv.Pause()
	_, err := b.Admit(ctx, admitReq(scope, "lost", src))
	srv.Resume()
	if !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("Admit on a stalled Redis = %v, want gate.ErrUnavailable", err)
	}
	waitQueue(t, ctx, b)
	if v := peek(t, ctx, b, scope, src).Breaker; v.State != gate.HalfOpen {
		t.Fatalf("breaker after the stalled Admit ran: %+v, want HALF_OPEN (it took the probe)", v)
	}
	a := admit(t, ctx, b, scope, "next", src)
	if !a.Granted || !a.Permit.Probe {
		t.Fatalf("the next admit after the lost probe was given back: %+v, want granted as the probe", a)
	}
}

// replyHook makes the replies of admit calls that ran in Redis unreadable
// (a byte past the packed record's end): a reply the Backend cannot parse,
// from a script that did run.
type replyHook struct {
	redistest.PassThrough
	garble atomic.Bool
}

func (h *replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		if err != nil || !h.garble.Load() || len(a) < 2 || !strings.HasSuffix(fmt.Sprint(a[1]), "_admit") {
			return err
		}
		if c, ok := cmd.(*redis.Cmd); ok {
			if s, ok := c.Val().(string); ok {
				c.SetVal(s + "x")
			}
		}
		return nil
	}
}

// TestUnreadableAdmitReplyIsGivenBack: an Admit whose script ran and granted
// but whose reply the Backend cannot read answers an error, and its caller
// holds no permit: what it may have granted is owed to Redis as for a lost
// reply (lostAdmit), as Settle queues a settle whose reply it cannot read,
// and as a batch does for an unreadable grant whose caller is gone
// (grants). Otherwise the slot stays held by nobody until its lease ends.
func TestUnreadableAdmitReplyIsGivenBack(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	h := &replyHook{}
	c.AddHook(h)
	b := newBackend(t, c, redisgate.Options{})
	const scope = "unreadable"
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	settle(t, ctx, b, scope, src, admit(t, ctx, b, scope, "warm", src).Permit, gate.VerdictSuccess)

	h.garble.Store(true)
	_, err := b.Admit(ctx, admitReq(scope, "garbled", src))
	h.garble.Store(false)
	if err == nil {
		t.Fatal("Admit with an unreadable reply answered no error")
	}
	if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != 1 {
		t.Fatalf("in flight %d after the garbled admit, want the 1 its script granted", q.InFlight)
	}
	if gb := b.GiveBacks(); gb.Queued != 1 {
		t.Fatalf("give-backs queued %d after an admit whose grant nobody received, want 1", gb.Queued)
	}
}

// failHook fails, without sending it, every call that names a key of the
// source "lone" while fail is set: a call that fails at once, so that the
// ops gathered behind it go out as a batch straight away.
type failHook struct {
	redistest.PassThrough
	fail atomic.Bool
}

func (h *failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.fail.Load() && strings.Contains(fmt.Sprint(cmd.Args()...), ":src:lone:") {
			err := errors.New("failHook: connection reset")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestBatchStalledRunsOnceAfterResume: a batch of two admits and a settle
// (a failure) sent to a stalled Redis (SIGSTOP) fails for its callers
// within their timeout and runs when Redis resumes. Afterwards, with the
// give-back queue drained, every permit the batch granted is given back
// (nothing in flight on either source), and the settle counted exactly
// once: its repetition from the queue is stale (one consecutive failure
// of a fail_threshold of 2: CLOSED).
func TestBatchStalledRunsOnceAfterResume(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	h, f := &batchHook{}, &failHook{}
	c.AddHook(h)
	c.AddHook(f)
	const timeout = time.Second
	b := newBackend(t, c, redisgate.Options{Timeout: timeout})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	const scope = "stalled-batch"
	s1 := gatetest.Src("s1", func(s *gate.Source) { s.Limits.MaxConcurrency = 10; s.Breaker.FailThreshold = 2 })
	s2 := gatetest.Src("s2")
	eventually(t, ctx, "a first admission", func() bool {
		a, err := b.Admit(ctx, admitReq(scope, "warm", s2))
		if err == nil && a.Granted {
			_, _ = b.Settle(ctx, settleReq(scope, s2, a.Permit, gate.VerdictSuccess))
		}
		return err == nil
	})
	waitQueue(t, ctx, b)
	p := admit(t, ctx, b, scope, "held", s1).Permit
	h.takeSizes()

	f.fail.Store(true)
	errs := make([]error, 3)
	release, wait := gather(t, b, h, scope, 3,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "b", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "c", s1, s2)) },
		func() { _, errs[2] = b.Settle(ctx, settleReq(scope, s1, p, gate.VerdictFailure)) },
	)
	srv.Pause()
	release() // the lone call fails at once; the three go out to the stalled server
	wait()
	f.fail.Store(false)
	srv.Resume()
	for i, err := range errs {
		if !errors.Is(err, gate.ErrUnavailable) {
			t.Errorf("op %d on a stalled Redis: %v, want unavailable", i, err)
		}
	}
	// (The give-back queue's retries follow them.)
	if sizes := h.takeSizes(); len(sizes) < 2 || sizes[0] != 1 || sizes[1] != 3 {
		t.Fatalf("batch sizes %v, want [1 3 ...]", sizes)
	}
	waitQueue(t, ctx, b)
	if got := inFlight(t, ctx, b, scope, s1, s2); got[0] != 0 || got[1] != 0 {
		t.Errorf("in flight after the give-backs: %v, want [0 0]", got)
	}
	if v := peek(t, ctx, b, scope, s1).Breaker; v.State != gate.Closed || v.Consecutive != 1 {
		t.Errorf("breaker after the stalled settle ran and was repeated: %+v, want CLOSED with 1 consecutive failure", v)
	}
	if g := b.GiveBacks(); g.Released < 2 {
		t.Errorf("give-backs %+v: want the two grants of the stalled batch released", g)
	}
}

// TestBatchManySources: a batch of two admits of 100 and 60 candidates
// (160 sources, numbered in one byte each: the second's from 101 to 160,
// past 127) fits maxBatchKeys and goes as one call; each admit is refused
// by every candidate but its last (a TPM of 1 against 2 tokens) and
// granted there, and answers and stores what the two store one at a time.
func TestBatchManySources(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	h.takeSizes()
	tight := func(s *gate.Source) { s.Limits.TPM = 1 }
	var names []string
	srcs := func(from, n int) []*gate.Source {
		var out []*gate.Source
		for i := from; i < from+n; i++ {
			name := fmt.Sprintf("m%03d", i)
			names = append(names, name)
			if i == from+n-1 {
				out = append(out, gatetest.Src(name))
			} else {
				out = append(out, gatetest.Src(name, tight))
			}
		}
		return out
	}
	first, second := srcs(0, 100), srcs(100, 60)
	run := func(scope string, batched bool) []string {
		out := make([]string, 2)
		fs := []func(){
			func() {
				r := admitReq(scope, "p1", first...)
				r.Tokens = 2
				a, err := b.Admit(ctx, r)
				out[0] = fmt.Sprint(a.Granted, a.Permit.Source, len(a.Rejections), err)
			},
			func() {
				r := admitReq(scope, "p2", second...)
				r.Tokens = 2
				a, err := b.Admit(ctx, r)
				out[1] = fmt.Sprint(a.Granted, a.Permit.Source, len(a.Rejections), err)
			},
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("admit %d: batched %s, one at a time %s", i, bat[i], seq[i])
		}
	}
	if want := fmt.Sprint(true, "m159", 59, nil); bat[1] != want {
		t.Errorf("the second admit: %s, want %s", bat[1], want)
	}
	gotSeq, gotBat := storedScope(t, ctx, b, c, "sequential", names), storedScope(t, ctx, b, c, "batched", names)
	for k, v := range gotSeq {
		if gotBat[k] != v {
			t.Errorf("%s: batched %s, one at a time %s", k, gotBat[k], v)
		}
	}
}

// loseHook runs every call that names a key of the source "lost" and then
// loses its reply, while lose is set (a timeout after the script ran).
type loseHook struct {
	redistest.PassThrough
	lose atomic.Bool
}

func (h *loseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.lose.Load() && strings.Contains(fmt.Sprint(cmd.Args()...), ":src:lost:") {
			err = errors.New("loseHook: i/o timeout")
			cmd.SetErr(err)
		}
		return err
	}
}

// TestGiveBacksOfOneScopeDoNotWaitForAnother: the give-back queue owes
// Redis a settle of a scope that does not answer (here every call naming
// the source "lone" fails, as the scopes of a Redis Cluster node that is
// down do while the others answer), queued first, and the give-back of a
// permit granted in another scope, whose Admit reply was lost. The second
// is given back although the first still fails: a scope that does not
// answer must not hold the others' slots until their leases end.
func TestGiveBacksOfOneScopeDoNotWaitForAnother(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	down, lost := &failHook{}, &loseHook{}
	c.AddHook(down)
	c.AddHook(lost)
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second})
	lone, src := gatetest.Src("lone"), gatetest.Src("lost")
	for _, scope := range []string{"down", "up"} {
		settle(t, ctx, b, scope, src, admit(t, ctx, b, scope, "warm", src).Permit, gate.VerdictSuccess)
	}

	down.fail.Store(true)
	if _, err := b.Admit(ctx, admitReq("down", "p-down", lone)); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("admit in the scope that does not answer: %v, want unavailable", err)
	}
	lost.lose.Store(true)
	if _, err := b.Admit(ctx, admitReq("up", "p-up", src)); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("admit whose reply is lost: %v, want unavailable", err)
	}
	lost.lose.Store(false)
	if gb := b.GiveBacks(); gb.Queued != 2 {
		t.Fatalf("give-backs queued %d, want 2 (one per scope)", gb.Queued)
	}
	if n := inFlight(t, ctx, b, "up", src)[0]; n != 1 {
		t.Fatalf("in flight %d after the admit whose reply was lost, want the 1 it granted", n)
	}

	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)
	waitFor(t, "the lost grant of the scope that answers given back", func() bool {
		return inFlight(t, ctx, b, "up", src)[0] == 0
	})
}

// TestRestartEmptyUnderBatchedLoad: Redis restarts empty while eight
// callers admit and settle one scope at once (their ops meet in batches).
// A source this Backend knew OPEN is never granted, before or after the
// restart; ops cut off by the restart fail as unavailable; once the
// callers stop and the give-backs are done, no slot of the other source
// is held, and the loss was found and re-asserted.
func TestRestartEmptyUnderBatchedLoad(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	const scope = "restart-load"
	long := func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown, s.Breaker.MaxCooldown = time.Hour, time.Hour
	}
	shut, ok := gatetest.Src("shut", long), gatetest.Src("ok", func(s *gate.Source) { s.Limits.MaxConcurrency = 4 })
	eventually(t, ctx, "a first admission", func() bool {
		a, err := b.Admit(ctx, admitReq(scope, "warm", ok))
		if err == nil && a.Granted {
			_, _ = b.Settle(ctx, settleReq(scope, ok, a.Permit, gate.VerdictSuccess))
		}
		return err == nil
	})
	openBreaker(t, ctx, b, scope, shut)

	// after counts the cycles done since the restart.
	var after, unavailable atomic.Int64
	var restarted atomic.Bool
	const callers, cycles = 8, 20
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			for n := 0; ; n++ {
				if restarted.Load() && after.Load() >= callers*cycles {
					errs <- nil
					return
				}
				a, err := b.Admit(ctx, admitReq(scope, fmt.Sprintf("c%d-%d", i, n), shut, ok))
				switch {
				case err != nil && !errors.Is(err, gate.ErrUnavailable):
					errs <- fmt.Errorf("admit: %w", err)
					return
				case err != nil:
					unavailable.Add(1)
					continue
				case a.Granted && a.Permit.Source == "shut":
					errs <- fmt.Errorf("admit %d of caller %d granted the source known OPEN (restarted %v)", n, i, restarted.Load())
					return
				case a.Granted:
					if _, err := b.Settle(ctx, settleReq(scope, ok, a.Permit, gate.VerdictSuccess)); err != nil && !errors.Is(err, gate.ErrUnavailable) {
						errs <- fmt.Errorf("settle: %w", err)
						return
					}
				}
				if restarted.Load() {
					after.Add(1)
				}
			}
		}()
	}
	waitFor(t, "the callers under way", func() bool { return commandCalls(t, c, "fcall") > 50 })
	srv.Stop()
	srv.Start()
	restarted.Store(true)
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitQueue(t, ctx, b)
	t.Logf("admits unavailable: %d; give-backs %+v; fcalls since the restart %d", unavailable.Load(), b.GiveBacks(), commandCalls(t, c, "fcall"))
	if n := inFlight(t, ctx, b, scope, ok)[0]; n != 0 {
		t.Errorf("in flight on ok after the load and the give-backs: %d, want 0", n)
	}
	if v := peek(t, ctx, b, scope, shut).Breaker; v.State != gate.Open {
		t.Errorf("the source known OPEN after the restart: %+v, want OPEN (re-asserted)", v)
	}
	if l := b.StateLoss(scope); l.Count < 1 || l.Pending {
		t.Errorf("state loss %+v, want found and re-asserted", l)
	}
}

// chaosHook, while on, fails a random share of admit and settle calls
// before sending them and loses the reply of another share after they ran.
type chaosHook struct {
	redistest.PassThrough
	on   atomic.Bool
	mu   sync.Mutex
	rand *rand.Rand
}

func (h *chaosHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if !h.on.Load() || len(a) < 2 || !strings.Contains(fmt.Sprint(a[1]), "_") {
			return next(ctx, cmd) // not a library function call
		}
		h.mu.Lock()
		roll := h.rand.IntN(10)
		h.mu.Unlock()
		switch {
		case roll == 0:
			err := errors.New("chaosHook: connection refused")
			cmd.SetErr(err)
			return err
		case roll == 1:
			_ = next(ctx, cmd)
			err := errors.New("chaosHook: i/o timeout")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestCancelsAndLostRepliesLeakNothing: eight callers admit and settle one
// scope at once (their ops meet in batches), each giving up at a random
// point of its admit or of its settle (while its op gathers, is sent, or
// its reply arrives), while a tenth of the calls fail before they are sent
// and another tenth lose their reply after they ran. A caller that was
// granted settles its permit; nothing else is reported. Once the callers
// stop and the give-back queue is empty, no slot is held on either source,
// and nothing overflowed.
func TestCancelsAndLostRepliesLeakNothing(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	h := &chaosHook{rand: rand.New(rand.NewPCG(1, 2))}
	c.AddHook(h)
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)
	const scope = "chaos"
	s1 := gatetest.Src("s1", func(s *gate.Source) { s.Limits.MaxConcurrency = 3 })
	s2 := gatetest.Src("s2", func(s *gate.Source) { s.Limits.MaxConcurrency = 3 })
	settle(t, ctx, b, scope, s1, admit(t, ctx, b, scope, "warm", s1).Permit, gate.VerdictSuccess)

	// giveUp is a context its caller gives up on after a random number of
	// yields (before, during or after its call), or, one time in three,
	// not at all.
	giveUp := func(r *rand.Rand) context.Context {
		if r.IntN(3) == 0 {
			return ctx
		}
		cctx, cancel := context.WithCancel(ctx)
		n := r.IntN(20000)
		go func() {
			for range n {
				runtime.Gosched()
			}
			cancel()
		}()
		return cctx
	}
	h.on.Store(true)
	const callers, rounds = 8, 40
	var wg sync.WaitGroup
	var granted, failed atomic.Int64
	for i := range callers {
		r := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			for n := range rounds {
				a, err := b.Admit(giveUp(r), admitReq(scope, fmt.Sprintf("c%d-%d", i, n), s1, s2))
				if err != nil {
					failed.Add(1)
					continue
				}
				if !a.Granted {
					continue
				}
				granted.Add(1)
				src := s1
				if a.Permit.Source == "s2" {
					src = s2
				}
				_, _ = b.Settle(giveUp(r), settleReq(scope, src, a.Permit, gate.VerdictSuccess))
			}
		})
	}
	wg.Wait()
	h.on.Store(false)
	waitQueue(t, ctx, b)
	t.Logf("granted %d, failed %d of %d admits; give-backs %+v", granted.Load(), failed.Load(), callers*rounds, b.GiveBacks())
	if got := inFlight(t, ctx, b, scope, s1, s2); got[0] != 0 || got[1] != 0 {
		t.Errorf("in flight after every caller stopped and the give-backs: %v, want [0 0]", got)
	}
	if g := b.GiveBacks(); g.Overflowed != 0 {
		t.Errorf("give-backs overflowed: %+v", g)
	}
}

// TestCancelsAndLostRepliesLeakNoProbe: the same chaos over breakers that
// open and turn HALF_OPEN (fail_threshold 2, cooldown 1s on a test clock
// that moves 10ms per admit, probe TTL an hour), callers reporting success
// or failure at random. Once the callers stop and the give-backs are done,
// and a cooldown has passed, every source admits again: no probe is held
// by nobody (a probe's lease would only end with its hour-long TTL).
func TestCancelsAndLostRepliesLeakNoProbe(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	loadLibrary(t, c)
	h := &chaosHook{rand: rand.New(rand.NewPCG(3, 4))}
	c.AddHook(h)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second, Clock: clock.Now})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)
	const scope = "chaos-probe"
	flaky := func(s *gate.Source) {
		s.Limits.MaxConcurrency = 3
		s.Breaker.FailThreshold = 2
		s.Breaker.Cooldown, s.Breaker.MaxCooldown, s.Breaker.ProbeTTL = time.Second, time.Second, time.Hour
	}
	srcs := []*gate.Source{gatetest.Src("s1", flaky), gatetest.Src("s2", flaky)}
	settle(t, ctx, b, scope, srcs[0], admit(t, ctx, b, scope, "warm", srcs[0]).Permit, gate.VerdictSuccess)

	giveUp := func(r *rand.Rand) context.Context {
		if r.IntN(3) == 0 {
			return ctx
		}
		cctx, cancel := context.WithCancel(ctx)
		n := r.IntN(20000)
		go func() {
			for range n {
				runtime.Gosched()
			}
			cancel()
		}()
		return cctx
	}
	h.on.Store(true)
	const callers, rounds = 8, 40
	var wg sync.WaitGroup
	var probes atomic.Int64
	for i := range callers {
		r := rand.New(rand.NewPCG(uint64(i), 9))
		wg.Go(func() {
			for n := range rounds {
				clock.Advance(10 * time.Millisecond)
				a, err := b.Admit(giveUp(r), admitReq(scope, fmt.Sprintf("c%d-%d", i, n), srcs...))
				if err != nil || !a.Granted {
					continue
				}
				if a.Permit.Probe {
					probes.Add(1)
				}
				v := gate.VerdictSuccess
				if r.IntN(2) == 0 {
					v = gate.VerdictFailure
				}
				src := srcs[0]
				if a.Permit.Source == "s2" {
					src = srcs[1]
				}
				_, _ = b.Settle(giveUp(r), settleReq(scope, src, a.Permit, v))
			}
		})
	}
	wg.Wait()
	h.on.Store(false)
	waitQueue(t, ctx, b)
	clock.Advance(2 * time.Second)
	t.Logf("probes granted %d; give-backs %+v", probes.Load(), b.GiveBacks())
	if got := inFlight(t, ctx, b, scope, srcs...); got[0] != 0 || got[1] != 0 {
		t.Errorf("in flight after every caller stopped and the give-backs: %v, want [0 0]", got)
	}
	for _, src := range srcs {
		if a := admit(t, ctx, b, scope, "after-"+src.Name, src); !a.Granted {
			t.Errorf("%s after the chaos and a cooldown: %+v, want granted", src.Name, a)
		}
	}
}

// TestStalledHandoffHandsOnce: a release that hands its slot to the head
// of the line, sent in a batch to a stalled Redis (SIGSTOP), fails for its
// caller and is repeated by the give-back queue. When Redis resumes, the
// batch runs and hands the slot to the head; the repetition, stale, hands
// nothing more. The head is then among the waiters a read of this replica
// wakes, the waiter behind it is not, and the head's admit takes the slot.
func TestStalledHandoffHandsOnce(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	h, f := &batchHook{}, &failHook{}
	c.AddHook(h)
	c.AddHook(f)
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	const scope = "stalled-handoff"
	src, other := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 }), gatetest.Src("other")
	eventually(t, ctx, "a first admission", func() bool {
		a, err := b.Admit(ctx, admitReq(scope, "warm", other))
		if err == nil && a.Granted {
			_, _ = b.Settle(ctx, settleReq(scope, other, a.Permit, gate.VerdictSuccess))
		}
		return err == nil
	})
	waitQueue(t, ctx, b)
	held := admit(t, ctx, b, scope, "held", src).Permit
	waiter := func(id, place string) *gate.Waiter {
		return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: map[string]string{"s": place}}
	}
	places := map[string]string{}
	for _, id := range []string{"w1", "w2"} {
		req := admitReq(scope, "ask-"+id, src)
		req.Line = waiter(id, "earlier")
		a := must(b.Admit(ctx, req))(t)
		if a.Granted || a.Places["s"] == "" {
			t.Fatalf("%s joining the line: %+v, want refused with a place", id, a)
		}
		places[id] = a.Places["s"]
	}
	h.takeSizes()

	f.fail.Store(true)
	var settleErr error
	release, wait := gather(t, b, h, scope, 2,
		func() {
			req := settleReq(scope, src, held, gate.VerdictSuccess)
			req.Line = &gate.LineHandoff{Lease: time.Minute}
			_, settleErr = b.Settle(ctx, req)
		},
		func() { _, _ = b.Admit(ctx, admitReq(scope, "mate", other)) },
	)
	srv.Pause()
	release()
	wait()
	f.fail.Store(false)
	srv.Resume()
	if !errors.Is(settleErr, gate.ErrUnavailable) {
		t.Fatalf("the release on a stalled Redis: %v, want unavailable", settleErr)
	}
	if sizes := h.takeSizes(); len(sizes) < 2 || sizes[1] != 2 {
		t.Fatalf("batch sizes %v, want [1 2 ...]", sizes)
	}
	waitQueue(t, ctx, b)

	snap := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}, Line: &gate.LineRead{Lease: time.Minute}}))(t)
	if l := snap.Sources[0].Line; len(l.Wake) != 1 || l.Wake[0] != "w1" || l.Length != 2 {
		t.Fatalf("line after the stalled release ran and was repeated: %+v, want 2 waiting and w1 (only) handed the slot", l)
	}
	req := admitReq(scope, "take-w1", src)
	req.Line = waiter("w1", places["w1"])
	if a := must(b.Admit(ctx, req))(t); !a.Granted {
		t.Fatalf("w1 asking for the slot handed to it: %+v, want granted", a)
	}
	req = admitReq(scope, "take-w2", src)
	req.Line = waiter("w2", places["w2"])
	if a := must(b.Admit(ctx, req))(t); a.Granted {
		t.Fatalf("w2 after w1 took the one slot: %+v, want refused", a)
	}
}
