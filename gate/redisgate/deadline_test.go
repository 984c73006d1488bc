package redisgate_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// Wrap's contract is that the caller's context ending passes
// through and only the Backend's own deadline means unavailable. When the
// caller's deadline is the earliest one, the client (ContextTimeoutEnabled,
// as the sidecar sets it) puts it on the socket, and the socket's timeout
// can fire before the context's timer has cancelled it: wrap sees
// ctx.Err() == nil and answers gate.ErrUnavailable for a caller that merely
// ran out of time (fallback then goes degraded). Each round holds a peek on
// Redis (CLIENT PAUSE WRITE) past the caller's deadline, then releases it.
// DescribeScope's peek runs under the caller's context.
func TestCallerDeadlineIsNotUnavailable(t *testing.T) {
	ctx := testCtx(t)
	r := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { admin.Close() })
	b := newBackend(t, client, redisgate.Options{Timeout: time.Minute})
	req := gate.PeekRequest{Scope: "s", Sources: []*gate.Source{gatetest.Src("a")}}
	must(b.Peek(ctx, req))(t)
	for round := range 20 {
		if err := admin.Do(ctx, "CLIENT", "PAUSE", int64(time.Minute/time.Millisecond), "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		gone, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		var wg sync.WaitGroup
		wg.Go(func() {
			<-gone.Done()
			if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Error(err)
			}
		})
		_, err := b.Peek(gone, req)
		wg.Wait()
		cancel()
		if err != nil && (errors.Is(err, gate.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("round %d: a peek whose caller's deadline passed while Redis held it: %v, want the caller's deadline (or the answer, when Redis beat the socket's timer), not unavailable", round, err)
		}
	}
}
