package redisgate_test

import (
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestScriptsWhenFunctionsRefused: a server that refuses FUNCTION LOAD (here
// an ACL user without the FUNCTION command, as on Redis < 7 where the
// command is unknown) is served by scripts: EVALSHA, with EVAL once, and
// the Backend stops asking for Functions.
func TestScriptsWhenFunctionsRefused(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	must(admin.Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Result())(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	hook := &redistest.Recorder{}
	c.AddHook(hook)
	must(c.Ping(ctx).Result())(t) // connect (HELLO, CLIENT) before counting
	hook.Take()
	b := newBackend(t, c, redisgate.Options{Clock: gatetest.NewClock().Now})
	src := gatetest.Src("s")
	for round := range 3 {
		a, err := b.Admit(ctx, gate.AdmitRequest{Scope: "acl", PermitID: "p" + string(rune('a'+round)), Candidates: []gate.Candidate{{Source: src, Ceiling: 10}}})
		if err != nil || !a.Granted {
			t.Fatalf("admit %d: %+v %v", round, a, err)
		}
		got, _ := hook.Take()
		want := []string{"evalsha"}
		if round == 0 {
			// Functions refused; then the first Admit of a scope finds no
			// marker it knows, re-asserts (restore) and admits again, each
			// script sent once in full.
			want = []string{"fcall", "function", "evalsha", "eval", "evalsha", "eval", "evalsha"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("admit %d sent %v, want %v", round, got, want)
		}
	}
}
