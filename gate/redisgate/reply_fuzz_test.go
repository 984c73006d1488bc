package redisgate

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// fuzzReply decodes fuzz bytes into a Redis script reply tree of the shapes
// go-redis hands back (int64, string, []any, nil), bounded in depth and size.
func fuzzReply(b []byte, depth int) (any, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	op, b := b[0], b[1:]
	switch op % 4 {
	case 0:
		var buf [8]byte
		n := copy(buf[:], b)
		return int64(binary.LittleEndian.Uint64(buf[:])), b[n:]
	case 1:
		n := 0
		if len(b) > 0 {
			n, b = int(b[0]), b[1:] // up to 255 bytes: a packed record
		}
		n = min(n, len(b))
		return string(b[:n]), b[n:]
	case 2:
		if depth == 0 || len(b) == 0 {
			return []any{}, b
		}
		n := int(b[0] % 16)
		b = b[1:]
		out := make([]any, 0, n)
		for range n {
			var v any
			v, b = fuzzReply(b, depth-1)
			out = append(out, v)
		}
		return out, b
	}
	return nil, b
}

// FuzzReplyParser: whatever a script (or a compromised Redis) replies, the
// parser returns values or an error, never panics, and a parse without
// error has read every field it promises; so for the packed records
// (admit's and settle's replies, the stored breaker and window, events,
// rejections).
func FuzzReplyParser(f *testing.F) {
	policy := gate.BreakerPolicy{Window: 10 * time.Second}
	f.Add([]byte{2, 13, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 3, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 1, 2, 12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 3, 'a', 'b', 'c'})
	settle := []byte{2, 3}
	for _, e := range []string{packRecord(1, 1, "", 7, 8, "h"), breakerRec(2, 3, 1000, "", "", ""), windowRec(1, 5, 1)} {
		settle = append(append(settle, 1, byte(len(e))), e...)
	}
	f.Add(settle)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, _ := fuzzReply(b, 4)
		p := &parser{op: "fuzz"}
		bv := breakerAt(p, v, "", policy, 0)
		qv := quotaView.parse(p, v)
		evs := p.events(v, p.single("s"))
		ps := &parser{op: "fuzz"}
		sr := settleReply.parse(ps, v)
		sbv := breakerAt(ps, sr.breaker, sr.window, policy, 0)
		sevs := ps.events(sr.evs, ps.single("s"))
		pa := &parser{op: "fuzz"}
		ar := admitReply.parse(pa, v)
		rjs := admitRejections(pa, ar.rejections, ar.granted, func(i int64) string { return strconv.FormatInt(i, 10) })
		if pa.err == nil && len(rjs) > len(v.(string))/8 {
			t.Fatalf("admit reply of %d bytes read %d rejections", len(v.(string)), len(rjs))
		}
		last := int64(0) // candidates named by their index: strictly increasing
		for _, rj := range rjs {
			i, _ := strconv.ParseInt(rj.Source, 10, 64)
			if pa.err == nil && (rj.Reason == gate.ReasonNone || rj.RetryAfter < 0 || i <= last || ar.granted != 0 && i >= ar.granted) {
				t.Fatalf("admit reply (granted %d) read rejections %+v", ar.granted, rjs)
			}
			last = i
		}
		if ps.err == nil && (sbv.Epoch > 1<<63-1 || len(sevs) > len(v.([]any)[0].(string))/8) {
			t.Fatalf("settle reply: epoch %d, %d events", sbv.Epoch, len(sevs))
		}
		if p.err != nil {
			return
		}
		if bv.Epoch > 1<<63-1 {
			t.Fatalf("epoch %d read from a signed integer", bv.Epoch)
		}
		for _, e := range evs {
			if e.Source != "s" || !eventInRange(e) {
				t.Fatalf("event read outside its ranges: %+v", e)
			}
		}
		for _, e := range sevs {
			if ps.err == nil && !eventInRange(e) {
				t.Fatalf("settle event read outside its ranges: %+v", e)
			}
		}
		_ = qv
	})
}

// eventInRange: every enum of e is one gate names, its counts and cooldown
// are not negative, and its texts are at most gate.MaxText bytes.
func eventInRange(e gate.Event) bool {
	return e.Kind >= gate.EventTransition && e.Kind <= gate.EventOverride &&
		e.From <= gate.HalfOpen && e.To <= gate.HalfOpen && e.Cause <= gate.CauseReset &&
		e.Override <= gate.Disabled && e.Reopens >= 0 && e.Cooldown >= 0 &&
		len(e.PermitID) <= gate.MaxText && len(e.Actor) <= gate.MaxText && len(e.Why) <= gate.MaxText
}

// TestEventsAndBreakersOutOfRange: an event's enums (kind, states, cause,
// override) out of what gate names, a negative count or cooldown, and an
// id or operator text longer than gate.MaxText — in an event or in a
// stored breaker — are refused naming the record and the field (and a
// text's length, not its bytes), not converted into another value or
// echoed into logs whole; the longest allowed text is read.
func TestEventsAndBreakersOutOfRange(t *testing.T) {
	long, longest := strings.Repeat("x", gate.MaxText+1), strings.Repeat("x", gate.MaxText)
	// event is an EV record: src, kind, from, to, cause, epoch, reopens,
	// cooldown, permit, override, actor, why.
	event := func(kind, from, to, cause, reopens, cooldown int, permit string, override int, actor, why string) string {
		return packRecord(1, kind, from, to, cause, 7, reopens, cooldown, permit, override, actor, why)
	}
	settle := func(ev, brec string) []any {
		return []any{packRecord(1, 1, ev, 100, 200, ""), brec, windowRec(1, 5, 1)}
	}
	good := breakerRec(2, 9, 1000, longest, longest, longest)
	p := &parser{op: "settle"}
	r := settleReply.parse(p, settle(event(int(gate.EventOverride), 2, 2, int(gate.CauseReset), 0, 0, longest, int(gate.Disabled), longest, longest), good))
	bv := breakerAt(p, r.breaker, r.window, gate.BreakerPolicy{Window: 10 * time.Second}, 1500)
	if evs := p.events(r.evs, p.single("s")); p.err != nil || len(evs) != 1 || !eventInRange(evs[0]) || len(bv.Why) != gate.MaxText {
		t.Fatalf("the largest allowed values: %+v, %v", evs, p.err)
	}
	for _, c := range []struct {
		name     string
		ev, brec string
		want     string
	}{
		{"kind none", event(0, 0, 1, 1, 0, 0, "", 0, "", ""), good, "EV.kind: 0, want 1 to 6"},
		{"kind 257", event(257, 0, 1, 1, 0, 0, "", 0, "", ""), good, "EV.kind: 257, want 1 to 6"},
		{"from", event(1, 3, 1, 1, 0, 0, "", 0, "", ""), good, "EV.from: 3, want 0 to 2"},
		{"to", event(1, 0, -1, 1, 0, 0, "", 0, "", ""), good, "EV.to: -1, want 0 to 2"},
		{"cause", event(1, 0, 1, 8, 0, 0, "", 0, "", ""), good, "EV.cause: 8, want 0 to 7"},
		{"reopens", event(1, 0, 1, 1, -1, 0, "", 0, "", ""), good, "EV.reopens: -1, want 0 to"},
		{"cooldown", event(1, 0, 1, 1, 0, -1, "", 0, "", ""), good, "want a non-negative integer, got -1"},
		{"override", event(6, 0, 0, 0, 0, 0, "", 4, "", ""), good, "EV.override: 4, want 0 to 3"},
		{"permit", event(2, 2, 2, 0, 0, 0, long, 0, "", ""), good, "EV.permit: 1025 bytes, at most 1024"},
		{"actor", event(6, 0, 0, 0, 0, 0, "", 1, long, ""), good, "EV.actor: 1025 bytes, at most 1024"},
		{"why", event(6, 0, 0, 0, 0, 0, "", 1, "", long), good, "EV.why: 1025 bytes, at most 1024"},
		{"stored probe", "", breakerRec(2, 9, 1000, long, "", ""), "BREC.probe: 1025 bytes, at most 1024"},
		{"stored actor", "", breakerRec(2, 9, 1000, "", long, ""), "BREC.actor: 1025 bytes, at most 1024"},
		{"stored why", "", breakerRec(2, 9, 1000, "", "", long), "BREC.why: 1025 bytes, at most 1024"},
	} {
		p := &parser{op: "settle"}
		r := settleReply.parse(p, settle(c.ev, c.brec))
		breakerAt(p, r.breaker, r.window, gate.BreakerPolicy{Window: 10 * time.Second}, 1500)
		p.events(r.evs, p.single("s"))
		if p.err == nil || !strings.Contains(p.err.Error(), c.want) || strings.Contains(p.err.Error(), long) {
			t.Errorf("%s: error %v, want one with %q (and not the text)", c.name, p.err, c.want)
		}
	}
}

// packRecord packs values as lib.lua's L.pack does for a packed record:
// an int a little-endian double, a string its 4-byte length and its bytes.
func packRecord(vals ...any) string {
	var b []byte
	for _, v := range vals {
		switch v := v.(type) {
		case int:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
		case float64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		case string:
			b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return string(b)
}

// breakerRec is a stored breaker record (stateRecord) of the given state,
// epoch, bucket width, probe, actor and why, the other numbers 0.
func breakerRec(state, epoch, width int, probe, actor, why string) string {
	return packRecord(state, epoch, 0, 0, 0, 0, 0, width, 0, 0, 0, 0, 0, 0, probe, actor, why)
}

// windowRec is a stored window (windowRecord) whose first row is index,
// calls, fails and the others zero.
func windowRec(index, calls, fails int) string {
	return packRecord(index, calls, fails) + strings.Repeat("\x00", 8*3*(gate.WindowBuckets-1))
}

// TestPackedReplyStrict: a packed record is read whole or refused with an
// error that names the record and the field: short, a string longer than
// what is left, a number that is no integer within int64, bytes past its
// end, or a table where the record should be.
func TestPackedReplyStrict(t *testing.T) {
	event := func(epoch any) string {
		return packRecord(1, 1, 0, 2, 3, epoch, 1, 500, "p", 0, "", "")
	}
	good := []any{packRecord(1, 1, event(7), 100, 200, "h"), breakerRec(2, 9, 1000, "", "op", "why"), windowRec(1, 5, 1)}
	p := &parser{op: "settle"}
	r := settleReply.parse(p, good)
	bv := breakerAt(p, r.breaker, r.window, gate.BreakerPolicy{Window: 10 * time.Second}, 1500)
	evs := p.events(r.evs, p.single("s"))
	if p.err != nil || r.released != 1 || r.handoff != "h" || r.clock != (clockReply{100, 200}) ||
		bv.State != 2 || bv.Actor != "op" || bv.Why != "why" || bv.Epoch != 9 || bv.Calls != 5 ||
		len(evs) != 1 || evs[0].Epoch != 7 || evs[0].PermitID != "p" || evs[0].Source != "s" {
		t.Fatalf("good reply: %+v %+v %+v %v", r, bv, evs, p.err)
	}
	sr := good[0].(string)
	for _, c := range []struct {
		name  string
		reply any
		want  string
	}{
		{"short", sr[:len(sr)-1], "SETTLE_R.handoff: a string of 1 bytes, 0 left"},
		{"cut in a number", sr[:3], "SETTLE_R.released: short: 3 bytes left, want a number of 8"},
		{"past its end", sr + "x", "SETTLE_R: 1 bytes past its end"},
		{"a string too long", packRecord(1, 1) + "\xff\xff\xff\x7f", "SETTLE_R.events: a string of 2147483647 bytes, 0 left"},
		{"a fraction", packRecord(1.5), "SETTLE_R.released: 1.5 is not an integer within int64"},
		{"beyond int64", packRecord(math.Inf(1)), "SETTLE_R.released: +Inf is not an integer within int64"},
		{"NaN", packRecord(math.NaN()), "SETTLE_R.released: NaN is not an integer within int64"},
		{"a table", []any{int64(1)}, "want a string, got []interface {}"},
	} {
		p := &parser{op: "settle"}
		settleReply.parse(p, []any{c.reply, "", ""})
		if p.err == nil || !strings.Contains(p.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.name, p.err, c.want)
		}
	}
	// The stored breaker and window a view is made from: whole or refused.
	rec := breakerRec(2, 9, 1000, "", "op", "why")
	row := packRecord(1, 5, 1)
	for _, c := range []struct {
		name, rec, win, want string
	}{
		{"a cut record", rec[:len(rec)-1], "", "BREC.why: a string of 3 bytes, 2 left"},
		{"a record and more", rec + "x", "", "BREC: 1 bytes past its end"},
		{"a window short of rows", rec, strings.Repeat(row, 5), "WIN: 5 rows, want 10"},
		{"a window of too many rows", rec, strings.Repeat(row, 11), "WIN: more than 10 rows"},
		{"a cut row", rec, windowRec(1, 5, 1)[:239], "WIN.fails: short: 7 bytes left"},
	} {
		p := &parser{op: "settle"}
		breakerAt(p, c.rec, c.win, gate.BreakerPolicy{Window: 10 * time.Second}, 1500)
		if p.err == nil || !strings.Contains(p.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.name, p.err, c.want)
		}
	}
	// A list of records: a cut record fails the list, a negative epoch the
	// event.
	for _, c := range []struct {
		name, list, want string
	}{
		{"cut", event(1) + event(2)[:20], "EV.from: short: 4 bytes left"},
		{"negative epoch", event(-1), "want a non-negative integer, got -1"},
	} {
		p := &parser{op: "settle"}
		p.events(c.list, p.single("s"))
		if p.err == nil || !strings.Contains(p.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.name, p.err, c.want)
		}
	}
}

// FuzzPeekOverrideReply: FuzzReplyParser reaches breakerAt through
// settle's reply only; the peek's per-source record (PEEK_SRC_R: breaker,
// window, quota, verdict, line) and override's reply (OVERRIDE_R) carry
// the stored breaker and window too. Whatever they hold, the parser
// returns values or an error and never panics; a view read without error
// has no epoch beyond int64 and counts no more calls than ten rows hold.
func FuzzPeekOverrideReply(f *testing.F) {
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
