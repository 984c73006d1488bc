package gate

import (
	"time"
)

// WindowBuckets is the number of buckets the failure-rate window is counted
// in: a sample stays counted for between 9/10 and 10/10 of the window.
const WindowBuckets = 10

// BreakerPolicy is a source's breaker configuration. Every field is used as
// given (no defaults are filled in here); the configuration package validates
// and derives them.
type BreakerPolicy struct {
	// FailThreshold opens the breaker after this many consecutive failures (>= 1).
	FailThreshold int
	// MinCalls is the number of attempts in the window before the failure-rate
	// channel may trip (>= 1).
	MinCalls int
	// FailRate opens the breaker when failures/attempts in the window reach it, in (0, 1].
	FailRate float64
	// Window is the failure-rate window (a whole number of ms, >= WindowBuckets ms).
	Window time.Duration
	// Cooldown is how long the first opening lasts; the n-th consecutive
	// opening lasts Cooldown × 2^(n−1), capped at MaxCooldown.
	Cooldown    time.Duration
	MaxCooldown time.Duration
	// ProbeTTL is the lease of a probe: after it, the next entrant may probe.
	ProbeTTL time.Duration
}

// CooldownFor is how long the reopens-th consecutive opening lasts:
// Cooldown × 2^(reopens−1), capped at MaxCooldown, without overflow.
func (p BreakerPolicy) CooldownFor(reopens int) time.Duration {
	return time.Duration(cooldownMs(p.Cooldown.Milliseconds(), p.MaxCooldown.Milliseconds(), reopens)) * time.Millisecond
}

func cooldownMs(base, max int64, reopens int) int64 {
	shift := reopens - 1
	if shift < 0 {
		shift = 0
	}
	if shift >= 62 || base > max>>uint(shift) {
		return max
	}
	return base << uint(shift)
}

// Bucket is one slice of the failure-rate window.
type Bucket struct {
	Index int64 // now / width of the slice it counts
	Calls int64
	Fails int64
}

// Breaker is the state of one source's circuit breaker. Its methods are the
// transitions; each takes the current time in Unix milliseconds and returns
// the events it caused (with Source left empty for the backend to fill in).
// The zero value is a CLOSED breaker at epoch 0.
type Breaker struct {
	State   State
	Epoch   uint64
	Reopens int
	// OpenedAt and OpenUntil bound the current or last OPEN period (ms).
	OpenedAt  int64
	OpenUntil int64
	// Cause is why the breaker went OPEN last (failures or source_dead).
	Cause OpenCause
	// Probe is the permit holding the probe lease ("" if none), until ProbeUntil (ms).
	Probe      string
	ProbeUntil int64
	// Consecutive counts failures since the last success while CLOSED.
	Consecutive int
	// Width is the bucket width (ms) the buckets were counted with.
	Width   int64
	Buckets [WindowBuckets]Bucket
	// Override is the operator's setting, with who set it, why and when (ms).
	Override   Override
	Actor      string
	Why        string
	OverrideAt int64
}

// Entry is the breaker's answer to an attempt that wants to start.
type Entry struct {
	Allowed bool
	// Probe: the attempt is the HALF_OPEN probe and holds its lease.
	Probe bool
	// Epoch fences the attempt's outcome.
	Epoch      uint64
	Reason     Reason
	RetryAfter time.Duration
}

// check is the pure half of Enter, shared with View so that peeking and
// refusing can never disagree: the reason an attempt would be refused now and
// the time until the earliest certain retry (0 when there is none).
func (b *Breaker) check(now int64) (Reason, int64) {
	switch b.Override {
	case ForcedOpen:
		return ReasonForcedOpen, 0
	case ForcedClosed, Disabled:
		return ReasonNone, 0
	}
	switch b.State {
	case Open:
		if now < b.OpenUntil {
			return ReasonCircuitOpen, b.OpenUntil - now
		}
	case HalfOpen:
		if b.Probe != "" && now < b.ProbeUntil {
			// The probe may finish at any moment: there is no certain time.
			return ReasonProbeInFlight, 0
		}
	}
	return ReasonNone, 0
}

// Enter lets an attempt start or refuses it. An OPEN breaker whose cooldown
// has elapsed turns HALF_OPEN here, and the entrant gets the probe.
func (b *Breaker) Enter(p BreakerPolicy, permitID string, now int64) (Entry, []Event) {
	reason, wait := b.check(now)
	if reason != ReasonNone {
		return Entry{Reason: reason, RetryAfter: Millis(wait), Epoch: b.Epoch}, nil
	}
	if b.Override != NoOverride || b.State == Closed {
		return Entry{Allowed: true, Epoch: b.Epoch}, nil
	}
	var events []Event
	if b.State == Open {
		b.State = HalfOpen
		events = append(events, b.event(EventTransition, Open, CauseCooldownElapsed))
	}
	if b.Probe != "" {
		e := b.event(EventProbeExpired, HalfOpen, CauseNone)
		e.PermitID = b.Probe
		events = append(events, e)
	}
	b.Epoch++
	b.Probe = permitID
	b.ProbeUntil = now + p.ProbeTTL.Milliseconds()
	e := b.event(EventProbeLeased, HalfOpen, CauseNone)
	e.PermitID = permitID
	events = append(events, e)
	return Entry{Allowed: true, Probe: true, Epoch: b.Epoch}, events
}

// Outcome is an attempt's result as the breaker sees it.
type Outcome struct {
	PermitID string
	Epoch    uint64
	Probe    bool
	Verdict  Verdict
	// Floor is an upstream Retry-After: an OPEN this outcome causes or extends
	// lasts at least this long.
	Floor time.Duration
}

// Settle applies an outcome. Outcomes of ended rounds are stale and change
// nothing; every outcome of the current probe ends its lease.
func (b *Breaker) Settle(p BreakerPolicy, o Outcome, now int64) (Effect, []Event) {
	if b.Override == Disabled {
		if o.Probe && b.Probe == o.PermitID && o.Epoch == b.Epoch {
			b.Probe, b.ProbeUntil = "", 0
		}
		return EffectIgnored, nil
	}
	if o.Epoch != b.Epoch || (o.Probe && (b.State != HalfOpen || b.Probe != o.PermitID)) {
		return b.stale(o)
	}
	floor := o.Floor.Milliseconds()
	if o.Probe {
		switch o.Verdict {
		case VerdictSuccess:
			b.resetRound()
			b.Reopens = 0
			b.State = Closed
			return EffectApplied, []Event{b.event(EventTransition, HalfOpen, CauseProbeSucceeded)}
		case VerdictFailure, VerdictForceOpen:
			cause := CauseProbeFailed
			if o.Verdict == VerdictForceOpen {
				cause = CauseSourceDead
			}
			return EffectApplied, []Event{b.open(p, now, floor, cause)}
		default:
			b.Probe, b.ProbeUntil = "", 0
			e := b.event(EventProbeReleased, HalfOpen, CauseNone)
			e.PermitID = o.PermitID
			return EffectNoVerdict, []Event{e}
		}
	}
	switch b.State {
	case Closed:
		switch o.Verdict {
		case VerdictSuccess:
			b.record(p, now, false)
			b.Consecutive = 0
			return EffectApplied, nil
		case VerdictFailure:
			b.record(p, now, true)
			b.Consecutive++
			if b.Consecutive >= p.FailThreshold {
				return EffectApplied, []Event{b.open(p, now, floor, CauseConsecutiveFailures)}
			}
			if calls, fails := b.Counts(p, now); calls >= int64(p.MinCalls) && float64(fails)/float64(calls) >= p.FailRate {
				return EffectApplied, []Event{b.open(p, now, floor, CauseFailureRate)}
			}
			return EffectApplied, nil
		case VerdictForceOpen:
			return EffectApplied, []Event{b.open(p, now, floor, CauseSourceDead)}
		}
		return EffectNoVerdict, nil
	case Open:
		// Admitted before the breaker opened. Only a dead-source verdict still
		// matters: it may make the current opening longer, never shorter, and
		// never counts as another reopening.
		if o.Verdict == VerdictForceOpen {
			until := max(now+cooldownMs(p.Cooldown.Milliseconds(), p.MaxCooldown.Milliseconds(), b.Reopens), now+floor)
			if until > b.OpenUntil {
				b.OpenUntil = until
				b.Cause = OpenCauseSourceDead
				e := b.event(EventTransition, Open, CauseSourceDead)
				e.Cooldown = time.Duration(until-now) * time.Millisecond
				return EffectApplied, []Event{e}
			}
			return EffectApplied, nil
		}
	}
	return b.stale(o)
}

func (b *Breaker) stale(o Outcome) (Effect, []Event) {
	e := b.event(EventStaleOutcome, b.State, CauseNone)
	e.PermitID = o.PermitID
	return EffectStale, []Event{e}
}

// open moves the breaker to OPEN for the next cooldown (at least floor ms).
func (b *Breaker) open(p BreakerPolicy, now, floor int64, cause Cause) Event {
	from := b.State
	b.resetRound()
	b.Reopens++
	b.State = Open
	b.OpenedAt = now
	b.Cause = OpenCauseFailures
	if cause == CauseSourceDead {
		b.Cause = OpenCauseSourceDead
	}
	b.OpenUntil = now + max(cooldownMs(p.Cooldown.Milliseconds(), p.MaxCooldown.Milliseconds(), b.Reopens), floor)
	e := b.event(EventTransition, from, cause)
	e.Cooldown = time.Duration(b.OpenUntil-now) * time.Millisecond
	return e
}

// resetRound clears the probe lease and the counting of the round that ends.
func (b *Breaker) resetRound() {
	b.Probe, b.ProbeUntil = "", 0
	b.Consecutive = 0
	b.Buckets = [WindowBuckets]Bucket{}
}

func (b *Breaker) event(kind EventKind, from State, cause Cause) Event {
	return Event{Kind: kind, From: from, To: b.State, Cause: cause, Epoch: b.Epoch, Reopens: b.Reopens}
}

func bucketWidth(p BreakerPolicy) int64 {
	return max(p.Window.Milliseconds()/WindowBuckets, 1)
}

// record counts one attempt in the bucket of now.
func (b *Breaker) record(p BreakerPolicy, now int64, fail bool) {
	w := bucketWidth(p)
	if b.Width != w {
		// The window was reconfigured: old buckets measure other slices.
		b.Buckets = [WindowBuckets]Bucket{}
		b.Width = w
	}
	idx := now / w
	slot := &b.Buckets[idx%WindowBuckets]
	if slot.Index != idx {
		*slot = Bucket{Index: idx}
	}
	slot.Calls++
	if fail {
		slot.Fails++
	}
}

// Counts returns the attempts and failures counted in the window at now.
func (b *Breaker) Counts(p BreakerPolicy, now int64) (calls, fails int64) {
	w := bucketWidth(p)
	if b.Width != w {
		return 0, 0
	}
	idx := now / w
	for _, s := range b.Buckets {
		if s.Index > idx-WindowBuckets && s.Index <= idx {
			calls += s.Calls
			fails += s.Fails
		}
	}
	return calls, fails
}
