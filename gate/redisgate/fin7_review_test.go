package redisgate_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestHostileAnnouncementIsNotReasserted (review fin7): an announcement is
// read from Redis like a reply, so what it carries is bounded as an event
// of a reply is (EV: texts of at most gate.MaxText, enums in range). One
// that is not must not be remembered: the replica re-asserts what it
// remembers after a loss (restore.lua), and a breaker record written with
// an actor longer than gate.MaxText, or an override out of range, reads
// back as corrupt, so every peek of the scope (DescribeScope, the shared
// reads) and every settle of the source fails until an operator clears it.
func TestHostileAnnouncementIsNotReasserted(t *testing.T) {
	for name, ann := range map[string]struct {
		override gate.Override
		actor    string
	}{
		"actor longer than MaxText": {gate.ForcedOpen, strings.Repeat("a", gate.MaxText+1)},
		"override out of range":     {gate.Override(9), "op"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := redistest.Start(t)
			c := srv.Client(t)
			b := newBackend(t, c, redisgate.Options{})
			got := subscribe(t, b, c)
			const scope = "hostile"
			src := gatetest.Src("s")
			settle(t, ctx, b, scope, src, admit(t, ctx, b, scope, "p0", src).Permit, gate.VerdictSuccess)

			payload, err := json.Marshal([]any{1, scope, src.Name, int(gate.EventOverride), int(gate.Closed), int(gate.Closed),
				int(gate.CauseNone), 0, 0, 0, int(ann.override), ann.actor, "why"})
			if err != nil {
				t.Fatal(err)
			}
			must(c.Publish(ctx, "polygate:{"+scope+"}:events", string(payload)).Result())(t)
			// A well-formed announcement after it: once it is heard, the
			// hostile one was read (or dropped) before it.
			must(c.Publish(ctx, "polygate:{"+scope+"}:events", `[1,"`+scope+`","other",1,0,1,1,0,1,1000,0,"",""]`).Result())(t)
			for a := next(t, got); a.e.Source != "other"; a = next(t, got) {
			}

			must(c.FlushAll(ctx).Result())(t)  // Redis lost the scope
			admit(t, ctx, b, scope, "p1", src) // finds the loss and re-asserts what b remembers
			if _, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}}); err != nil {
				t.Fatalf("peek after the re-assert: %v (the re-assert wrote what the hostile announcement said)", err)
			}
		})
	}
}

// TestSettleOfLongPermitIDQueuesNothing (review fin7): a Settle whose
// permit id is longer than gate.MaxText (which Admit refuses, so no lease
// can be held under it) is refused before the round trip, as Admit's is:
// not run, then its reply refused for the id it echoes (EV.permit of the
// stale outcome) and queued for a give-back that fails the same way and is
// dropped with an error in the log.
func TestSettleOfLongPermitIDQueuesNothing(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, redistest.Start(t).Client(t), redisgate.Options{})
	src := gatetest.Src("s")
	const scope = "long-id"
	settle(t, ctx, b, scope, src, admit(t, ctx, b, scope, "p0", src).Permit, gate.VerdictSuccess)
	long := strings.Repeat("p", gate.MaxText+1)
	_, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: long, Epoch: 1, Verdict: gate.VerdictFailure, ActualTokens: -1})
	if err == nil || strings.Contains(err.Error(), long) {
		t.Fatalf("Settle of a %d-byte permit id: %v, want an error without the id", len(long), err)
	}
	if q := b.GiveBacks().Queued; q != 0 {
		t.Fatalf("Settle of a %d-byte permit id queued %d give-backs (%v), want none", len(long), q, err)
	}
}
