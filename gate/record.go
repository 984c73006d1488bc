package gate

import "time"

// Record is what a replica last saw of a shared backend's breaker: the last
// OPEN (until it closed) and the override. Times are durations back from
// (or ahead of) the moment the record was read, so that a backend with
// another clock can take it over: a degraded on_unavailable: local gate
// starts each outage from the records of the shared backend.
type Record struct {
	Scope, Source string
	// Open: the breaker was last seen OPEN, OpenedAgo ago, with OpenLeft of
	// its cooldown left (0 or less: elapsed, the breaker reads HALF_OPEN).
	Open      bool
	OpenLeft  time.Duration
	OpenedAgo time.Duration
	Reopens   int
	Epoch     uint64
	Cause     OpenCause
	// Override is the operator's setting, set OverrideAgo ago.
	Override    Override
	Actor, Why  string
	OverrideAgo time.Duration
	// Probe, when set, is the permit that holds the breaker's HALF_OPEN
	// probe (of epoch Epoch) for ProbeLeft more: the breaker is HALF_OPEN
	// with it out, whatever Open says, so that its outcome is not stale.
	Probe     string
	ProbeLeft time.Duration
	// Minute is the admissions the shared backend made for this replica
	// over the last minute, At on the clock of the backend that takes the
	// record: they count in its RPM and TPM until they leave the minute.
	Minute []Charge
}

// Breaker is the breaker r describes at now (ms): HALF_OPEN with its probe
// out, OPEN with its cooldown left, or CLOSED, and the override; no window
// counts.
func (r Record) Breaker(now int64) Breaker {
	b := Breaker{Epoch: r.Epoch, Override: r.Override}
	if r.Override != NoOverride {
		b.Actor, b.Why, b.OverrideAt = r.Actor, r.Why, now-r.OverrideAgo.Milliseconds()
	}
	switch {
	case r.Probe != "":
		b.State, b.Reopens, b.Probe = HalfOpen, max(r.Reopens, 1), r.Probe
		b.ProbeUntil = now + (r.ProbeLeft + time.Millisecond - 1).Milliseconds()
	case r.Open:
		b.State, b.Reopens, b.Cause = Open, max(r.Reopens, 1), r.Cause
		b.OpenedAt = now - r.OpenedAgo.Milliseconds()
		b.OpenUntil = now + (r.OpenLeft + time.Millisecond - 1).Milliseconds() // rounded up: never early
		if b.Cause == OpenCauseNone {
			b.Cause = OpenCauseFailures
		}
	}
	return b
}

// StateLoss is what one replica saw of a shared backend losing a scope's
// state (a Redis restarted without persistence, or a failover to an empty
// replica), for DescribeScope.
type StateLoss struct {
	// Count is how many losses the replica found; Last is when it found
	// the last one.
	Count uint64
	Last  time.Time
	// Restored is how many breakers the last re-assert wrote.
	Restored int
	// Pending: a loss was found and its re-assert has not succeeded yet.
	Pending bool
}
