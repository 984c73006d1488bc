package gate

import "fmt"

// State is the automatic state of a breaker.
type State uint8

const (
	Closed State = iota
	Open
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Override is an operator's manual setting of a breaker. It stays until it is
// cleared; automatic transitions never clear it.
type Override uint8

const (
	// NoOverride lets the automatic state decide.
	NoOverride Override = iota
	// ForcedOpen refuses every attempt.
	ForcedOpen
	// ForcedClosed admits every attempt; outcomes still feed the automatic
	// state, so an operator can see what the breaker would do.
	ForcedClosed
	// Disabled admits every attempt and records nothing.
	Disabled
)

func (o Override) String() string {
	switch o {
	case NoOverride:
		return "none"
	case ForcedOpen:
		return "forced_open"
	case ForcedClosed:
		return "forced_closed"
	case Disabled:
		return "disabled"
	}
	return fmt.Sprintf("Override(%d)", uint8(o))
}

// Action is an operator's request to a breaker.
type Action uint8

const (
	ActionForceOpen Action = iota + 1
	ActionForceClosed
	ActionDisable
	// ActionClear removes the override and leaves the automatic state as it is.
	ActionClear
	// ActionReset removes the override and returns the breaker to a clean
	// CLOSED state (window, consecutive failures and reopens cleared). It
	// advances the epoch so that outcomes of attempts admitted before the
	// reset are reported stale.
	ActionReset
)

func (a Action) String() string {
	switch a {
	case ActionForceOpen:
		return "force_open"
	case ActionForceClosed:
		return "force_closed"
	case ActionDisable:
		return "disable"
	case ActionClear:
		return "clear"
	case ActionReset:
		return "reset"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Reason says why a candidate source was refused.
type Reason uint8

const (
	ReasonNone Reason = iota
	// ReasonCooldown: the sidecar's cooldown memo remembers the source OPEN.
	ReasonCooldown
	// ReasonCircuitOpen: the breaker is OPEN; retry_after is the remaining cooldown.
	ReasonCircuitOpen
	// ReasonProbeInFlight: the breaker is HALF_OPEN and its probe is out.
	ReasonProbeInFlight
	// ReasonForcedOpen: an operator forced the breaker open.
	ReasonForcedOpen
	// ReasonAdaptivePaced: the AIMD pacer's ceiling is reached.
	ReasonAdaptivePaced
	// ReasonRateLimited: a quota dimension (concurrency, RPM, TPM) is full.
	ReasonRateLimited
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonCooldown:
		return "cooldown"
	case ReasonCircuitOpen:
		return "circuit_open"
	case ReasonProbeInFlight:
		return "probe_in_flight"
	case ReasonForcedOpen:
		return "forced_open"
	case ReasonAdaptivePaced:
		return "adaptive_paced"
	case ReasonRateLimited:
		return "rate_limited"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Gate reports whether the reason is a breaker-side refusal, the kind that
// counts in gate_rejections. Pacer and quota refusals do not.
func (r Reason) Gate() bool {
	switch r {
	case ReasonCooldown, ReasonCircuitOpen, ReasonProbeInFlight, ReasonForcedOpen:
		return true
	}
	return false
}

// Verdict is what an attempt's outcome means to the breaker.
type Verdict uint8

const (
	// VerdictNone carries no verdict: the probe, if it was one, is released.
	VerdictNone Verdict = iota
	VerdictSuccess
	VerdictFailure
	// VerdictForceOpen opens the breaker at once (a dead source).
	VerdictForceOpen
)

func (v Verdict) String() string {
	switch v {
	case VerdictNone:
		return "none"
	case VerdictSuccess:
		return "success"
	case VerdictFailure:
		return "failure"
	case VerdictForceOpen:
		return "force_open"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Effect says what a settled outcome did to the breaker.
type Effect uint8

const (
	// EffectApplied: the verdict was counted.
	EffectApplied Effect = iota
	// EffectNoVerdict: the outcome carries no verdict (rate limited, client
	// error, cancelled); a probe was released.
	EffectNoVerdict
	// EffectStale: the attempt was admitted in a round of the breaker that has
	// ended (an older epoch, or before the breaker opened); nothing changed.
	EffectStale
	// EffectIgnored: the breaker is disabled by an operator; nothing recorded.
	EffectIgnored
)

func (e Effect) String() string {
	switch e {
	case EffectApplied:
		return "applied"
	case EffectNoVerdict:
		return "no_verdict"
	case EffectStale:
		return "stale"
	case EffectIgnored:
		return "ignored"
	}
	return fmt.Sprintf("Effect(%d)", uint8(e))
}
