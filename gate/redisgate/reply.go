package redisgate

import (
	"fmt"
	"time"

	"github.com/polygate/polygate/gate"
)

// A call's reply (lua/ops.lua's run) is one flat list: each op's count of
// values, then its values, in the order lua/ops.lua lists them. Whatever
// Redis answers is checked before it is used: an integer where one is
// expected, within its range (an enum among the values the gate package
// names, a count not negative), a text of at most gate.MaxText bytes; an
// error names the reply and the field, never echoing a text.

// split cuts a call's reply into its ops' replies: each one's values, or
// the error it raised.
func split(v []any, ops int) ([]any, error) {
	c := &cursor{what: "call", a: v}
	out := make([]any, 0, ops)
	for c.more() {
		switch n := c.num("count", -1, int64(len(c.a)-1)); {
		case c.err != nil:
		case n < 0:
			msg, _ := c.next("error").(string)
			if len(msg) > 512 {
				msg = msg[:512] + "…"
			}
			out = append(out, fmt.Errorf("redisgate: script: %s", msg))
		default:
			out = append(out, c.a[:n])
			c.a = c.a[n:]
		}
	}
	if c.err == nil && len(out) != ops {
		c.fail("%d replies for %d ops", len(out), ops)
	}
	return out, c.err
}

// cursor reads a reply, its values in order; the first fault sticks (err)
// and names the reply (what) and the field.
type cursor struct {
	what string
	a    []any
	err  error
}

// reading is a cursor over the values of v, an op's reply.
func reading(what string, v any) *cursor {
	c := &cursor{what: what}
	if a, ok := v.([]any); ok {
		c.a = a
	} else {
		c.fail("not a list")
	}
	return c
}

func (c *cursor) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("redisgate: %s reply: %s", c.what, fmt.Sprintf(format, args...))
	}
}

func (c *cursor) next(name string) any {
	if len(c.a) == 0 {
		c.fail("no %s", name)
		return nil
	}
	v := c.a[0]
	c.a = c.a[1:]
	return v
}

// num is the next value, an integer within [lo, hi].
func (c *cursor) num(name string, lo, hi int64) int64 {
	n, ok := c.next(name).(int64)
	switch {
	case c.err != nil:
	case !ok:
		c.fail("%s is not an integer", name)
	case n < lo || n > hi:
		c.fail("%s %d is outside [%d, %d]", name, n, lo, hi)
	default:
		return n
	}
	return 0
}

func (c *cursor) count(name string) int64 { return c.num(name, 0, 1<<62) }

// time is a time in ms (any integer: a stored time may be anything, and
// is saturated where it is used).
func (c *cursor) time(name string) int64 { return c.num(name, -1<<62, 1<<62) }

// str is the next value, a text of at most gate.MaxText bytes.
func (c *cursor) str(name string) string {
	s, ok := c.next(name).(string)
	switch {
	case c.err != nil:
	case !ok:
		c.fail("%s is not a string", name)
	case len(s) > gate.MaxText:
		c.fail("%s of %d bytes, at most %d", name, len(s), gate.MaxText)
	default:
		return s
	}
	return ""
}

// more says whether values are left.
func (c *cursor) more() bool { return c.err == nil && len(c.a) > 0 }

// done fails unless the reply was read whole.
func (c *cursor) done() {
	if c.err == nil && len(c.a) > 0 {
		c.fail("%d values past its end", len(c.a))
	}
}

func cenum[T ~uint8](c *cursor, name string, last T) T { return T(c.num(name, 0, int64(last))) }

// notable reads lua/breaker.lua's put_notable into b: nothing more for a
// breaker CLOSED without an override (b is left as it is), else its state
// and what it holds.
func (c *cursor) notable(b *gate.Breaker) {
	if c.num("notable", 0, 1) == 0 {
		return
	}
	b.State = cenum(c, "state", gate.HalfOpen)
	b.Epoch, b.Reopens = uint64(c.count("epoch")), int(c.num("reopens", 0, 1<<31))
	b.OpenedAt, b.OpenUntil = c.time("opened_at"), c.time("open_until")
	b.Cause, b.Probe, b.ProbeUntil = cenum(c, "cause", gate.OpenCauseForced), c.str("probe"), c.time("probe_until")
	b.Override, b.Actor, b.Why = cenum(c, "override", gate.Disabled), c.str("actor"), c.str("why")
	b.OverrideAt = c.time("override_at")
}

// breaker reads lua/breaker.lua's put_breaker: a breaker, as the view it
// is at now under p (its calls and failures counted by Redis: the record's
// buckets stay there).
func (c *cursor) breaker(p gate.BreakerPolicy, now int64) (b gate.Breaker, view gate.BreakerView) {
	b.Epoch, b.Reopens = uint64(c.count("epoch")), int(c.num("reopens", 0, 1<<31))
	b.Consecutive = int(c.num("consecutive", 0, 1<<31))
	calls, fails := c.count("calls"), c.count("fails")
	c.notable(&b)
	view = b.View(p, now)
	view.Calls, view.Fails = calls, fails
	if fails > calls {
		c.fail("%d failures of %d calls", fails, calls)
	}
	return b, view
}

// groups a reply may end with (lua/breaker.lua's).
const (
	groupRejection = 1
	groupEvent     = 2
)

// event reads lua/breaker.lua's put_events' event after its group;
// source names its candidate (from 1).
func (c *cursor) event(source func(c int64) string) gate.Event {
	e := gate.Event{
		Source: source(c.count("candidate")), Kind: cenum(c, "kind", gate.EventOverride),
		From: cenum(c, "from", gate.HalfOpen), To: cenum(c, "to", gate.HalfOpen),
		Cause: cenum(c, "cause", gate.CauseReset), Epoch: uint64(c.count("epoch")),
		Reopens: int(c.num("reopens", 0, 1<<31)), Cooldown: gate.Millis(c.count("cooldown")),
		PermitID: c.str("permit"), Override: cenum(c, "override", gate.Disabled),
		Actor: c.str("actor"), Why: c.str("why"),
	}
	if e.Kind == 0 && c.err == nil {
		c.fail("event kind 0")
	}
	return e
}

// events reads the events a reply ends with.
func (c *cursor) events(source func(c int64) string) []gate.Event {
	var out []gate.Event
	for c.more() {
		if c.num("group", groupEvent, groupEvent) == groupEvent {
			out = append(out, c.event(source))
		}
	}
	return out
}

// quota reads a quota's counts: in_flight requests tokens.
func (c *cursor) quota() gate.QuotaView {
	return gate.QuotaView{InFlight: int(c.num("in_flight", 0, 1<<31)), Requests: c.count("requests"), Tokens: c.count("tokens")}
}

// line reads lua/line.lua's l_read: a source's line.
func (c *cursor) line() gate.LineView {
	l := gate.LineView{Length: int(c.num("length", 0, 1<<31)), Place: c.str("place"), Head: c.str("head"),
		Oldest: gate.Millis(c.count("oldest"))}
	for range c.num("wake", 0, gate.LineCap) {
		l.Wake = append(l.Wake, c.str("wake"))
	}
	for range c.num("groups", 0, gate.DescribeMax) {
		l.Groups = append(l.Groups, gate.LineGroup{Priority: int32(c.num("priority", -1<<31, 1<<31-1)), Tenant: c.str("tenant"),
			Waiting: int(c.num("waiting", 0, gate.DescribeMax))})
	}
	gate.SortGroups(l.Groups)
	return l
}

// progressAge is the time since the scope's last success (0: never) at
// now, both Redis's; a difference that would overflow saturates.
func progressAge(progress, now int64) time.Duration {
	if progress == 0 {
		return gate.Never
	}
	d := now - progress
	if (now > 0 && progress < 0 && d < 0) || (now < 0 && progress > 0 && d > 0) {
		return gate.Never
	}
	return gate.Millis(d)
}
