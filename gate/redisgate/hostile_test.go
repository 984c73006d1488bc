package redisgate_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestCorruptStoredStateRefused: a record stored with values outside what
// the sidecar names (written by another program, or a Redis not to be
// trusted) fails the read with an error that names the field, never its
// text, and is never answered as a state.
func TestCorruptStoredStateRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s")
	long := strings.Repeat("x", gate.MaxText+1)
	for _, tc := range []struct{ record, field string }{
		{"{state = 9}", "state"},
		{"{override = 7}", "override"},
		{"{state = 1, cause = 200}", "cause"},
		{"{epoch = -3}", "epoch"},
		{"{override = 1, actor = string.rep('x', 1025)}", "actor of 1025 bytes"},
		{"{state = 2, probe = string.rep('p', 2000)}", "probe of 2000 bytes"},
	} {
		key := b.SourceKey("corrupt", "s", "state")
		if err := c.Eval(ctx, "redis.call('SET', KEYS[1], cmsgpack.pack("+tc.record+"))", []string{key}).Err(); err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		_, err := b.Peek(ctx, gate.PeekRequest{Scope: "corrupt", Sources: []*gate.Source{src}})
		if err == nil || !strings.Contains(err.Error(), tc.field) || strings.Contains(err.Error(), long[:100]) {
			t.Errorf("record %s: %v, want an error naming %q", tc.record, err, tc.field)
		}
	}
}
