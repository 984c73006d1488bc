package redisgate

import (
	"fmt"

	"github.com/polygate/polygate/gate"
)

// parser reads a script's reply with checked conversions. The first
// mismatch is kept in err and every later read returns a zero value, so a
// caller reads a whole reply and checks err once.
type parser struct {
	op  string
	err error
}

func (p *parser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("redisgate: %s reply: %s", p.op, fmt.Sprintf(format, args...))
	}
}

// array reads an array of at least n elements; it always returns at least
// n elements, so fixed indexes below n are safe even after a failure.
func (p *parser) array(v any, n int) []any {
	a, ok := v.([]any)
	switch {
	case p.err != nil:
	case !ok:
		p.fail("want an array, got %T", v)
	case len(a) < n:
		p.fail("want an array of %d elements, got %d", n, len(a))
	default:
		return a
	}
	return make([]any, n)
}

func (p *parser) int(v any) int64 {
	i, ok := v.(int64)
	if !ok && p.err == nil {
		p.fail("want an integer, got %T", v)
	}
	return i
}

func (p *parser) uint(v any) uint64 {
	i := p.int(v)
	if i < 0 {
		p.fail("want a non-negative integer, got %d", i)
		return 0
	}
	return uint64(i)
}

func (p *parser) str(v any) string {
	s, ok := v.(string)
	if !ok && p.err == nil {
		p.fail("want a string, got %T", v)
	}
	return s
}

// single names the events of a one-source reply (source index 1).
func (p *parser) single(name string) func(int64) string {
	return func(i int64) string {
		if i != 1 {
			p.fail("source index %d, want 1", i)
		}
		return name
	}
}

// events reads {source, kind, from, to, cause, epoch, reopens, cooldown_ms,
// permit, override, actor, why} arrays; nil when there are none, as in the
// memory backend.
func (p *parser) events(v any, name func(int64) string) []gate.Event {
	var out []gate.Event
	for _, ev := range p.array(v, 0) {
		e := p.array(ev, 12)
		out = append(out, gate.Event{
			Source: name(p.int(e[0])), Kind: gate.EventKind(p.int(e[1])),
			From: gate.State(p.int(e[2])), To: gate.State(p.int(e[3])), Cause: gate.Cause(p.int(e[4])),
			Epoch: p.uint(e[5]), Reopens: int(p.int(e[6])), Cooldown: ms(p.int(e[7])),
			PermitID: p.str(e[8]), Override: gate.Override(p.int(e[9])), Actor: p.str(e[10]), Why: p.str(e[11]),
		})
	}
	return out
}

// breakerView reads {state, override, actor, why, epoch, reopens, reason,
// retry_ms, probe_out, probe_left_ms, calls, fails, consecutive, open_cause}.
func (p *parser) breakerView(v any) gate.BreakerView {
	b := p.array(v, 14)
	return gate.BreakerView{
		State: gate.State(p.int(b[0])), Override: gate.Override(p.int(b[1])), Actor: p.str(b[2]), Why: p.str(b[3]),
		Epoch: p.uint(b[4]), Reopens: int(p.int(b[5])), Reason: gate.Reason(p.int(b[6])), RetryAfter: ms(p.int(b[7])),
		ProbeOut: p.int(b[8]) == 1, ProbeLeft: ms(p.int(b[9])), Calls: p.int(b[10]), Fails: p.int(b[11]),
		Consecutive: int(p.int(b[12])), Cause: gate.OpenCause(p.int(b[13])),
	}
}

// quotaView reads {in_flight, requests, tokens}.
func (p *parser) quotaView(v any) gate.QuotaView {
	q := p.array(v, 3)
	return gate.QuotaView{InFlight: int(p.int(q[0])), Requests: p.int(q[1]), Tokens: p.int(q[2])}
}
