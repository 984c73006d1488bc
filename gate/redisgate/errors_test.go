package redisgate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestLongPermitIDRefused: a permit id longer than gate.MaxText is refused
// before anything is stored (stored as the breaker's probe, it would be
// read back as a corrupt record), naming its length, not its bytes; the
// longest allowed is granted.
func TestLongPermitIDRefused(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, redistest.Start(t).Client(t), redisgate.Options{})
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	long := strings.Repeat("p", gate.MaxText+1)
	_, err := b.Admit(ctx, gate.AdmitRequest{Scope: "k", PermitID: long, Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}})
	if err == nil || strings.Contains(err.Error(), long) || !strings.Contains(err.Error(), "1025 bytes") {
		t.Fatalf("a permit id of %d bytes: %v, want an error naming its length", len(long), err)
	}
	a, err := b.Admit(ctx, gate.AdmitRequest{Scope: "k", PermitID: long[1:], Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}})
	if err != nil || !a.Granted {
		t.Fatalf("a permit id of %d bytes after a refused one (whose slot must be free): %+v, %v", gate.MaxText, a, err)
	}
}

func TestNewRejectsABraceInThePrefix(t *testing.T) {
	c := redistest.Start(t).Client(t)
	for _, p := range []string{"a{", "}b"} {
		if _, err := redisgate.New(c, redisgate.Options{Prefix: p}); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
}

// TestErrorKinds: only errors of reaching Redis wrap gate.ErrUnavailable; a
// failing script (here: a key of the wrong type) does not, and the caller's
// context ending passes through as itself.
func TestErrorKinds(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, redisgate.Options{Prefix: "kinds:"})
	src := gatetest.Src("s")
	req := gate.AdmitRequest{Scope: "k", PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}}

	warm(t, b, "k")
	if err := c.Set(ctx, b.SourceKey("k", "s", "leases"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := b.Admit(ctx, req)
	if err == nil || errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("script error: %v, want an error that is not gate.ErrUnavailable", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Admit(cancelled, req)
	if !errors.Is(err, context.Canceled) || errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("cancelled call: %v, want context.Canceled and not gate.ErrUnavailable", err)
	}

	_, err = b.Override(ctx, gate.OverrideRequest{Scope: "k", Source: src, Action: gate.Action(99)})
	if !errors.Is(err, gate.ErrUnknownAction) {
		t.Fatalf("unknown action: %v, want gate.ErrUnknownAction", err)
	}

	srv.Stop()
	if _, err := b.Peek(ctx, gate.PeekRequest{Scope: "k", Sources: []*gate.Source{src}}); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("Redis down: %v, want gate.ErrUnavailable", err)
	}
	if err := b.Ping(ctx); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("Ping with Redis down: %v, want gate.ErrUnavailable", err)
	}
}

// TestRaisedSettleKeepsItsLease: a settle that raises while it settles the
// permit's tokens (the minute's tokens key broken) keeps the permit's
// slot, so that the settle repeated frees it and applies its outcome.
func TestRaisedSettleKeepsItsLease(t *testing.T) {
	ctx := testCtx(t)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency = 1
		s.Limits.RPM = 1000
	})
	const scope = "t-settle-raise"
	b, _, c := batchFixture(t, redisgate.Options{})
	p := admit(t, ctx, b, scope, "p", src).Permit
	data := b.SourceKey(scope, "s", "tokens")
	must(c.Del(ctx, data).Result())(t)
	must(c.Set(ctx, data, "not a hash", 0).Result())(t)
	req := settleReq(scope, src, p, gate.VerdictSuccess)
	req.ActualTokens = 5
	if _, err := b.Settle(ctx, req); err == nil {
		t.Fatal("settle over a broken data key: no error")
	}
	must(c.Del(ctx, data).Result())(t)
	// The slot is still held, with its lease: the settle repeated (as the
	// give-back queue does) releases it.
	if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != 1 {
		t.Errorf("in flight %d after the settle that raised, want 1 (its lease kept)", q.InFlight)
	}
	if s, err := b.Settle(ctx, req); err != nil || !s.Released {
		t.Errorf("the settle repeated: %+v %v, want released", s, err)
	}
	if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != 0 {
		t.Errorf("in flight %d after the settle repeated, want 0", q.InFlight)
	}
}
