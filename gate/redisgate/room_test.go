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

// TestRecordTickPrunesOnALossCheckToo: a record whose OPEN is over is
// pruned at every record tick, one that is also a loss check's included
// (the two coincide at every record tick where recordTicks is
// lossCheckEvery, as with a 12 ms poll_interval: nothing was pruned then
// but by a loss), and a scope only heard of goes with its last record.
func TestRecordTickPrunesOnALossCheckToo(t *testing.T) {
	const lossCheckEvery = redisgate.LossCheckEvery
	ctx := testCtx(t)
	srv := redistest.Start(t)
	b := newBackend(t, srv.Client(t), redisgate.Options{})
	b.Hear("other", gate.Event{Kind: gate.EventTransition, Source: "s", From: gate.Closed, To: gate.Open, Cooldown: time.Hour})
	must(struct{}{}, b.Reassert(ctx, 1, lossCheckEvery))(t) // its first look: marked
	if scopes, records := b.Remembered(); scopes != 1 || records != 1 {
		t.Fatalf("remembered %d scopes, %d records; want 1, 1", scopes, records)
	}
	b.ExpireRemembered()
	must(struct{}{}, b.Reassert(ctx, lossCheckEvery, lossCheckEvery))(t)
	if scopes, records := b.Remembered(); scopes != 0 || records != 0 {
		t.Errorf("after a record tick that is a loss check's too, remembered %d scopes, %d records; want the OPEN over pruned, and its scope only heard of", scopes, records)
	}
}
