package redisgate_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestFunctionsRefused: where FUNCTION LOAD is refused (an ACL without it,
// or a Redis before 7) the error says what polygate needs.
func TestFunctionsRefused(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	must(srv.Client(t).Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Result())(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, redisgate.Options{})
	_, err := b.Admit(ctx, admitReq("fn", "p1", gatetest.Src("s")))
	if err == nil || !strings.Contains(err.Error(), "Redis 7 or later, and an ACL that allows FUNCTION LOAD") {
		t.Fatalf("admit without FUNCTION LOAD: %v, want an error saying what is needed", err)
	}
}
