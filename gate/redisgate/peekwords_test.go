package redisgate_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// scribbler is a client hook that overwrites every argument of a command
// once it has run, as a hook that keeps and reuses a command's arguments
// might.
type scribbler struct{ redistest.PassThrough }

func (scribbler) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		for i := range args {
			args[i] = "scribbled"
		}
		return err
	}
}

// Peeks of one scope from many callers at once, the scope's sources
// changing from peek to peek (a reload, old and new readers meanwhile), each
// hear their own sources, in their order, with their own breakers: the
// FCALL words kept per scope (peekKeys) follow the sources, are made safely
// by the first peeks at once, and are not the slice go-redis and its hooks
// are handed (a hook that writes into a command's arguments after it ran
// changes no later peek).
func TestPeekWordsKeptPerScopeUnderConcurrentReloads(t *testing.T) {
	ctx := testCtx(t)
	client := redistest.Start(t).Client(t)
	client.AddHook(scribbler{})
	b := newBackend(t, client, redisgate.Options{})
	const scope = "words"
	shut, free := gatetest.Src("shut"), gatetest.Src("free")
	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: shut, Action: gate.ActionForceOpen, Actor: "t", Why: "words"}))(t)
	lists := [][]*gate.Source{{shut}, {free}, {shut, free}, {free, shut}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				srcs := lists[(w+i)%len(lists)]
				snap, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: srcs})
				if err != nil {
					t.Error(err)
					return
				}
				var got, want []string
				for j, v := range snap.Sources {
					got = append(got, v.Source)
					want = append(want, srcs[j].Name)
					if forced := v.Breaker.Reason == gate.ReasonForcedOpen; forced != (srcs[j] == shut) {
						t.Errorf("peek of %v: %s%cs breaker %+v", want, v.Source, 39, v.Breaker)
					}
				}
				if !slices.Equal(got, want) || len(snap.Sources) != len(srcs) {
					t.Errorf("peek of %v answered for %v", want, got)
				}
			}
		})
	}
	wg.Wait()
}

// A peek whose FCALL words are kept (peekKeys) falls back to scripts as
// any other op does where Functions are refused: its first peek (FCALL, the
// library's load refused, EVALSHA, EVAL) and the next (EVALSHA) answer for
// their sources.
func TestPeekWordsWhenFunctionsRefused(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	must(srv.Client(t).Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Result())(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	hook := &redistest.Recorder{}
	c.AddHook(hook)
	must(c.Ping(ctx).Result())(t)
	hook.Take()
	b := newBackend(t, c, redisgate.Options{})
	srcs := []*gate.Source{gatetest.Src("a"), gatetest.Src("b")}
	for round, want := range [][]string{{"fcall", "function", "evalsha", "eval"}, {"evalsha"}} {
		snap := must(b.Peek(ctx, gate.PeekRequest{Scope: "acl", Sources: srcs}))(t)
		if len(snap.Sources) != 2 || snap.Sources[0].Source != "a" || snap.Sources[1].Source != "b" {
			t.Fatalf("peek %d: %+v", round, snap.Sources)
		}
		if got, _ := hook.Take(); !slices.Equal(got, want) {
			t.Fatalf("peek %d sent %v, want %v", round, got, want)
		}
	}
}
