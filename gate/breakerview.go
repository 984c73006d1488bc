package gate

import (
	"math"
	"time"
)

// BreakerView is a read of a breaker that changes nothing: an OPEN breaker
// whose cooldown has elapsed reads HALF_OPEN with no probe out.
type BreakerView struct {
	State    State
	Override Override
	Actor    string
	Why      string
	Epoch    uint64
	Reopens  int
	// Cause is why the breaker is OPEN (OpenCauseForced for a FORCE_OPEN
	// override); OpenCauseNone when it is not OPEN.
	Cause OpenCause
	// Reason and RetryAfter are exactly what Enter would answer now
	// (ReasonNone and 0 when it would admit).
	Reason     Reason
	RetryAfter time.Duration
	// ProbeOut: a probe lease is live; ProbeLeft is its remaining time.
	ProbeOut    bool
	ProbeLeft   time.Duration
	Calls       int64
	Fails       int64
	Consecutive int
}

// Millis is a count of milliseconds as a Duration, saturating at
// Duration's ends instead of wrapping: the stored times it is taken from
// may come from a shared store (Redis) not to be trusted.
func Millis(v int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Millisecond)
	switch {
	case v > most:
		return math.MaxInt64
	case v < -most:
		return math.MinInt64
	}
	return time.Duration(v) * time.Millisecond
}

// View reads the breaker at now without changing it.
func (b *Breaker) View(p BreakerPolicy, now int64) BreakerView {
	reason, wait := b.check(now)
	v := BreakerView{
		State: b.State, Override: b.Override, Actor: b.Actor, Why: b.Why,
		Epoch: b.Epoch, Reopens: b.Reopens, Consecutive: b.Consecutive,
		Reason: reason, RetryAfter: Millis(wait),
	}
	switch {
	case b.Override == ForcedOpen:
		v.Cause = OpenCauseForced
	case b.State == Open && now >= b.OpenUntil:
		v.State = HalfOpen
	case b.State == Open:
		// A breaker saved before causes were kept opened on failures.
		v.Cause = b.Cause
		if v.Cause == OpenCauseNone {
			v.Cause = OpenCauseFailures
		}
	}
	if b.State == HalfOpen && b.Probe != "" && now < b.ProbeUntil {
		v.ProbeOut = true
		v.ProbeLeft = Millis(b.ProbeUntil - now)
	}
	v.Calls, v.Fails = b.Counts(p, now)
	return v
}
