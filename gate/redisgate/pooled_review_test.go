package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestRecordedBatchArgumentsStayAsSent: a go-redis hook that keeps a
// batch call's arguments (redistest.Recorder, as the Backend's doc asks a
// hook to: copying them) reads each op's lease field as it was sent, "l" and
// the op's permit, also once the batch's ops are back in the pool and
// reused by later ops.
func TestRecordedBatchArgumentsStayAsSent(t *testing.T) {
	ctx := testCtx(t)
	const scope = "recorded-batch"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	rec := &redistest.Recorder{}
	c.AddHook(rec)
	s := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 100 })
	ids := []string{"rec-a", "rec-b", "rec-c"}
	var fs []func()
	for _, id := range ids {
		fs = append(fs, func() { must(b.Admit(ctx, admitReq(scope, id, s)))(t) })
	}
	release, wait := gather(t, b, h, scope, len(fs), fs...)
	release()
	wait()
	// Later ops reuse the pooled ones.
	for i := range 4 {
		must(b.Admit(ctx, admitReq(scope, fmt.Sprint("later-", i), s)))(t)
	}
	names, args := rec.Take()
	var leases []string
	batches := 0
	for i, n := range names {
		if n != "fcall" || !strings.HasSuffix(fmt.Sprint(args[i][1]), "_batch") {
			continue
		}
		batches++
		for _, a := range args[i] {
			if s := fmt.Sprint(a); strings.HasPrefix(s, "lrec-") || s == "" {
				leases = append(leases, s)
			}
		}
	}
	want := []string{"lrec-a", "lrec-b", "lrec-c"}
	slices.Sort(leases)
	if batches != 1 || !slices.Equal(leases, want) {
		t.Fatalf("%d batch calls recorded, their lease fields read %q, want one batch with %q", batches, leases, want)
	}
}

// TestAdmitsOfHeldCallsEachHearTheirOwn: Admits of held calls (a line
// waiter on full sources) from many callers at once, alone and in
// batches, some given up, each read their own reply, whatever is pooled
// between Admits: their rejections name their own candidates in order,
// and their places are their own waiter's.
func TestAdmitsOfHeldCallsEachHearTheirOwn(t *testing.T) {
	ctx := testCtx(t)
	const scope = "kept-records"
	b, _, _ := batchFixture(t, redisgate.Options{}, scope)
	var shut []*gate.Source // full: each one's one slot held
	for i := range 4 {
		s := gatetest.Src(fmt.Sprintf("full%d-%s", i, strings.Repeat("x", i*300)), func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		if a := must(b.Admit(ctx, admitReq(scope, fmt.Sprint("hold", i), s)))(t); !a.Granted {
			t.Fatalf("the slot of %.8s: %+v", s.Name, a)
		}
		shut = append(shut, s)
	}
	const workers, rounds = 16, 80
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 13))
			for i := range rounds {
				id := fmt.Sprintf("x%03d-%04dx", w, i)
				srcs := slices.Clone(shut)
				r.Shuffle(len(srcs), func(i, j int) { srcs[i], srcs[j] = srcs[j], srcs[i] })
				srcs = srcs[:1+r.IntN(len(srcs))]
				req := admitReq(scope, "p"+id, srcs...)
				req.Line = &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 64, Lease: time.Minute, Places: map[string]string{}}
				for _, s := range srcs {
					req.Line.Places[s.Name] = "earlier" // it waited: it joins each line
				}
				actx, cancel := giveUpSoon(ctx, r, 4)
				a, err := b.Admit(actx, req)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("%s: %v", id, err)
					}
					continue
				}
				ok := !a.Granted && len(a.Rejections) == len(srcs) && len(a.Places) == len(srcs)
				for k := 0; ok && k < len(srcs); k++ {
					ok = a.Rejections[k].Source == srcs[k].Name &&
						strings.Contains(a.Places[srcs[k].Name], id+"|")
				}
				if !ok {
					var got []string
					for _, rj := range a.Rejections {
						got = append(got, fmt.Sprintf("%.6s:%v", rj.Source, rj.Reason))
					}
					var want []string
					for _, s := range srcs {
						want = append(want, fmt.Sprintf("%.6s: place %.60q", s.Name, a.Places[s.Name]))
					}
					t.Errorf("%s: granted %v, rejections %v, want one of each of %v", id, a.Granted, got, want)
				}
			}
		})
	}
	wg.Wait()
}
