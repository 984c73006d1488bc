package redisgate

import (
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// TestLaterRepliesBounded: a batch's settle that answers 1 (the next op's
// reply, one call fewer) is resolved only to the next settle of its source
// and configuration whose reply is an array, through chains; any other
// number or target is that op's error alone, and a batch with no number
// resolves nothing.
func TestLaterRepliesBounded(t *testing.T) {
	s := func(kmap, cmap string) *batchOp { return &batchOp{kind: opSettle, kmap: kmap, cmap: cmap} }
	a := &batchOp{kind: opAdmit, kmap: "\x01", cmap: "\x01"}
	full := []any{"r", "b", "w"}
	ops := []*batchOp{s("\x01", "\x01"), s("\x01", "\x01"), s("\x01", "\x01"), s("\x01", "\x02"), a, s("\x02", "\x03"), s("\x01", "\x01")}
	for _, c := range []struct {
		name    string
		replies []any
		want    []string // per op: "" no later reply, "fewer N", or an error's part
	}{
		{"none", []any{full, full, full, full, full, full, full}, nil},
		{"chain", []any{int64(1), int64(1), full, full, full, full, full}, []string{"fewer 2", "fewer 1", "", "", "", "", ""}},
		{"skip", []any{int64(2), full, full, full, full, full, full}, []string{"not the next op", "", "", "", "", "", ""}},
		{"zero", []any{int64(0), full, full, full, full, full, full}, []string{"not the next op", "", "", "", "", "", ""}},
		{"negative", []any{full, int64(-1), full, full, full, full, full}, []string{"", "not the next op", "", "", "", "", ""}},
		{"past the end", []any{full, full, full, full, full, full, int64(1)}, []string{"", "", "", "", "", "", "not the next op"}},
		{"huge", []any{int64(1 << 62), full, full, full, full, full, full}, []string{"not the next op", "", "", "", "", "", ""}},
		{"another configuration", []any{full, full, int64(1), full, full, full, full}, []string{"", "", "is not a settle of its source", "", "", "", ""}},
		{"an admit", []any{full, full, full, int64(1), full, full, full}, []string{"", "", "", "is not a settle of its source", "", "", ""}},
		{"an admit answering a number", []any{full, full, full, full, int64(1), full, full}, []string{"", "", "", "", "not the next op", "", ""}},
		{"to an error", []any{int64(1), "x", full, full, full, full, full}, []string{"not a settle's", "", "", "", "", "", ""}},
		{"chain to an error", []any{int64(1), int64(1), int64(0), full, full, full, full}, []string{"not the next op", "not the next op", "not the next op", "", "", "", ""}},
		{"far, the same source", []any{full, full, full, full, full, full, full}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := laterReplies(ops, c.replies)
			if c.want == nil {
				if got != nil {
					t.Fatalf("%+v, want nil", got)
				}
				return
			}
			for i, w := range c.want {
				l := got[i]
				switch {
				case w == "" && (l.err != nil || l.fewer != 0):
					t.Errorf("op %d: %+v, want none", i+1, l)
				case strings.HasPrefix(w, "fewer "):
					if l.err != nil || "fewer "+string(rune('0'+l.fewer)) != w || l.v == nil {
						t.Errorf("op %d: %+v, want %s", i+1, l, w)
					}
				case w != "" && !strings.HasPrefix(w, "fewer ") && (l.err == nil || !strings.Contains(l.err.Error(), w)):
					t.Errorf("op %d: %+v, want an error with %q", i+1, l, w)
				}
			}
		})
	}
}

// TestLaterReplyCallsSubtracted: a settle answered with a later settle's
// reply counts that reply's calls less the ops between; a reply that
// counts fewer calls than that (no honest run answers it) is an error
// naming both, not a negative count.
func TestLaterReplyCallsSubtracted(t *testing.T) {
	full := []any{packRecord(1, 1, "", 100, 1500, ""), breakerRec(0, 9, 1000, "", "", ""), windowRec(1, 5, 0)}
	req := gate.SettleRequest{Source: &gate.Source{Name: "s", Breaker: gate.BreakerPolicy{Window: 10 * time.Second}}}
	for _, c := range []struct {
		fewer int64
		calls int64
		err   string
	}{{0, 5, ""}, {2, 3, ""}, {5, 0, ""}, {6, 0, "a later settle's reply with 5 calls, want at least 6"}} {
		p := &parser{op: "settle"}
		var v any = full
		if c.fewer > 0 {
			v = laterReply{v: full, fewer: c.fewer}
		}
		out := settlementOf(p, v, req)
		switch {
		case c.err == "" && (p.err != nil || out.Breaker.Calls != c.calls || !out.Released):
			t.Errorf("fewer %d: %+v, %v; want %d calls", c.fewer, out.Breaker, p.err, c.calls)
		case c.err != "" && (p.err == nil || !strings.Contains(p.err.Error(), c.err)):
			t.Errorf("fewer %d: error %v, want one with %q", c.fewer, p.err, c.err)
		}
	}
}
