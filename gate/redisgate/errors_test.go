package redisgate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

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
	c := redis.NewClient(failFast(srv.Addr))
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, redisgate.Options{Prefix: "kinds:"})
	src := gatetest.Src("s")
	req := gate.AdmitRequest{Scope: "k", PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}}

	if err := c.Set(ctx, b.SourceKey("k", "s", ""), "not a hash", 0).Err(); err != nil {
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
