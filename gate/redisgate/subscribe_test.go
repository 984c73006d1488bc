package redisgate_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

type announced struct {
	scope string
	e     gate.Event
}

// subscribe runs b.Subscribe until the test ends and waits until Redis
// counts its pattern subscription.
func subscribe(t *testing.T, b *redisgate.Backend, c redis.UniversalClient) <-chan announced {
	t.Helper()
	got := make(chan announced, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Subscribe(ctx, func(scope string, e gate.Event) { got <- announced{scope, e} }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe returned %v after its context ended, want nil", err)
		}
	})
	waitSubscribed(t, c)
	return got
}

// waitSubscribed polls PUBSUB NUMPAT (on every master of a cluster) until
// a pattern subscription is counted.
func waitSubscribed(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var n atomic.Int64
		switch c := c.(type) {
		case *redis.ClusterClient:
			_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				k, _ := m.PubSubNumPat(ctx).Result()
				n.Add(k)
				return nil
			})
		default:
			k, _ := c.PubSubNumPat(ctx).Result()
			n.Add(k)
		}
		if n.Load() > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the subscription was never counted by PUBSUB NUMPAT")
		case <-tick.C:
		}
	}
}

func next(t *testing.T, got <-chan announced) announced {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no announcement within 20s")
	}
	return announced{}
}

// wantAnnounced checks that the next announcements are the events, in
// order, as the acting Backend returned them (announcements carry no permit).
func wantAnnounced(t *testing.T, got <-chan announced, scope string, events ...gate.Event) {
	t.Helper()
	for _, e := range events {
		e.PermitID = ""
		if a := next(t, got); a.scope != scope || a.e != e {
			t.Fatalf("announced %q %+v, want %q %+v", a.scope, a.e, scope, e)
		}
	}
}

// TestAnnouncements: a breaker that opens, closes, or is reset or overridden
// through one Backend is announced to a Subscribe of another, in order, and
// nothing else is; the subscription survives a restart of Redis.
func TestAnnouncements(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	clock := gatetest.NewClock()
	a := newBackend(t, srv.Client(t), redisgate.Options{Clock: clock.Now})
	bc := srv.Client(t)
	b := newBackend(t, bc, redisgate.Options{Clock: clock.Now})
	got := subscribe(t, b, bc)
	const scope = "news"
	src := gatetest.Src("s")

	s := openBreaker(t, ctx, a, scope, src)
	wantAnnounced(t, got, scope, s.Events...)

	clock.Advance(s.Breaker.RetryAfter)
	probe := admit(t, ctx, a, scope, "probe", src) // half-open and probe leased: not announced
	closed := settle(t, ctx, a, scope, src, probe.Permit, gate.VerdictSuccess)
	wantAnnounced(t, got, scope, closed.Events...)

	s = openBreaker(t, ctx, a, scope, src)
	wantAnnounced(t, got, scope, s.Events...)
	reset := must(a.Override(ctx, gate.OverrideRequest{Scope: scope, Source: src, Action: gate.ActionReset, Actor: "op", Why: "fixed"}))(t)
	if len(reset.Events) != 2 {
		t.Fatalf("reset of an open breaker: %+v, want the override and the transition", reset.Events)
	}
	wantAnnounced(t, got, scope, reset.Events...)

	srv.Stop()
	srv.Start()
	waitSubscribed(t, bc)
	forced := must(a.Override(ctx, gate.OverrideRequest{Scope: "other {scope}", Source: src, Action: gate.ActionForceOpen, Actor: "op", Why: "after restart"}))(t)
	wantAnnounced(t, got, "other {scope}", forced.Events...)
}

// TestAnnouncementsOnCluster: one pattern subscription hears scopes whose
// keys live on different masters.
func TestAnnouncementsOnCluster(t *testing.T) {
	ctx := testCtx(t)
	cl := redistest.StartCluster(t)
	clock := gatetest.NewClock()
	a := newBackend(t, cl.Client(t), redisgate.Options{Clock: clock.Now})
	bc := cl.Client(t)
	b := newBackend(t, bc, redisgate.Options{Clock: clock.Now})
	got := subscribe(t, b, bc)
	src := gatetest.Src("s")
	for _, scope := range []string{"a", "b", "c", "d", "e", "f", "{", "}", "x}y{z"} {
		s := openBreaker(t, ctx, a, scope, src)
		wantAnnounced(t, got, scope, s.Events...)
	}
}

// TestAnnouncedScopesBounded: announcements naming ever new scopes (anyone
// who can PUBLISH can send them) do not grow what a Backend keeps of
// scopes past its bound.
func TestAnnouncedScopesBounded(t *testing.T) {
	c := redistest.Start(t).Client(t)
	b := must(redisgate.New(c, redisgate.Options{}))(t)
	n := 2*redisgate.MaxRecords + 500
	var heard atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Subscribe(ctx, func(string, gate.Event) { heard.Add(1) }) }()
	defer func() { cancel(); <-done }()
	waitSubscribed(t, c)
	p := c.Pipeline()
	for i := range n {
		scope := fmt.Sprintf("s%d", i)
		p.Publish(ctx, "polygate:{"+scope+"}:events",
			fmt.Sprintf(`[1,%q,"a","m",2,1,%d,0,0,0,0,0,0,"",0,"",""]`, scope, gate.EventOverride))
	}
	must(p.Exec(ctx))(t)
	deadline := time.Now().Add(time.Minute)
	for heard.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("heard %d of %d announcements within a minute", heard.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := b.WatchedScopes(); got > 2*redisgate.MaxRecords {
		t.Fatalf("%d scopes watched after %d announced, want at most %d", got, n, 2*redisgate.MaxRecords)
	}
}
