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

func (p *parser) nonNegative(i int64) uint64 {
	if i < 0 {
		p.fail("want a non-negative integer, got %d", i)
		return 0
	}
	return uint64(i)
}

// reason reads a refusal's reason: one gate names, never none (a
// conversion alone would wrap 257 into 1).
func (p *parser) reason(v int64) gate.Reason {
	if v < int64(gate.ReasonCooldown) || v > int64(gate.ReasonQueued) {
		p.fail("refusal reason %d outside %d..%d", v, gate.ReasonCooldown, gate.ReasonQueued)
		return gate.ReasonNone
	}
	return gate.Reason(v)
}

func (p *parser) str(v any) string {
	s, ok := v.(string)
	if !ok && p.err == nil {
		p.fail("want a string, got %T", v)
	}
	return s
}

// events reads event records (eventReply), naming each source with name;
// nil when there are none, as in the memory backend.
func (p *parser) events(v any, name func(int64) string) []gate.Event {
	var out []gate.Event
	for _, e := range eventReply.list(p, v) {
		e.v.Source = name(e.src)
		out = append(out, e.v)
	}
	return out
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
