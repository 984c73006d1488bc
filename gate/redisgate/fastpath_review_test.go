package redisgate_test

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
)

// TestBatchAdmitExitRaisesAsTheWalk: a batch admit of one candidate whose
// SRC_CONF number and key map are both out of range (a caller that lies
// about both) fails with the walk's error, the one a walk raises first
// (its candidate's configuration), not another: the early exit looks its
// source up only where the walk would (review of the lua7 branch).
func TestBatchAdmitExitRaisesAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-exit-raise"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	c.AddHook(&confHook{fn: "_batch"})
	c.AddHook(&lastBatchOpHook{rewrite: mapTo99})
	s1, s2 := gatetest.Src("s1"), gatetest.Src("s2")
	var errs [2]error
	release, wait := gather(t, b, h, scope, 2,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "p1", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "p2", s2)) },
	)
	release()
	wait()
	for i, err := range errs {
		if want := fmt.Sprintf("an op names source configuration %d of 0", i+1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("admit %d: %v, want the missing configuration named (the walk's first error)", i+1, err)
		}
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s1, s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 || v.Sources[1].Quota.InFlight != 0 {
		t.Fatalf("after the refused batch: %+v %v, want no lease", v, err)
	}
}

// TestEarlyExitsRandomAtTheirEdges: random runs of one source's admits
// (one candidate, ids from a small pool: re-admits of a held permit,
// ceilings around the held count) and settles (mostly successes of the
// epoch, some failures, stale epochs, probe flags, actual tokens) whose
// times step by halves of the lease (leases ending exactly at an op, the
// window's bucket moving on) under two configurations that alternate at
// random (a reload within a batch: limit, lease, window width, a minute's
// limit set or not), waiters without a place and one in line with its
// place, settles that hand off, answer and store the same in one batch, where the
// early exits run, as one at a time. LUA7R_SEEDS=n runs n seeds.
func TestEarlyExitsRandomAtTheirEdges(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "warm")
	defer b.SetArrivalOrder(false)
	seeds := 30
	if testing.Short() {
		seeds = 8
	}
	if n, err := strconv.Atoi(os.Getenv("LUA7R_SEEDS")); err == nil {
		seeds = n
	}
	for seed := 1; seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(int64(seed)))
		lease := time.Duration(1+rng.Intn(2)) * time.Second
		mk := func() *gate.Source {
			mc := 1 + rng.Intn(3)
			win := []time.Duration{10 * time.Second, 20 * time.Second, 5 * time.Second}[rng.Intn(3)]
			rpm := []int64{0, 0, 1000}[rng.Intn(3)]
			l := lease
			if rng.Intn(3) == 0 {
				l = 2 * lease
			}
			return gatetest.Src("s", func(s *gate.Source) {
				s.Limits = gate.Limits{MaxConcurrency: mc, Lease: l, RPM: rpm}
				s.Breaker.FailThreshold, s.Breaker.MinCalls, s.Breaker.FailRate = 2+rng.Intn(2), 2, 0.5
				s.Breaker.Window, s.Breaker.Cooldown, s.Breaker.MaxCooldown = win, time.Second, 4*time.Second
			})
		}
		confs := []*gate.Source{mk(), mk()}
		nOps := 4 + rng.Intn(9)
		type opT struct {
			admit   bool
			id      string
			ceiling int
			conf    int
			step    time.Duration
			verdict gate.Verdict
			actual  int64
			epoch   int // 0 the permit's, 1 another, 2 a probe's claim
			waiter  int // 0 none, 1 one without a place, 2 the one in line with its place
			handoff bool
		}
		ids := []string{"a", "b", "c", "d", "h0", "h1"}
		ops := make([]opT, nOps)
		for i := range ops {
			o := opT{admit: rng.Intn(2) == 0, id: ids[rng.Intn(len(ids))], conf: rng.Intn(2), actual: -1}
			if rng.Intn(3) == 0 {
				o.step = time.Duration(rng.Intn(3)) * lease / 2
			}
			if rng.Intn(3) == 0 {
				o.ceiling = 1 + rng.Intn(3)
			}
			o.verdict = gate.VerdictSuccess
			switch rng.Intn(8) {
			case 0:
				o.verdict = gate.VerdictFailure
			case 1:
				o.verdict = gate.VerdictNone
			}
			if rng.Intn(5) == 0 {
				o.actual = int64(rng.Intn(20))
			}
			if rng.Intn(8) == 0 {
				o.epoch = 1 + rng.Intn(2)
			}
			if rng.Intn(3) == 0 {
				o.waiter = 1 + rng.Intn(2)
			}
			o.handoff = rng.Intn(3) == 0
			ops[i] = o
		}
		nHeld := rng.Intn(3)
		fails := rng.Intn(2)
		inLine := rng.Intn(2) == 0 // "wl" joins the line before the batch
		start := clock.Now()
		used := make([]gate.Permit, len(ops))
		// Even seeds run the batch as production does, settles first, and the
		// ops one at a time in that order (a settle of a permit granted in the
		// same batch stale in both); odd seeds in arrival order. Each op at
		// its own time whichever runs first.
		prod := seed%2 == 0
		b.SetArrivalOrder(!prod)
		at := make([]time.Time, len(ops))
		for i, o := range ops {
			at[i] = start
			if i > 0 {
				at[i] = at[i-1]
			}
			at[i] = at[i].Add(o.step)
		}
		run := func(scope string, batched bool, ps map[string]gate.Permit) []string {
			clock.Set(start)
			f := &fastRun{t: t, ctx: ctx, be: b, clock: clock, scope: scope, src: confs[0], ps: ps, keep: true}
			warm := gatetest.Src("warm")
			settle(t, ctx, b, scope, warm, admit(t, ctx, b, scope, "warm", warm).Permit, gate.VerdictSuccess)
			for i := range nHeld {
				f.admit(fmt.Sprint("h", i))
			}
			for i := range fails {
				f.admit(fmt.Sprint("f", i))
				f.settle(fmt.Sprint("f", i), gate.VerdictFailure)
			}
			place := ""
			if inLine {
				v := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{confs[0]},
					Line: &gate.LineRead{Lease: time.Minute, Join: fastWaiter("wl", nil), Joins: []string{"s"}}}))(t)
				place = v.Sources[0].Line.Place
			}
			f.keep = !batched
			out := make([]string, len(ops))
			fs := []func(){func() { clock.Set(start); _, _ = b.Settle(ctx, staleSettle(scope, confs[0])) }} // loads the hash
			settles, admits := []int{0}, []int{}
			for i, o := range ops {
				if o.admit {
					admits = append(admits, len(fs))
				} else {
					settles = append(settles, len(fs))
				}
				fs = append(fs, func() {
					clock.Set(at[i])
					src := confs[o.conf]
					if o.admit {
						req := admitReq(scope, o.id, src)
						if o.ceiling > 0 {
							req.Candidates[0].Ceiling = o.ceiling
						}
						req.Tokens = 7
						switch o.waiter {
						case 1:
							req.Line = fastWaiter("wn"+o.id, nil)
						case 2:
							req.Line = fastWaiter("wl", map[string]string{"s": place})
						}
						a, err := b.Admit(ctx, req)
						a.ProgressAge = 0
						if !batched && a.Granted {
							ps[o.id] = a.Permit
						}
						out[i] = fmt.Sprintf("admit %s %+v %v", o.id, a, err)
						return
					}
					// The permit settled: the sequential run's at this op, which
					// the batched run reuses (its ops cannot see each other's).
					if !batched {
						p, ok := ps[o.id]
						if !ok {
							p = gate.Permit{ID: o.id}
						}
						switch o.epoch {
						case 1:
							p.Epoch++
						case 2:
							p.Probe = true
						}
						used[i] = p
					}
					req := settleReq(scope, src, used[i], o.verdict)
					req.ActualTokens, req.Progress = o.actual, true
					if o.handoff {
						req.Line = &gate.LineHandoff{Lease: time.Minute}
					}
					s, err := b.Settle(ctx, req)
					s.ProgressAge = 0
					out[i] = fmt.Sprintf("settle %s %+v %v", o.id, s, err)
				})
			}
			if prod && !batched { // one at a time in the order the batch runs them
				var in []func()
				for _, k := range append(settles, admits...) {
					in = append(in, fs[k])
				}
				fs = in
			}
			runOps(t, b, h, scope, batched, fs)
			if len(at) > 0 {
				clock.Set(at[len(at)-1])
			}
			return out
		}
		known := map[string]gate.Permit{}
		seq := run(fmt.Sprint("seq-x", seed), false, known)
		end := clock.Now()
		bat := run(fmt.Sprint("bat-x", seed), true, known)
		if clock.Now() != end {
			t.Fatalf("seed %d: the runs' clocks differ", seed)
		}
		for i := range seq {
			if seq[i] != bat[i] {
				t.Errorf("seed %d (settles first %v) op %d (%+v):\n batched    %s\n sequential %s", seed, prod, i, ops[i], bat[i], seq[i])
			}
		}
		got, want := storedScope(t, ctx, b, c, fmt.Sprint("bat-x", seed), []string{"s"}), storedScope(t, ctx, b, c, fmt.Sprint("seq-x", seed), []string{"s"})
		for k, v := range want {
			if got[k] != v {
				t.Errorf("seed %d %s:\n batched       %s\n one at a time %s", seed, k, got[k], v)
			}
		}
		clock.Advance(time.Hour)
	}
}

// TestReadmitAfterOwnLeaseEndedCountsTheSlot: an admit of a permit id whose
// own lease ended by now (here exactly now) takes a slot anew, as the
// memory backend's Quota does: the sweep that forgets the ended lease must
// also forget that this permit held it, or the slot is not counted
// (b.lease_of, read before q_sweep, says it still holds one) and the source
// grants past its limit. One at a time and in a batch (the walk; the early
// exit does not run where a lease ended). Found by
// TestEarlyExitsRandomAtTheirEdges against the memory backend; not the
// lua7 branch's: main's walk does the same.
func TestReadmitAfterOwnLeaseEndedCountsTheSlot(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, _ := batchFixture(t, redisgate.Options{Clock: clock.Now}, "warm")
	mem := inmem.New(clock.Now)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits = gate.Limits{MaxConcurrency: 1, Lease: time.Second} })
	for _, tc := range []struct {
		name    string
		be      gate.Backend
		batched bool
	}{{"memory", mem, false}, {"redis-one-at-a-time", b, false}, {"redis-batched", b, true}} {
		t.Run(tc.name, func(t *testing.T) {
			scope := "readmit-" + tc.name
			admit(t, ctx, tc.be, scope, "p0", src)
			clock.Advance(time.Second) // p0's lease ends now
			var again, other gate.Admission
			fs := []func(){
				func() { again = must(tc.be.Admit(ctx, admitReq(scope, "p0", src)))(t) },
				func() { other = must(tc.be.Admit(ctx, admitReq(scope, "p1", src)))(t) },
			}
			if tc.batched {
				runOps(t, b, h, scope, true, fs)
			} else {
				for _, f := range fs {
					f()
				}
			}
			if !again.Granted {
				t.Fatalf("p0 again: %+v, want granted (its lease ended: the slot is free)", again)
			}
			if other.Granted {
				t.Errorf("p1: granted while p0 holds the one slot (limit 1): %+v", other)
			}
			if v := peek(t, ctx, tc.be, scope, src); v.Quota.InFlight != 1 {
				t.Errorf("in flight %d, want 1 (p0's new lease)", v.Quota.InFlight)
			}
		})
	}
}
