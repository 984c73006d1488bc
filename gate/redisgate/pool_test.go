package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestPooledOpsEachHearTheirOwn: admits and settles of one scope from many
// callers at once, some of whom give up at random moments (before their op
// is queued, while it gathers, while its batch is in flight), never hear
// another's reply: an admit on a source forced open is refused, one on a
// free source granted; a settle of a held permit releases it and shows its
// own source's breaker, one of a permit never granted releases nothing
// and shows the forced-open breaker of its source.
//
// With timeouts: a Backend timeout, and batch calls that time out now and
// then (each of them waits for its deadline and fails), so that ops go back
// to the pool after failed batches and their give-backs.
func TestPooledOpsEachHearTheirOwn(t *testing.T) {
	t.Run("cancel", func(t *testing.T) { testPooledOps(t, false) })
	t.Run("timeouts", func(t *testing.T) { testPooledOps(t, true) })
}

// giveUpSoon is ctx with a cancel that, one time in oneIn, a goroutine of
// its own calls after up to 63 yields: a caller giving up at a random
// moment (before its op is queued, while it gathers, while its batch is in
// flight).
func giveUpSoon(ctx context.Context, r *rand.Rand, oneIn int) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	if r.IntN(oneIn) == 0 {
		n := r.IntN(64)
		go func() {
			for range n {
				runtime.Gosched()
			}
			cancel()
		}()
	}
	return c, cancel
}

func testPooledOps(t *testing.T, timeouts bool) {
	ctx := testCtx(t)
	const scope = "pooled-ops"
	var o redisgate.Options
	if timeouts {
		o.Timeout = 50 * time.Millisecond
	}
	b, h, _ := batchFixture(t, o, scope)
	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		if !timeouts {
			return
		}
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				h.setTimeout(false)
				return
			default:
			}
			h.setTimeout(r.IntN(8) == 0)
			for range r.IntN(2000) {
				runtime.Gosched()
			}
		}
	}()
	free := gatetest.Src("free", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 << 20 })
	shut := gatetest.Src("shut")
	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: shut, Action: gate.ActionForceOpen, Actor: "t", Why: "pool"}))(t)

	const workers, rounds = 16, 150
	var nAdmitGone, nSettleGone atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range rounds {
				id := fmt.Sprintf("w%d-%d", w, i)
				src := free
				if r.IntN(2) == 0 {
					src = shut
				}
				actx, cancel := giveUpSoon(ctx, r, 3)
				a, err := b.Admit(actx, admitReq(scope, id, src))
				cancel()
				switch {
				case err != nil:
					nAdmitGone.Add(1)
					if !errors.Is(err, context.Canceled) && !(timeouts && errors.Is(err, gate.ErrUnavailable)) {
						t.Errorf("%s: admit: %v", id, err)
					}
				case src == shut && (a.Granted || len(a.Rejections) != 1 || a.Rejections[0].Source != "shut"):
					t.Errorf("%s: admit on the forced-open source: %+v", id, a)
				case src == free && !a.Granted:
					t.Errorf("%s: admit on the free source: %+v", id, a)
				}
				// A settle of this permit (held or not), given up at random too.
				sctx, scancel := context.WithCancel(ctx)
				if r.IntN(4) == 0 {
					scancel()
				}
				p := a.Permit
				if !a.Granted {
					p = gate.Permit{ID: id + "-never"} // an admit given up may have granted: not that one
				}
				s, err := b.Settle(sctx, settleReq(scope, src, p, gate.VerdictSuccess))
				scancel()
				switch {
				case err != nil:
					nSettleGone.Add(1)
					if !errors.Is(err, context.Canceled) && !(timeouts && errors.Is(err, gate.ErrUnavailable)) {
						t.Errorf("%s: settle: %v", id, err)
					}
				case s.Released != a.Granted:
					t.Errorf("%s: settle released %v, its admit granted %v: %+v", id, s.Released, a.Granted, s)
				case (s.Breaker.Override == gate.ForcedOpen) != (src == shut):
					t.Errorf("%s: settle on %s shows breaker %+v", id, src.Name, s.Breaker)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-flipped
	sizes := h.takeSizes()
	batched := 0
	for _, n := range sizes {
		if n > 1 {
			batched++
		}
	}
	t.Logf("%d calls, %d of them batches; canceled admits %d, settles %d", len(sizes), batched, nAdmitGone.Load(), nSettleGone.Load())
}

// TestRecordedArgumentsStayAsSent: a go-redis hook that keeps a call's
// arguments (redistest.Recorder, a tracing or logging hook) reads them as
// they were sent, not as the Backend's next op rewrote them: an admit's
// argument still carries its own now_ms after a later settle.
func TestRecordedArgumentsStayAsSent(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	hook := &redistest.Recorder{}
	c := srv.Client(t)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now})
	src := gatetest.Src("s")
	admit(t, ctx, b, "recorded", "warm", src) // loads the library
	c.AddHook(hook)
	for i := range 20 {
		a := admit(t, ctx, b, "recorded", fmt.Sprint("p", i), src)
		clock.Advance(time.Millisecond)
		settle(t, ctx, b, "recorded", src, a.Permit, gate.VerdictSuccess)
		clock.Advance(time.Millisecond)
	}
	got := scriptNowArgs(t, hook)
	for i, now := range got {
		if want := strconv.FormatInt(gatetest.Epoch.UnixMilli()+int64(i), 10); now != want {
			t.Fatalf("call %d's recorded now_ms is %s, want %s (all: %v)", i, now, want, got)
		}
	}
}

// TestPooledOpsOfEveryShape: ops of random shapes (1 to 40 candidates,
// names from a few bytes to 8 KiB, so that argument buffers of the pool
// are reused for larger and smaller ones, and some are too large to keep)
// from many callers at once each hear their own reply: refused by each
// forced-open candidate in turn, granted by the first free one.
func TestPooledOpsOfEveryShape(t *testing.T) {
	ctx := testCtx(t)
	const scope = "pooled-shapes"
	b, h, _ := batchFixture(t, redisgate.Options{}, scope)
	lengths := []int{1, 7, 100, 1000, 3000, 5000, 8 << 10}
	var shut, free []*gate.Source
	for i, n := range lengths {
		s := gatetest.Src(fmt.Sprintf("shut%d-%s", i, strings.Repeat("s", n)))
		must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: s, Action: gate.ActionForceOpen, Actor: "t", Why: "shapes"}))(t)
		shut = append(shut, s)
		free = append(free, gatetest.Src(fmt.Sprintf("free%d-%s", i, strings.Repeat("f", n)), func(s *gate.Source) { s.Limits.MaxConcurrency = 1 << 20 }))
	}
	const workers, rounds = 12, 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 11))
			for i := range rounds {
				id := fmt.Sprintf("w%d-%d", w, i)
				var srcs []*gate.Source
				for range r.IntN(40) {
					srcs = append(srcs, shut[r.IntN(len(shut))])
				}
				granted := r.IntN(3) != 0
				if granted {
					srcs = append(srcs, free[r.IntN(len(free))])
				}
				if len(srcs) == 0 {
					srcs = append(srcs, shut[r.IntN(len(shut))])
				}
				a, err := b.Admit(ctx, admitReq(scope, id, srcs...))
				if err != nil {
					t.Errorf("%s: %v", id, err)
					continue
				}
				nshut := len(srcs)
				if granted {
					nshut--
				}
				ok := a.Granted == granted && len(a.Rejections) == nshut
				for k := 0; ok && k < nshut; k++ {
					ok = a.Rejections[k].Source == srcs[k].Name
				}
				if granted && ok {
					ok = a.Permit.Source == srcs[nshut].Name
				}
				if !ok {
					t.Errorf("%s: %d candidates, granted %v: got granted %v, %d rejections", id, len(srcs), granted, a.Granted, len(a.Rejections))
					continue
				}
				if granted {
					s, err := b.Settle(ctx, settleReq(scope, srcs[nshut], a.Permit, gate.VerdictSuccess))
					if err != nil || !s.Released || s.Breaker.Override != gate.NoOverride {
						t.Errorf("%s: settle: %+v %v", id, s, err)
					}
				}
			}
		})
	}
	wg.Wait()
	batched := 0
	for _, n := range h.takeSizes() {
		if n > 1 {
			batched++
		}
	}
	t.Logf("%d batches", batched)
}
