package redisgate_test

import (
	"context"
	"errors"
	"fmt"
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

// batchHook is a go-redis hook on the calls of admits and settles, batches
// or one alone: it records how many ops each carries, can hold the next one until released (so that the ops that
// arrive meanwhile gather for the one after), and can make them time out.
type batchHook struct {
	redistest.PassThrough
	mu      sync.Mutex
	sizes   []int
	hold    chan struct{} // set: the next batch call waits until it is closed
	held    chan struct{} // closed once that call waits
	timeout bool          // batch calls wait for their deadline and fail
}

func (h *batchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 4 {
			return next(ctx, cmd)
		}
		n := 1 // an admit or a settle alone
		nkeys, _ := a[2].(int)
		switch name, fn := strings.ToLower(fmt.Sprint(a[0])), fmt.Sprint(a[1]); {
		case name == "evalsha" || name == "eval":
			// Scripts (Functions refused): a batch is known by its head
			// block; any other script counts as an op alone.
			if m, ok := redisgate.BatchOps(a[3+nkeys]); ok {
				n = m
			}
		case name != "fcall":
			return next(ctx, cmd)
		case strings.HasSuffix(fn, "_batch"):
			n, _ = redisgate.BatchOps(a[3+nkeys])
		case !strings.HasSuffix(fn, "_admit") && !strings.HasSuffix(fn, "_settle"):
			return next(ctx, cmd)
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, n)
		hold, held, timeout := h.hold, h.held, h.timeout
		h.hold = nil
		h.mu.Unlock()
		if hold != nil {
			close(held)
			<-hold
		}
		if timeout {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

// holdNext makes the next batch call wait; it returns a channel closed once
// the call waits, and release.
func (h *batchHook) holdNext() (held <-chan struct{}, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hold, h.held = make(chan struct{}), make(chan struct{})
	hold := h.hold
	return h.held, func() { close(hold) }
}

func (h *batchHook) takeSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sizes
	h.sizes = nil
	return s
}

func (h *batchHook) setTimeout(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timeout = on
}

// batchFixture is a Backend over a fresh server whose batch calls the hook
// sees; each scope is warmed up (library loaded, marker seen).
func batchFixture(t *testing.T, o redisgate.Options, scopes ...string) (*redisgate.Backend, *batchHook, *redis.Client) {
	t.Helper()
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	loadLibrary(t, c)
	h := &batchHook{}
	c.AddHook(h)
	b := newBackend(t, c, o)
	warm := gatetest.Src("warm")
	for _, scope := range scopes {
		settle(t, ctx, b, scope, warm, admit(t, ctx, b, scope, "warm", warm).Permit, gate.VerdictSuccess)
	}
	h.takeSizes()
	return b, h, c
}

// loadLibrary loads the Lua library on c's server through a Backend
// without a timeout, so that a test's Backend with a short one does not
// spend it on the first call's FUNCTION LOAD (slow under -race on a busy
// machine).
func loadLibrary(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := testCtx(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("load-library")
	settle(t, ctx, b, "load-library", src, admit(t, ctx, b, "load-library", "load", src).Permit, gate.VerdictSuccess)
}

func admitReq(scope, id string, srcs ...*gate.Source) gate.AdmitRequest {
	cs := make([]gate.Candidate, len(srcs))
	for i, s := range srcs {
		cs[i] = gate.Candidate{Source: s, Ceiling: s.Limits.MaxConcurrency}
	}
	return gate.AdmitRequest{Scope: scope, PermitID: id, Candidates: cs}
}

func settleReq(scope string, src *gate.Source, p gate.Permit, v gate.Verdict) gate.SettleRequest {
	return gate.SettleRequest{Scope: scope, Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: v, ActualTokens: -1}
}

// TestBatchConcurrentCycles: many goroutines admitting and settling one
// scope at once (their ops meet in batches) never hold more permits than
// the limit, and end with no lease held and every attempt counted once.
func TestBatchConcurrentCycles(t *testing.T) {
	ctx := testCtx(t)
	const scope, limit, callers, rounds = "batch-load", 3, 32, 15
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency = limit
		s.Limits.RPM = 1_000_000
		s.Breaker.Window = time.Hour
	})
	var inFlight, most, grants atomic.Int32
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for k := range rounds {
				a, err := b.Admit(ctx, admitReq(scope, fmt.Sprint("p", i, "-", k), src))
				if err != nil {
					t.Error(err)
					return
				}
				if !a.Granted {
					continue
				}
				grants.Add(1)
				// Counted after Redis granted and before Redis releases: at
				// most Redis's own count.
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				inFlight.Add(-1)
				s, err := b.Settle(ctx, settleReq(scope, src, a.Permit, gate.VerdictSuccess))
				if err != nil || !s.Released {
					t.Errorf("settle: %+v %v, want released", s, err)
				}
			}
		})
	}
	wg.Wait()
	if most.Load() > limit || grants.Load() == 0 {
		t.Fatalf("at most %d in flight over %d grants; want <= %d", most.Load(), grants.Load(), limit)
	}
	v := peek(t, ctx, b, scope, src)
	if v.Quota.InFlight != 0 || v.Quota.Requests != int64(grants.Load()) || v.Breaker.Calls != int64(grants.Load()) {
		t.Fatalf("after %d grants: %+v; want none in flight, %d requests and calls", grants.Load(), v, grants.Load())
	}
	if gb := b.GiveBacks(); gb.Queued != 0 {
		t.Fatalf("give-backs queued: %+v", gb)
	}
	ops := 0
	for _, n := range h.takeSizes() {
		ops += n
	}
	if ops < callers*rounds {
		t.Fatalf("%d ops in batch calls, want at least one per admit (%d)", ops, callers*rounds)
	}
}

// gather holds the scope's next batch call (started by a lone admit on
// another source, whose answer is not checked), runs each of fs in its own
// goroutine, one after the other, and waits until their n ops wait for the
// batch after it, in that order; release lets both go.
func gather(t *testing.T, b *redisgate.Backend, h *batchHook, scope string, n int, fs ...func()) (release func(), wait func()) {
	t.Helper()
	ctx := testCtx(t)
	held, release := h.holdNext()
	lone := gatetest.Src("lone")
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Admit(ctx, admitReq(scope, "lone", lone)) })
	<-held
	for i, f := range fs {
		wg.Go(f) // each joins in turn: the batch's order is fs's
		waitFor(t, "the op gathering", func() bool { return b.Gathering(scope) == i+1 })
	}
	if len(fs) != n {
		t.Fatalf("gather: %d functions, want %d", len(fs), n)
	}
	return release, wg.Wait
}

// TestBatchMixed: a batch of admits and settles of several sources gives
// each caller its own answer, in arrival order: the second admit of a
// source with one slot is refused because the first took it.
func TestBatchMixed(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-mixed"
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	one := func(name string) *gate.Source {
		return gatetest.Src(name, func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	}
	x, y, z := one("x"), one("y"), one("z")
	px := admit(t, ctx, b, scope, "px", x).Permit // x's slot, settled in the batch
	h.takeSizes()

	var mu sync.Mutex
	got := map[string]string{}
	note := func(k, v string) {
		mu.Lock()
		defer mu.Unlock()
		got[k] = v
	}
	admitTo := func(id string, srcs ...*gate.Source) func() {
		return func() {
			a, err := b.Admit(ctx, admitReq(scope, id, srcs...))
			switch {
			case err != nil:
				note(id, err.Error())
			case a.Granted:
				note(id, "granted "+a.Permit.Source)
			default:
				note(id, fmt.Sprintf("refused %v", a.Rejections[0].Reason))
			}
		}
	}
	// In order: x's settle frees x; a1 takes y; a2 finds y full and takes z
	// (its second candidate); a3 finds both full and is refused.
	fs := []func(){
		func() {
			s, err := b.Settle(ctx, settleReq(scope, x, px, gate.VerdictFailure))
			note("settle-x", fmt.Sprintf("released=%v effect=%v err=%v", s.Released, s.Effect, err))
		},
		admitTo("a1", y), admitTo("a2", y, z), admitTo("a3", y, z),
	}
	// Each joins the gathering in turn, so that the batch's order is known.
	held, release := h.holdNext()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Admit(ctx, admitReq(scope, "lone", gatetest.Src("lone"))) })
	<-held
	for i, f := range fs {
		wg.Go(f)
		waitFor(t, "the op gathering", func() bool { return b.Gathering(scope) == i+1 })
	}
	release()
	wg.Wait()
	want := map[string]string{
		"settle-x": fmt.Sprintf("released=true effect=%v err=<nil>", gate.EffectApplied),
		"a1":       "granted y",
		"a2":       "granted z",
		"a3":       fmt.Sprintf("refused %v", gate.ReasonRateLimited),
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != len(fs) {
		t.Fatalf("batch sizes %v, want [1 %d]", sizes, len(fs))
	}
}

// TestBatchOpErrorIsItsOwn: an op that raises in Lua (a source whose stored
// record is corrupt) fails alone; its batch-mates get their answers, and the
// failed admit is queued to be given back (it may have written).
func TestBatchOpErrorIsItsOwn(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-error"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	bad, good := gatetest.Src("bad"), gatetest.Src("good")
	must(c.HSet(ctx, b.SourceKey(scope, "bad", ""), redisgate.StateField, "corrupt").Result())(t)
	var badErr error
	var goodAdm gate.Admission
	var goodErr error
	release, wait := gather(t, b, h, scope, 2,
		func() { _, badErr = b.Admit(ctx, admitReq(scope, "pb", bad)) },
		func() { goodAdm, goodErr = b.Admit(ctx, admitReq(scope, "pg", good)) },
	)
	release()
	wait()
	if badErr == nil || errors.Is(badErr, gate.ErrUnavailable) {
		t.Fatalf("admit on the corrupt source: %v, want a script error", badErr)
	}
	if goodErr != nil || !goodAdm.Granted {
		t.Fatalf("its batch-mate: %+v %v, want granted", goodAdm, goodErr)
	}
	if gb := b.GiveBacks(); gb.Queued != 1 {
		t.Fatalf("give-backs queued %d, want the failed admit's 1", gb.Queued)
	}
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 2 {
		t.Fatalf("batch sizes %v, want [1 2]", sizes)
	}
}

// TestBatchUnmarked: Redis loses the scope while admits gather; each admit
// of the batch finds the marker changed, the loss is re-asserted once, and
// every admit is then refused by the breaker this Backend knew OPEN: none is
// granted in the loss window.
func TestBatchUnmarked(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-unmarked"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown = time.Hour
		s.Breaker.MaxCooldown = time.Hour
	})
	openBreaker(t, ctx, b, scope, src)
	must(c.FlushAll(ctx).Result())(t)
	const n = 4
	results := make([]gate.Admission, n)
	errs := make([]error, n)
	var fs []func()
	for i := range n {
		fs = append(fs, func() { results[i], errs[i] = b.Admit(ctx, admitReq(scope, fmt.Sprint("p", i), src)) })
	}
	release, wait := gather(t, b, h, scope, n, fs...)
	release()
	wait()
	for i := range n {
		if errs[i] != nil || results[i].Granted || results[i].Rejections[0].Reason != gate.ReasonCircuitOpen {
			t.Errorf("admit %d after the loss: %+v %v, want refused circuit_open", i, results[i], errs[i])
		}
	}
	if l := b.StateLosses(); l != 1 {
		t.Fatalf("state losses %d, want 1", l)
	}
}

// TestBatchTimeout: a batch call that times out sends every admit in it to
// the give-back queue (lostAdmit, one per candidate: a1's two, a2's one) and
// every settle too (one); its callers see Redis unavailable.
func TestBatchTimeout(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-timeout"
	// The timeout is far longer than the others take to gather, so that
	// they are sent before their callers' own time is up.
	b, h, _ := batchFixture(t, redisgate.Options{Timeout: 2 * time.Second}, scope)
	s1, s2 := gatetest.Src("s1"), gatetest.Src("s2")
	p := admit(t, ctx, b, scope, "held", s1).Permit
	h.takeSizes()
	errs := make([]error, 3)
	release, wait := gather(t, b, h, scope, 3,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "a1", s1, s2)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "a2", s2)) },
		func() { _, errs[2] = b.Settle(ctx, settleReq(scope, s1, p, gate.VerdictSuccess)) },
	)
	h.setTimeout(true) // for the batch of the three, not the one held
	release()
	wait()
	for i, err := range errs {
		if !errors.Is(err, gate.ErrUnavailable) {
			t.Errorf("op %d: %v, want unavailable", i, err)
		}
	}
	// The callers' own timeouts end before their batch call's (it was sent
	// later): what the call owes is queued when it fails.
	waitFor(t, "4 give-backs queued", func() bool { return b.GiveBacks().Queued == 2+1+1 })
	h.setTimeout(false)
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 3 {
		t.Fatalf("batch sizes %v, want [1 3]", sizes)
	}
}

// TestBatchAnswerWithinOneTimeout: an op that waited behind the call in
// flight is answered within its own timeout even while its batch call is
// still out (held here until the caller has its answer: a caller that
// waited for its batch's end, a timeout after that batch was sent, would
// never answer), and the permit that batch grants to nobody is given back.
func TestBatchAnswerWithinOneTimeout(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-one-timeout"
	// The timeout is far longer than the second admit takes to gather and
	// be sent behind the first.
	b, h, _ := batchFixture(t, redisgate.Options{Timeout: 2 * time.Second}, scope)
	src := gatetest.Src("s")
	first, releaseFirst := h.holdNext()
	go func() { _, _ = b.Admit(ctx, admitReq(scope, "first", src)) }()
	<-first
	answered := make(chan error, 1)
	go func() {
		_, err := b.Admit(ctx, admitReq(scope, "second", src))
		answered <- err
	}()
	waitFor(t, "the second admit gathering", func() bool { return b.Gathering(scope) == 1 })
	second, releaseSecond := h.holdNext() // the second's batch call, once sent
	releaseFirst()
	select {
	case <-second:
	case err := <-answered:
		t.Fatalf("the second admit answered (%v) before its batch was sent", err)
	}
	select {
	case err := <-answered:
		if !errors.Is(err, gate.ErrUnavailable) {
			t.Fatalf("the second admit: %v, want unavailable within its timeout", err)
		}
	case <-ctx.Done():
		t.Fatal("the second admit was not answered while its batch call was out")
	}
	releaseSecond() // its call goes on, past its deadline, and fails
	waitFor(t, "the second admit given back", func() bool { return b.GiveBacks().Queued >= 1 })
}

// TestBatchQueueBound: while the scope's call is out and its queue is
// full, an admit fails at once as unavailable (nothing sent, nothing owed)
// and a settle fails the same way and goes to the give-back queue.
func TestBatchQueueBound(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-queue-bound"
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	redisgate.SetMaxQueuedOps(t, 2)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 10 })
	p := admit(t, ctx, b, scope, "held", src).Permit
	h.takeSizes()
	release, wait := gather(t, b, h, scope, 2,
		func() { _, _ = b.Admit(ctx, admitReq(scope, "a1", src)) },
		func() { _, _ = b.Admit(ctx, admitReq(scope, "a2", src)) },
	)
	if _, err := b.Admit(ctx, admitReq(scope, "over", src)); !errors.Is(err, gate.ErrUnavailable) {
		t.Errorf("an admit over the full queue: %v, want unavailable", err)
	}
	if _, err := b.Settle(ctx, settleReq(scope, src, p, gate.VerdictSuccess)); !errors.Is(err, gate.ErrUnavailable) {
		t.Errorf("a settle over the full queue: %v, want unavailable", err)
	}
	if gb := b.GiveBacks(); gb.Queued != 1 {
		t.Errorf("give-backs queued %d, want the settle's 1", gb.Queued)
	}
	release()
	wait()
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 2 {
		t.Fatalf("batch sizes %v, want [1 2]: the lone admit, then the two queued", sizes)
	}
}

// TestBatchBound: ops beyond the bound wait for the next batch.
func TestBatchBound(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-bound"
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1000 })
	n := redisgate.MaxBatchOps + 10
	var fs []func()
	for i := range n {
		fs = append(fs, func() {
			if a, err := b.Admit(ctx, admitReq(scope, fmt.Sprint("p", i), src)); err != nil || !a.Granted {
				t.Errorf("admit %d: %+v %v", i, a, err)
			}
		})
	}
	release, wait := gather(t, b, h, scope, n, fs...)
	release()
	wait()
	if sizes := h.takeSizes(); len(sizes) != 3 || sizes[1] != redisgate.MaxBatchOps || sizes[2] != 10 {
		t.Fatalf("batch sizes %v, want [1 %d 10]", sizes, redisgate.MaxBatchOps)
	}
	if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != n {
		t.Fatalf("in flight %d, want %d", q.InFlight, n)
	}
}

// TestBatchCallerGivesUp: a caller that gives up while its op gathers drops
// an admit (never sent, nothing owed) but not a settle (sent anyway); one
// that gives up after its admit was sent leaves the permit to lostAdmit.
func TestBatchCallerGivesUp(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-gone"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s")
	p := admit(t, ctx, b, scope, "held", src).Permit
	h.takeSizes()

	gone, cancel := context.WithCancel(ctx)
	var admitErr, settleErr error
	release, wait := gather(t, b, h, scope, 2,
		func() { _, admitErr = b.Admit(gone, admitReq(scope, "dropped", src)) },
		func() { _, settleErr = b.Settle(gone, settleReq(scope, src, p, gate.VerdictSuccess)) },
	)
	cancel()
	// The admit leaves the gathering; the settle stays.
	waitFor(t, "the admit dropped", func() bool { return b.Gathering(scope) == 1 })
	release()
	wait()
	if !errors.Is(admitErr, context.Canceled) || !errors.Is(settleErr, context.Canceled) {
		t.Fatalf("callers that gave up: admit %v, settle %v; want context.Canceled", admitErr, settleErr)
	}
	// The settle goes out after its caller left.
	waitFor(t, "the settle sent", func() bool { return peek(t, ctx, b, scope, src).Quota.InFlight == 0 })
	state := b.SourceKey(scope, "s", "")
	if ok := must(c.HExists(ctx, state, "ldropped").Result())(t); ok {
		t.Fatal("the dropped admit reached Redis")
	}
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 1 {
		t.Fatalf("batch sizes %v, want [1 1]: the lone admit, then the settle alone", sizes)
	}
	if gb := b.GiveBacks(); gb.Queued != 0 {
		t.Fatalf("give-backs queued %d, want none", gb.Queued)
	}

	// Gone after its admit was sent: the grant nobody receives is owed.
	held, rel := h.holdNext()
	gone2, cancel2 := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		_, err := b.Admit(gone2, admitReq(scope, "orphan", src))
		done <- err
	}()
	<-held
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("admit given up in flight: %v", err)
	}
	rel()
	waitFor(t, "the grant given back", func() bool { return b.GiveBacks().Queued == 1 })
}

// TestBatchSameAsSequential: a batch of settles and admits of one source
// (each loads the breaker from the batch's cache and leaves its writes
// there) leaves the same stored state and gives the same answers as the
// same ops made one at a time, at the same (test) time: failures counted
// across the batch open the breaker, the admit after is refused, the
// success after is stale.
func TestBatchSameAsSequential(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency = 10
		s.Limits.RPM = 1000
		s.Breaker.FailThreshold = 2
	})
	run := func(scope string, batched bool) []string {
		var ps []gate.Permit
		for i := range 3 {
			ps = append(ps, admit(t, ctx, b, scope, fmt.Sprint("p", i), src).Permit)
		}
		out := make([]string, 5)
		fs := []func(){
			func() {
				s, err := b.Settle(ctx, settleReq(scope, src, ps[0], gate.VerdictFailure))
				out[0] = fmt.Sprint(s, err)
			},
			func() {
				s, err := b.Settle(ctx, settleReq(scope, src, ps[1], gate.VerdictFailure))
				out[1] = fmt.Sprint(s, err)
			},
			func() { a, err := b.Admit(ctx, admitReq(scope, "p3", src)); out[2] = fmt.Sprint(a, err) },
			func() {
				s, err := b.Settle(ctx, settleReq(scope, src, ps[2], gate.VerdictSuccess))
				out[3] = fmt.Sprint(s, err)
			},
			func() {
				a, err := b.Admit(ctx, admitReq(scope, "p4", gatetest.Src("other")))
				out[4] = fmt.Sprint(a, err)
			},
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d: batched %s, one at a time %s", i, bat[i], seq[i])
		}
	}
	// The stored hashes, but for a window of zeros, which reads as none.
	stored := func(scope, name, suffix string) string {
		m := must(c.HGetAll(ctx, b.SourceKey(scope, name, suffix)).Result())(t)
		if w, ok := m["w"]; ok && strings.Trim(w, "\x00") == "" {
			delete(m, "w")
		}
		return fmt.Sprintf("%q", m)
	}
	for _, name := range []string{"s", "other"} {
		for _, suffix := range []string{"", "data"} {
			if got, want := stored("batched", name, suffix), stored("sequential", name, suffix); got != want {
				t.Errorf("%s %q: batched %s, one at a time %s", name, suffix, got, want)
			}
		}
	}
	if v := peek(t, ctx, b, "batched", src); v.Breaker.State != gate.Open || v.Quota.InFlight != 0 {
		t.Errorf("batched: %+v, want OPEN and nothing in flight", v)
	}
}

// TestBatchScripts: where Functions are refused, a batch is a script of its
// own (EVALSHA), with the same answers.
func TestBatchScripts(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	must(srv.Client(t).Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Result())(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	h := &batchHook{}
	c.AddHook(h)
	b := newBackend(t, c, redisgate.Options{})
	const scope = "batch-scripts"
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
	p := admit(t, ctx, b, scope, "held", src).Permit
	got := make([]string, 3)
	release, wait := gather(t, b, h, scope, 3,
		func() { a, err := b.Admit(ctx, admitReq(scope, "a1", src)); got[0] = fmt.Sprint(a.Granted, err) },
		func() {
			s, err := b.Settle(ctx, settleReq(scope, src, p, gate.VerdictSuccess))
			got[1] = fmt.Sprint(s.Released, err)
		},
		func() { a, err := b.Admit(ctx, admitReq(scope, "a2", src)); got[2] = fmt.Sprint(a.Granted, err) },
	)
	release()
	wait()
	// In order: a1 takes the second slot, the settle frees the first, a2
	// takes it.
	for i, want := range []string{"true <nil>", "true <nil>", "true <nil>"} {
		if got[i] != want {
			t.Errorf("op %d: %s, want %s", i, got[i], want)
		}
	}
	if sizes := h.takeSizes(); sizes[len(sizes)-1] != 3 {
		t.Fatalf("batch sizes %v, want the three in one script call last", sizes)
	}
}

// TestBatchKeysOncePerSource: a batch passes each source's keys once and
// each op names its sources by number, in its own order; ops whose
// candidates are the batch's sources in different orders, a waiter kept in
// a line and a settle that hands its slot to that waiter answer and store
// what they do one at a time (a mixed-up number would admit on, or hand
// off from, another source's keys).
func TestBatchKeysOncePerSource(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	b.KeepArrivalOrder() // compared with the ops one at a time in arrival order
	one := func(s *gate.Source) { s.Limits.MaxConcurrency = 1 }
	a, bb, cc := gatetest.Src("a", one), gatetest.Src("b", one), gatetest.Src("c", one)
	line := &gate.LineHandoff{Lease: time.Second}
	run := func(scope string, batched bool) []string {
		p0 := admit(t, ctx, b, scope, "p0", a).Permit // a is full
		w := &gate.Waiter{ID: "w1", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Second}
		v := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{a},
			Line: &gate.LineRead{Lease: time.Second, Join: w, Joins: []string{"a"}}}))(t)
		w.Places = map[string]string{"a": v.Sources[0].Line.Place} // in a's line
		out := make([]string, 5)
		fs := []func(){
			func() {
				r := admitReq(scope, "w1", a)
				r.Line = w
				x, err := b.Admit(ctx, r)
				out[0] = fmt.Sprint(x, err) // refused, in a's line
			},
			func() { x, err := b.Admit(ctx, admitReq(scope, "p2", cc, a)); out[1] = fmt.Sprint(x, err) },
			func() {
				r := settleReq(scope, a, p0, gate.VerdictSuccess)
				r.Line = line
				s, err := b.Settle(ctx, r)
				out[2] = fmt.Sprint(s, err) // hands a's slot to w1
			},
			func() { x, err := b.Admit(ctx, admitReq(scope, "p3", bb, cc)); out[3] = fmt.Sprint(x, err) },
			func() { x, err := b.Admit(ctx, admitReq(scope, "p4", cc, bb, a)); out[4] = fmt.Sprint(x, err) },
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d: batched %s, one at a time %s", i, bat[i], seq[i])
		}
	}
	if !strings.Contains(bat[0], "w1") || !strings.Contains(bat[2], "w1") {
		t.Errorf("the waiter: not kept in a's line (%s) or not handed a's slot (%s)", bat[0], bat[2])
	}
	for _, name := range []string{"a", "b", "c"} {
		for _, suffix := range []string{"", "line", "line_w"} {
			read := func(scope string) string {
				key := b.SourceKey(scope, name, suffix)
				if suffix == "line" {
					return fmt.Sprint(must(c.ZRange(ctx, key, 0, -1).Result())(t))
				}
				return fmt.Sprintf("%q", must(c.HGetAll(ctx, key).Result())(t))
			}
			if got, want := read("batched"), read("sequential"); got != want {
				t.Errorf("%s %q: batched %s, one at a time %s", name, suffix, got, want)
			}
		}
	}
}

// TestBatchRaisedAdmitTakesNoSlot: an admit that raises in Lua
// after q_take counted its slot (b.held+1 on the batch's cached breaker)
// must leave the slot count as a call of its own does: only Redis writes
// made before the error stay, not the Lua table's. In a batch the cached
// table is flushed at the end, so the source keeps a phantom held slot
// (no lease field behind it, which the give-back cannot free) until its
// lease ends.
func TestBatchRaisedAdmitTakesNoSlot(t *testing.T) {
	ctx := testCtx(t)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency = 1
		s.Limits.RPM = 1000 // q_take writes the minute's data
	})
	for _, batched := range []bool{false, true} {
		scope := "t-raise-alone"
		if batched {
			scope = "t-raise-batched"
		}
		b, h, c := batchFixture(t, redisgate.Options{}, scope)
		data := b.SourceKey(scope, "s", "data")
		must(c.Set(ctx, data, "not a hash", 0).Result())(t)
		var err error
		if batched {
			release, wait := gather(t, b, h, scope, 2,
				func() { _, err = b.Admit(ctx, admitReq(scope, "raises", src)) },
				func() { _, _ = b.Admit(ctx, admitReq(scope, "mate", gatetest.Src("other"))) },
			)
			release()
			wait()
			if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 2 {
				t.Fatalf("batch sizes %v, want [1 2]", sizes)
			}
		} else {
			_, err = b.Admit(ctx, admitReq(scope, "raises", src))
		}
		if err == nil || errors.Is(err, gate.ErrUnavailable) {
			t.Fatalf("batched=%v: admit over a broken data key: %v, want a script error", batched, err)
		}
		must(c.Del(ctx, data).Result())(t)
		if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != 0 {
			t.Errorf("batched=%v: in flight %d after the admit that raised, want 0 (no lease was written)", batched, q.InFlight)
		}
		if a, err := b.Admit(ctx, admitReq(scope, "next", src)); err != nil || !a.Granted {
			t.Errorf("batched=%v: the next admit of the free slot: %+v %v, want granted", batched, a, err)
		}
	}
}

// TestBatchRaisedAdmitLeasesNoProbe: the same with a breaker whose
// cooldown has passed: b_enter makes the raising admit the probe
// (HALF_OPEN, epoch+1) before q_take raises. Alone, nothing of that is
// saved and the next admit is the probe; in a batch the flush saves a probe
// leased to a permit nobody holds (the give-back settles it without probe
// or epoch: stale), so the source refuses every admit (probe in flight)
// until the probe's TTL ends.
func TestBatchRaisedAdmitLeasesNoProbe(t *testing.T) {
	ctx := testCtx(t)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.RPM = 1000
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown = time.Second
		s.Breaker.MaxCooldown = time.Second
	})
	for _, batched := range []bool{false, true} {
		scope := "t-probe-alone"
		if batched {
			scope = "t-probe-batched"
		}
		clock := gatetest.NewClock()
		b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, scope)
		openBreaker(t, ctx, b, scope, src)
		clock.Advance(2 * src.Breaker.Cooldown)
		data := b.SourceKey(scope, "s", "data")
		must(c.Del(ctx, data).Result())(t)
		must(c.Set(ctx, data, "not a hash", 0).Result())(t)
		h.takeSizes()
		var err error
		if batched {
			release, wait := gather(t, b, h, scope, 2,
				func() { _, err = b.Admit(ctx, admitReq(scope, "raises", src)) },
				func() { _, _ = b.Admit(ctx, admitReq(scope, "mate", gatetest.Src("other"))) },
			)
			release()
			wait()
		} else {
			_, err = b.Admit(ctx, admitReq(scope, "raises", src))
		}
		if err == nil {
			t.Fatalf("batched=%v: admit over a broken data key: granted, want a script error", batched)
		}
		must(c.Del(ctx, data).Result())(t)
		a, err := b.Admit(ctx, admitReq(scope, "next", src))
		if err != nil || !a.Granted || !a.Permit.Probe {
			t.Errorf("batched=%v: the next admit after the cooldown: %+v %v, want granted as the probe", batched, a, err)
		}
	}
}

// TestBatchCluster: a batch on a Redis Cluster (every key of one
// batch under the scope's hash tag) gives each op its answer in order.
func TestBatchCluster(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.StartCluster(t).Client(t)
	h := &batchHook{}
	c.AddHook(h)
	b := newBackend(t, c, redisgate.Options{})
	const scope = "t-cluster"
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
	p := admit(t, ctx, b, scope, "held", src).Permit
	got := make([]string, 4)
	release, wait := gather(t, b, h, scope, 4,
		func() { a, err := b.Admit(ctx, admitReq(scope, "a1", src)); got[0] = fmt.Sprint(a.Granted, err) },
		func() { a, err := b.Admit(ctx, admitReq(scope, "a2", src)); got[1] = fmt.Sprint(a.Granted, err) },
		func() {
			s, err := b.Settle(ctx, settleReq(scope, src, p, gate.VerdictSuccess))
			got[2] = fmt.Sprint(s.Released, err)
		},
		func() { a, err := b.Admit(ctx, admitReq(scope, "a3", src)); got[3] = fmt.Sprint(a.Granted, err) },
	)
	release()
	wait()
	// (settles first: the settle frees the held slot, a1 and a2 take both, a3 finds them full)
	for i, want := range []string{"true <nil>", "true <nil>", "true <nil>", "false <nil>"} {
		if got[i] != want {
			t.Errorf("op %d: %s, want %s", i, got[i], want)
		}
	}
	if sizes := h.takeSizes(); sizes[len(sizes)-1] != 4 {
		t.Fatalf("batch sizes %v, want the four in one call last", sizes)
	}
}

// TestBatchLeaseSweeps: many callers admitting and settling one
// source whose leases end within a few ms, so that lease sweeps (q_sweep's
// HGETALL after the batch's flush) run inside batches between cached
// writes: the record's held count stays the number of lease fields in the
// hash, and once every lease has ended nothing is in flight.
func TestBatchLeaseSweeps(t *testing.T) {
	ctx := testCtx(t)
	const scope, callers, rounds = "t-sweeps", 24, 20
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency = 4
		s.Limits.Lease = 3 * time.Millisecond
	})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for k := range rounds {
				a, err := b.Admit(ctx, admitReq(scope, fmt.Sprint("p", i, "-", k), src))
				if err != nil {
					t.Error(err)
					return
				}
				if a.Granted && k%3 != 0 { // every third permit is left to its lease
					if _, err := b.Settle(ctx, settleReq(scope, src, a.Permit, gate.VerdictSuccess)); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	batches := 0
	for _, n := range h.takeSizes() {
		if n > 1 {
			batches++
		}
	}
	m := must(c.HGetAll(ctx, b.SourceKey(scope, "s", "")).Result())(t)
	leases := 0
	for f := range m {
		if strings.HasPrefix(f, "l") {
			leases++
		}
	}
	rec := must(redisgate.DecodeBreaker(m[redisgate.StateField]))(t)
	if held := rec["held"]; fmt.Sprint(held) != fmt.Sprint(leases) {
		t.Errorf("record held %v, %d lease fields in the hash (%d batch calls)", held, leases, batches)
	}
	waitFor(t, "every lease ended", func() bool { return peek(t, ctx, b, scope, src).Quota.InFlight == 0 })
	t.Logf("%d batch calls", batches)
}

// runOps runs fs one after the other, or, batched, as one batch call in
// that order (gathered behind a lone call held in flight).
func runOps(t *testing.T, b *redisgate.Backend, h *batchHook, scope string, batched bool, fs []func()) {
	t.Helper()
	if !batched {
		for _, f := range fs {
			f()
		}
		return
	}
	release, wait := gather(t, b, h, scope, len(fs), fs...)
	h.takeSizes()
	release()
	wait()
	if sizes := h.takeSizes(); len(sizes) != 1 || sizes[0] != len(fs) {
		t.Fatalf("batch sizes %v, want [%d]", sizes, len(fs))
	}
}

// TestBatchLineJoinedInBatch: a batch reads a line's emptiness once and
// keeps it only until an op of the batch adds to the line. An admit finds
// the line empty, a waiter with a place joins it, and a settle after both
// hands the released slot to that waiter, as the same ops one at a time do.
func TestBatchLineJoinedInBatch(t *testing.T) {
	ctx := testCtx(t)
	b, h, _ := batchFixture(t, redisgate.Options{}, "batched", "sequential")
	b.KeepArrivalOrder() // compared with the ops one at a time in arrival order
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	waiter := func(id, place string) *gate.Waiter {
		return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: map[string]string{"s": place}}
	}
	run := func(scope string, batched bool) []string {
		held := admit(t, ctx, b, scope, "held", src).Permit // the slot: full
		out := make([]string, 3)
		fs := []func(){
			func() { // an empty line, nobody joining: refused for capacity
				req := admitReq(scope, "a", src)
				req.Line = waiter("w1", "")
				a, err := b.Admit(ctx, req)
				out[0] = fmt.Sprint(a.Granted, a.Rejections, a.Places, err)
			},
			func() { // a waiter with a place joins the line
				req := admitReq(scope, "b", src)
				req.Line = waiter("w2", "earlier")
				a, err := b.Admit(ctx, req)
				out[1] = fmt.Sprint(a.Granted, a.Rejections, len(a.Places), err)
			},
			func() { // the release hands the slot to w2
				req := settleReq(scope, src, held, gate.VerdictSuccess)
				req.Line = &gate.LineHandoff{Lease: time.Minute}
				s, err := b.Settle(ctx, req)
				out[2] = fmt.Sprintf("%v %s %v", s.Released, s.Handoff, err)
			},
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	if seq[2] != "true w2 <nil>" {
		t.Fatalf("one at a time: the settle answered %s, want the slot handed to w2", seq[2])
	}
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d: batched %s, one at a time %s", i, bat[i], seq[i])
		}
	}
}

// TestBatchReadsEachSourceOnce: the sidecar's attempt (an admit with a
// waiter on an empty line, a settle that hands its slot on), many of them
// in one batch, reads the source's state hash once, in one HMGET (the
// breaker, the window, every op's lease), and the line's emptiness once:
// no command per op.
func TestBatchReadsEachSourceOnce(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 100 })
	var fs []func()
	for i := range 4 {
		p := admit(t, ctx, b, scope, fmt.Sprint("p", i), src).Permit
		fs = append(fs, func() {
			req := settleReq(scope, src, p, gate.VerdictSuccess)
			req.Line = &gate.LineHandoff{Lease: time.Second}
			if s, err := b.Settle(ctx, req); err != nil || !s.Released {
				t.Errorf("settle %s: %+v %v", p.ID, s, err)
			}
		}, func() {
			req := admitReq(scope, fmt.Sprint("q", i), src)
			req.Line = &gate.Waiter{ID: fmt.Sprint("w", i), Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Second}
			if a, err := b.Admit(ctx, req); err != nil || !a.Granted {
				t.Errorf("admit q%d: %+v %v", i, a, err)
			}
		})
	}
	must(c.ConfigResetStat(ctx).Result())(t)
	runOps(t, b, h, scope, true, fs)
	// The lone admit that holds the batch back (gather) makes one HMGET of
	// its own.
	for cmd, want := range map[string]int64{"hmget": 2, "hget": 0, "exists": 1} {
		if n := commandCalls(t, c, cmd); n != want {
			t.Errorf("%s: %d calls, want %d", cmd, n, want)
		}
	}
}

// TestNonEmptyLineOneExists (review): an admit whose waiter has no place,
// and a settle that hands its slot on, each ask a line that is not empty
// whether it is empty once, not once before their twin's own test and once
// in it.
func TestNonEmptyLineOneExists(t *testing.T) {
	ctx := testCtx(t)
	const scope = "busy"
	b, _, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	p := admit(t, ctx, b, scope, "held", src).Permit // full
	w := &gate.Waiter{ID: "w1", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute}
	must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src},
		Line: &gate.LineRead{Lease: time.Minute, Join: w, Joins: []string{"s"}}}))(t) // w1 waits
	exists := func() string {
		for _, line := range strings.Split(must(c.Info(ctx, "commandstats").Result())(t), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_exists:"); ok {
				v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				return v
			}
		}
		return "0"
	}
	must(c.ConfigResetStat(ctx).Result())(t)
	req := admitReq(scope, "q", src)
	req.Line = &gate.Waiter{ID: "w2", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute}
	if a, err := b.Admit(ctx, req); err != nil || a.Granted {
		t.Fatalf("admit behind w1: %+v %v, want refused", a, err)
	}
	if n := exists(); n != "1" {
		t.Errorf("admit with a waiter without a place, on a line with a waiter: %s EXISTS, want 1", n)
	}
	must(c.ConfigResetStat(ctx).Result())(t)
	r := settleReq(scope, src, p, gate.VerdictSuccess)
	r.Line = &gate.LineHandoff{Lease: time.Minute}
	if s, err := b.Settle(ctx, r); err != nil || s.Handoff != "w1" {
		t.Fatalf("settle: %+v %v, want the slot handed to w1", s, err)
	}
	if n := exists(); n != "1" {
		t.Errorf("settle with a handoff, on a line with a waiter: %s EXISTS, want 1", n)
	}
}

// TestBatchScopeOneMGET: a batch whose first op is an admit reads the
// scope's marker and progress in one MGET, as an admit of its own does,
// not a GET of each.
func TestBatchScopeOneMGET(t *testing.T) {
	ctx := testCtx(t)
	const scope = "mget"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 100 })
	var fs []func()
	for i := range 4 {
		fs = append(fs, func() {
			if a, err := b.Admit(ctx, admitReq(scope, fmt.Sprint("q", i), src)); err != nil || !a.Granted {
				t.Errorf("admit q%d: %+v %v", i, a, err)
			}
		})
	}
	must(c.ConfigResetStat(ctx).Result())(t)
	runOps(t, b, h, scope, true, fs)
	// The lone admit that holds the batch back (gather) makes one MGET of
	// its own, the batch one.
	for cmd, want := range map[string]int64{"mget": 2, "get": 0} {
		if n := commandCalls(t, c, cmd); n != want {
			t.Errorf("%s: %d calls, want %d", cmd, n, want)
		}
	}
}

// TestBatchGoneOpNotReused: the Backend keeps ops between calls, and an op
// whose caller gave up after it was sent is still its batch's: the admits
// that come meanwhile get ops of their own, and each caller hears its own
// reply. Here the gone admit is granted (and given back), the admits made
// while its batch is held are refused by a breaker forced open, each of
// them.
func TestBatchGoneOpNotReused(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-gone-reuse"
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	free, shut := gatetest.Src("free"), gatetest.Src("shut")
	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: shut, Action: gate.ActionForceOpen, Actor: "t", Why: "reuse"}))(t)

	held, release := h.holdNext()
	gone, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		_, err := b.Admit(gone, admitReq(scope, "orphan", free))
		done <- err
	}()
	<-held
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("admit given up in flight: %v", err)
	}
	const n = 8
	var wg sync.WaitGroup
	got := make([]gate.Admission, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { got[i], errs[i] = b.Admit(ctx, admitReq(scope, fmt.Sprint("later", i), shut)) })
	}
	waitFor(t, "the later admits gathered", func() bool { return b.Gathering(scope) == n })
	release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || got[i].Granted || len(got[i].Rejections) != 1 || got[i].Rejections[0].Source != "shut" {
			t.Errorf("admit %d on the forced-open source: %+v %v, want its own refusal", i, got[i], errs[i])
		}
	}
	waitFor(t, "the orphan's grant given back", func() bool { return b.GiveBacks().Queued == 1 })
}

// TestBatchSettlesFirst: a batch runs its settles first, then its admits,
// each kind in arrival order (settlesFirst): an admit that joined before
// the settle that frees its source's slot is granted it, the admits after
// it refused in their order, as the same ops one at a time in that order.
// (Fails with the batch in arrival order: a1 refused, a3 granted.)
func TestBatchSettlesFirst(t *testing.T) {
	ctx := testCtx(t)
	b, h, _ := batchFixture(t, redisgate.Options{}, "batched", "sequential")
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	run := func(scope string, batched bool) []string {
		held := admit(t, ctx, b, scope, "held", src).Permit // the slot: full
		out := make([]string, 4)
		adm := func(k int, id string) func() {
			return func() {
				a, err := b.Admit(ctx, admitReq(scope, id, src))
				out[k] = fmt.Sprint(id, " ", a.Granted, a.Rejections, err)
			}
		}
		set := func() {
			s, err := b.Settle(ctx, settleReq(scope, src, held, gate.VerdictSuccess))
			out[2] = fmt.Sprint("settle ", s.Released, s.Effect, err)
		}
		if batched { // in arrival order a1, a2, the settle, a3
			runOps(t, b, h, scope, true, []func(){adm(0, "a1"), adm(1, "a2"), set, adm(3, "a3")})
		} else { // one at a time in the order the batch runs them
			runOps(t, b, h, scope, false, []func(){set, adm(0, "a1"), adm(1, "a2"), adm(3, "a3")})
		}
		return out
	}
	seq, bat := run("sequential", false), run("batched", true)
	if !strings.HasPrefix(bat[0], "a1 true") || !strings.HasPrefix(bat[3], "a3 false") {
		t.Errorf("batched: %q, want a1 granted (the settle first) and a3 refused", bat)
	}
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d: batched %s, one at a time %s", i, bat[i], seq[i])
		}
	}
}
