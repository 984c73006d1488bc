package redisgate_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
)

// The batch's hot blocks and replies are read into, and packed from, one
// table per layout (lib.lua's reread, L.T), refilled by every op: the tests
// here (from the review) guard that no op or candidate sees another's
// fields through them.

// TestSharedTablesMixedBatch: one batch of admits of several candidates
// each (every source its own policy and limits), probes, settles of several
// sources, waiters and handoffs, against the same ops one at a time and
// against the memory backend.
func TestSharedTablesMixedBatch(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, _ := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched")
	b.KeepArrivalOrder() // compared with the ops one at a time in arrival order
	mem := inmem.New(clock.Now)
	mk := func(name string, f func(s *gate.Source)) *gate.Source { return gatetest.Src(name, f) }
	a := mk("a", func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 1, Lease: 11 * time.Second}
		s.Breaker.ProbeTTL, s.Breaker.Cooldown, s.Breaker.MaxCooldown, s.Breaker.FailThreshold = 7*time.Second, 2*time.Second, time.Minute, 1
	})
	bb := mk("bb", func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 3, Lease: 23 * time.Second, RPM: 50}
		s.Breaker.ProbeTTL, s.Breaker.Cooldown, s.Breaker.FailThreshold = 13*time.Second, 3*time.Second, 2
	})
	c := mk("c", func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 2, Lease: 31 * time.Second, TPM: 500}
		s.Breaker.Window, s.Breaker.MinCalls, s.Breaker.FailRate, s.Breaker.FailThreshold, s.Breaker.Cooldown = 20*time.Second, 2, 0.5, 5, 5*time.Second
	})
	full := mk("full", func(s *gate.Source) { s.Limits = gate.Limits{MaxConcurrency: 1, Lease: 41 * time.Second} })
	waiter := &gate.Waiter{ID: "w", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: map[string]string{}}
	for _, scope := range []string{"sequential", "memory"} {
		var be gate.Backend = b
		if scope == "memory" {
			be = mem
		}
		warm := gatetest.Src("warm")
		settle(t, ctx, be, scope, warm, admit(t, ctx, be, scope, "warm", warm).Permit, gate.VerdictSuccess)
	}
	type perms map[string]gate.Permit
	known := perms{}
	run := func(be gate.Backend, scope string, batched bool) []string {
		ps := perms{}
		if batched || scope == "sequential" {
			ps = known
		}
		pre := perms{}
		pre["pf"] = admit(t, ctx, be, scope, "pf", full).Permit
		pre["pa"] = admit(t, ctx, be, scope, "pa", a).Permit
		settle(t, ctx, be, scope, a, pre["pa"], gate.VerdictFailure) // a OPEN for 2s
		pre["pb0"] = admit(t, ctx, be, scope, "pb0", bb).Permit
		pre["pc0"] = admit(t, ctx, be, scope, "pc0", c).Permit
		for k, v := range pre {
			ps[k] = v
		}
		clock.Advance(3 * time.Second) // a's cooldown elapsed
		out := make([]string, 12)
		ad := func(k int, id string, tokens int64, w *gate.Waiter, srcs ...*gate.Source) func() {
			return func() {
				req := admitReq(scope, id, srcs...)
				req.Tokens = tokens
				req.Line = w
				r, err := be.Admit(ctx, req)
				r.ProgressAge = 0
				out[k] = fmt.Sprintf("%+v %v", r, err)
				if r.Granted && !batched {
					ps[id] = r.Permit
				}
			}
		}
		st := func(k int, src *gate.Source, id string, v gate.Verdict, line bool) func() {
			return func() {
				p, ok := ps[id]
				if !ok {
					p = gate.Permit{ID: id}
				}
				req := settleReq(scope, src, p, v)
				if line {
					req.Line = &gate.LineHandoff{Lease: time.Minute}
				}
				r, err := be.Settle(ctx, req)
				r.ProgressAge = 0
				out[k] = fmt.Sprintf("%+v %v", r, err)
			}
		}
		fs := []func(){
			ad(0, "m1", 0, nil, full, a, bb),
			ad(1, "m2", 3, nil, a, bb),
			st(2, a, "m1", gate.VerdictFailure, false),
			st(3, c, "pc0", gate.VerdictFailure, false),
			ad(4, "m3", 40, nil, a, c, bb),
			st(5, bb, "pb0", gate.VerdictSuccess, true),
			ad(6, "m4", 5, waiter, full, c),
			st(7, bb, "nobody", gate.VerdictFailure, false),
			ad(8, "m5", 1, nil, bb),
			st(9, bb, "m2", gate.VerdictFailure, false),
			st(10, bb, "m5", gate.VerdictFailure, false),
			ad(11, "m6", 0, nil, bb, a, full),
		}
		runOps(t, b, h, scope, batched && be != gate.Backend(mem), fs) // memory: one at a time
		return out
	}
	seq := run(b, "sequential", false)
	_ = known
	bat := run(b, "batched", true)
	memo := run(mem, "memory", false)
	for i := range seq {
		if seq[i] != bat[i] || seq[i] != memo[i] {
			t.Errorf("op %d:\n batched    %s\n sequential %s\n memory     %s", i, bat[i], seq[i], memo[i])
		} else {
			t.Logf("op %d: %s", i, bat[i])
		}
	}
}

// TestSharedTablesWaitersAndRaise: in one batch, admits of several
// candidates with a waiter holding places in non-empty lines, an admit that
// raises on its second candidate (a corrupt record) after its first was
// refused, and settles that hand off, against the same ops one at a time.
func TestSharedTablesWaitersAndRaise(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
	b.KeepArrivalOrder() // compared with the ops one at a time in arrival order
	one := func(name string, lease time.Duration) *gate.Source {
		return gatetest.Src(name, func(s *gate.Source) { s.Limits = gate.Limits{MaxConcurrency: 1, Lease: lease} })
	}
	x, y, z := one("x", 3*time.Second), one("y", 5*time.Second), one("z", 7*time.Second)
	bad := gatetest.Src("bad")
	mkw := func(id string, places map[string]string) *gate.Waiter {
		return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: places}
	}
	known := map[string]gate.Permit{}
	run := func(scope string, batched bool) []string {
		must(c.HSet(ctx, b.SourceKey(scope, "bad", ""), redisgate.StateField, "corrupt").Result())(t)
		for _, s := range []*gate.Source{x, y, z} {
			known[scope+s.Name] = admit(t, ctx, b, scope, "h"+s.Name, s).Permit // full
		}
		// w0 waits in x's and y's lines.
		sv := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{x, y},
			Line: &gate.LineRead{Lease: time.Minute, Join: mkw("w0", nil), Joins: []string{"x", "y"}}}))(t)
		places := map[string]string{}
		for i, s := range []string{"x", "y"} {
			places[s] = sv.Sources[i].Line.Place
		}
		out := make([]string, 7)
		ad := func(k int, id string, w *gate.Waiter, srcs ...*gate.Source) func() {
			return func() {
				req := admitReq(scope, id, srcs...)
				req.Line = w
				r, err := b.Admit(ctx, req)
				r.ProgressAge = 0
				if err != nil && strings.Contains(err.Error(), "data string too short") {
					err = errors.New("raised: data string too short") // a batch's error reads without ERR and the script's name
				}
				out[k] = fmt.Sprintf("%+v %v", r, err)
			}
		}
		st := func(k int, src *gate.Source) func() {
			return func() {
				req := settleReq(scope, src, known[scope+src.Name], gate.VerdictSuccess)
				req.Line = &gate.LineHandoff{Lease: time.Minute}
				r, err := b.Settle(ctx, req)
				r.ProgressAge = 0
				out[k] = fmt.Sprintf("%+v %v", r, err)
			}
		}
		fs := []func(){
			ad(0, "a1", mkw("w1", nil), x, y, z),              // every line: w1 behind w0 or full
			ad(1, "a2", mkw("w0", places), z, x, y),           // w0 with its places: all full
			ad(2, "a3", mkw("w2", nil), x, bad),               // x refused, bad raises
			st(3, y),                                          // y's slot to w0
			ad(4, "a4", mkw("w0", places), x, y, z),           // w0 called at y: granted y
			st(5, x),                                          // x's slot: nobody left at x? (w0 left)
			ad(6, "a5", mkw("w3", map[string]string{}), z, x), // z full, x free
		}
		runOps(t, b, h, scope, batched, fs)
		return out
	}
	seq := run("sequential", false)
	bat := run("batched", true)
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("op %d:\n batched    %s\n sequential %s", i, bat[i], seq[i])
		} else {
			t.Logf("op %d: %s", i, bat[i])
		}
	}
}
