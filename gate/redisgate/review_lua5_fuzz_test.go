package redisgate

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// FuzzReviewPeekOverrideReply: FuzzReplyParser reaches breakerAt through
// settle's reply only; the peek's per-source record (PEEK_SRC_R: breaker,
// window, quota, verdict, line) and override's reply (OVERRIDE_R) carry
// the stored breaker and window too. Whatever they hold, the parser
// returns values or an error and never panics; a view read without error
// has no epoch beyond int64 and counts no more calls than ten rows hold.
func FuzzReviewPeekOverrideReply(f *testing.F) {
	policy := gate.BreakerPolicy{Window: 10 * time.Second}
	f.Add([]byte{2, 6, 1, 0, 1, 0, 2, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0})
	src := []byte{2, 6}
	for _, e := range []string{breakerRec(1, 3, 1000, "p", "op", "why"), windowRec(1, 5, 1)} {
		src = append(append(src, 1, byte(len(e))), e...)
	}
	f.Add(src)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, _ := fuzzReply(b, 4)
		p := &parser{op: "peek"}
		ps := peekSource.parse(p, v)
		bv := breakerAt(p, ps.breaker, ps.window, policy, 1500)
		if p.err == nil && bv.Epoch > 1<<63-1 {
			t.Fatalf("peek: epoch %d", bv.Epoch)
		}
		po := &parser{op: "override"}
		or := overrideReply.parse(po, v)
		obv := breakerAt(po, or.breaker, or.window, policy, or.now)
		_ = quotaView.parse(po, or.quota)
		_ = po.events(or.evs, po.single("s"))
		if po.err == nil && obv.Epoch > 1<<63-1 {
			t.Fatalf("override: epoch %d", obv.Epoch)
		}
	})
}
