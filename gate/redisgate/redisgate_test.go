package redisgate_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

func newBackend(t testing.TB, c redis.UniversalClient, o redisgate.Options) *redisgate.Backend {
	t.Helper()
	b, err := redisgate.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// must(v, err)(t) is v of a call that must succeed.
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func admit(t testing.TB, ctx context.Context, b gate.Backend, scope, id string, src *gate.Source) gate.Admission {
	t.Helper()
	return must(b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: id, Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}}))(t)
}

func settle(t testing.TB, ctx context.Context, b gate.Backend, scope string, src *gate.Source, p gate.Permit, v gate.Verdict) gate.Settlement {
	t.Helper()
	return must(b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: v, ActualTokens: -1, Progress: v == gate.VerdictSuccess}))(t)
}

func peek(t testing.TB, ctx context.Context, b gate.Backend, scope string, src *gate.Source) gate.SourceView {
	t.Helper()
	return must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}}))(t).Sources[0]
}

// openBreaker trips src with fail_threshold failures.
func openBreaker(t testing.TB, ctx context.Context, b gate.Backend, scope string, src *gate.Source) gate.Settlement {
	t.Helper()
	var s gate.Settlement
	for i := range src.Breaker.FailThreshold {
		a := admit(t, ctx, b, scope, "fail"+strconv.Itoa(i), src)
		if !a.Granted {
			t.Fatalf("admit before opening: %+v", a)
		}
		s = settle(t, ctx, b, scope, src, a.Permit, gate.VerdictFailure)
	}
	if s.Breaker.State != gate.Open {
		t.Fatalf("after %d failures: %+v", src.Breaker.FailThreshold, s.Breaker)
	}
	return s
}

// serverTime is the Redis server's TIME in ms.
func serverTime(t testing.TB, ctx context.Context, c redis.UniversalClient) int64 {
	t.Helper()
	return must(c.Time(ctx).Result())(t).UnixMilli()
}

// scriptNowArgs returns the now_ms argument of every script call recorded.
func scriptNowArgs(t testing.TB, h *redistest.Recorder) []string {
	t.Helper()
	var out []string
	names, args := h.Take()
	for i, n := range names {
		if n != "evalsha" && n != "eval" && n != "fcall" {
			continue
		}
		nkeys, ok := args[i][2].(int)
		if !ok {
			t.Fatalf("numkeys of %v is %T", args[i], args[i][2])
		}
		now, ok := redisgate.HeadNow(args[i][1], args[i][3+nkeys])
		if !ok {
			t.Fatalf("first argument of %v is not a head block", args[i])
		}
		out = append(out, strconv.FormatInt(now, 10))
	}
	return out
}

// TestProductionUsesServerTime: without Options.Clock the Backend sends
// now_ms = 0 in every script call, so no clock of this process (skewed or
// not) reaches a decision; the script stamps the decision with the server's
// TIME (the OPEN starts between two TIME readings around the call), and
// another Backend reads retry_after as the cooldown less the server time
// elapsed since.
func TestProductionUsesServerTime(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	hook := &redistest.Recorder{}
	ca, cb := srv.Client(t), srv.Client(t)
	ca.AddHook(hook)
	cb.AddHook(hook)
	a := newBackend(t, ca, redisgate.Options{})
	b := newBackend(t, cb, redisgate.Options{})
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown = time.Minute
		s.Breaker.MaxCooldown = time.Hour
	})
	const scope = "time"

	p := admit(t, ctx, a, scope, "p1", src).Permit
	before := serverTime(t, ctx, ca)
	s := settle(t, ctx, a, scope, src, p, gate.VerdictFailure)
	after := serverTime(t, ctx, ca)
	if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != time.Minute {
		t.Fatalf("opening: %+v, want open for exactly the cooldown", s.Breaker)
	}
	rec := must(redisgate.DecodeBreaker(must(ca.HGet(ctx, a.SourceKey(scope, "s", ""), redisgate.StateField).Result())(t)))(t)
	openedAt := rec["opened_at"].(int64)
	if openedAt < before || openedAt > after {
		t.Fatalf("opened at %d, outside the server's TIME %d..%d around the call", openedAt, before, after)
	}

	v := peek(t, ctx, b, scope, src).Breaker
	end := serverTime(t, ctx, cb)
	lo, hi := time.Minute-time.Duration(end-before)*time.Millisecond, time.Minute
	if v.Reason != gate.ReasonCircuitOpen || v.RetryAfter < lo || v.RetryAfter > hi {
		t.Fatalf("other backend: %+v, want circuit_open with retry_after in [%v, %v]", v, lo, hi)
	}
	r := admit(t, ctx, b, scope, "p2", src)
	if r.Granted || r.Rejections[0].RetryAfter > v.RetryAfter {
		t.Fatalf("admission after the peek: %+v, want refused with retry_after <= %v", r, v.RetryAfter)
	}

	nows := scriptNowArgs(t, hook)
	if len(nows) < 4 {
		t.Fatalf("recorded %d script calls", len(nows))
	}
	for _, n := range nows {
		if n != "0" {
			t.Fatalf("a production call sent now_ms = %s, want 0 (the server's TIME)", n)
		}
	}
}

// TestTestClockIsSent: with Options.Clock every call carries its time.
func TestTestClockIsSent(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	hook := &redistest.Recorder{}
	c := srv.Client(t)
	c.AddHook(hook)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now})
	src := gatetest.Src("s")
	admit(t, ctx, b, "clock", "p1", src)
	clock.Advance(1500 * time.Microsecond)
	peek(t, ctx, b, "clock", src)
	want := []string{strconv.FormatInt(gatetest.Epoch.UnixMilli(), 10), strconv.FormatInt(gatetest.Epoch.UnixMilli()+1, 10)}
	// A first use sends FCALL, loads the library, then FCALL again.
	if got := slices.Compact(scriptNowArgs(t, hook)); !slices.Equal(got, want) {
		t.Fatalf("now_ms sent %v, want %v", got, want)
	}
}

// A peek's keys are kept per scope and list of sources: peeks of other
// lists of the same scope (a reload) and of other scopes read their own
// sources, never the kept ones. Only b is forced open, in scope s; each view
// must say which of its sources that is.
func TestPeekKeysFollowTheSources(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, redistest.Start(t).Client(t), redisgate.Options{})
	a, bb, c := gatetest.Src("a"), gatetest.Src("b"), gatetest.Src("c")
	must(b.Override(ctx, gate.OverrideRequest{Scope: "s", Source: bb, Action: gate.ActionForceOpen, Actor: "x", Why: "y"}))(t)
	for _, p := range []struct {
		scope string
		srcs  []*gate.Source
	}{
		{"s", []*gate.Source{a}}, {"s", []*gate.Source{a, bb}}, {"s", []*gate.Source{a, bb}}, {"s", []*gate.Source{bb}},
		{"s", []*gate.Source{c, bb, a}}, {"t", []*gate.Source{c, bb, a}}, {"s", []*gate.Source{a}}, {"t", []*gate.Source{bb}},
	} {
		snap := must(b.Peek(ctx, gate.PeekRequest{Scope: p.scope, Sources: p.srcs}))(t)
		if len(snap.Sources) != len(p.srcs) {
			t.Fatalf("peek of %s %d sources: %d views", p.scope, len(p.srcs), len(snap.Sources))
		}
		for i, v := range snap.Sources {
			forced := p.scope == "s" && p.srcs[i] == bb
			if v.Source != p.srcs[i].Name || (v.Breaker.Override == gate.ForcedOpen) != forced {
				t.Fatalf("peek of %s, source %d: %s with override %v, want %s forced open %v", p.scope, i, v.Source, v.Breaker.Override, p.srcs[i].Name, forced)
			}
		}
	}
}
