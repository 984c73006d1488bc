package redisgate_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestOwnScopeTakesTheRoomOfScopesOnlyHeardOf: what a Backend remembers of
// breakers is bounded (MaxRemembered scopes, as many records), and other
// replicas' announcements fill it too, as may anyone who can PUBLISH to
// Redis. Once they have, a scope this Backend serves still gets room: its
// FORCE_OPEN is remembered and re-asserted after Redis lost its state, so
// the Admit after the loss is refused. (Before, the scope found no room:
// its Admits did not check for a loss, and the one after it was granted.)
func TestOwnScopeTakesTheRoomOfScopesOnlyHeardOf(t *testing.T) {
	opened := func(source string) gate.Event {
		return gate.Event{Kind: gate.EventTransition, Source: source, From: gate.Closed, To: gate.Open, Cooldown: time.Hour}
	}
	for name, fill := range map[string]func(b *redisgate.Backend){
		"every scope taken": func(b *redisgate.Backend) {
			for i := range redisgate.MaxRemembered {
				b.Hear(fmt.Sprintf("other-%d", i), opened("s"))
			}
		},
		"every record taken, by one scope": func(b *redisgate.Backend) {
			for i := range redisgate.MaxRemembered {
				b.Hear("other", opened(fmt.Sprintf("s-%d", i)))
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := redistest.Start(t)
			c := srv.Client(t)
			b := newBackend(t, c, redisgate.Options{})
			fill(b)
			src := gatetest.Src("s")
			must(b.Override(ctx, gate.OverrideRequest{Scope: "mine", Source: src, Action: gate.ActionForceOpen, Actor: "ops", Why: "INC-7"}))(t)
			must(c.FlushAll(ctx).Result())(t) // Redis lost every scope
			adm := must(b.Admit(ctx, gate.AdmitRequest{Scope: "mine", PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}}))(t)
			if adm.Granted {
				t.Fatal("granted a source forced open before Redis lost the scope: the Backend did not remember it")
			}
			if len(adm.Rejections) != 1 || adm.Rejections[0].Reason != gate.ReasonForcedOpen {
				t.Errorf("rejections %+v, want the source refused as forced open", adm.Rejections)
			}
			if got := b.StateLoss("mine"); got.Count != 1 || got.Restored != 1 {
				t.Errorf("StateLoss(mine) = %+v, want one loss found and one breaker re-asserted", got)
			}
		})
	}
}
