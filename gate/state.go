package gate

import "github.com/polygate/polygate/internal/enum"

// State is the automatic state of a breaker.
type State uint8

const (
	Closed State = iota
	Open
	HalfOpen
)

var stateNames = []string{
	Closed:   "closed",
	Open:     "open",
	HalfOpen: "half_open",
}

func (s State) String() string { return enum.String(s, stateNames) }

// OpenCause is why a breaker is OPEN: the kind of outcome that opened it
// last, or an operator's FORCE_OPEN. A breaker that is not OPEN has none.
type OpenCause uint8

const (
	OpenCauseNone OpenCause = iota
	// OpenCauseFailures: failures (consecutive, failure rate, a failed probe).
	OpenCauseFailures
	// OpenCauseSourceDead: a SOURCE_DEAD outcome (auth or quota death).
	OpenCauseSourceDead
	// OpenCauseForced: an operator's FORCE_OPEN override.
	OpenCauseForced
)

var openCauseNames = []string{
	OpenCauseNone:       "none",
	OpenCauseFailures:   "failures",
	OpenCauseSourceDead: "source_dead",
	OpenCauseForced:     "forced",
}

func (c OpenCause) String() string { return enum.String(c, openCauseNames) }

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

var overrideNames = []string{
	NoOverride:   "none",
	ForcedOpen:   "forced_open",
	ForcedClosed: "forced_closed",
	Disabled:     "disabled",
}

func (o Override) String() string { return enum.String(o, overrideNames) }

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

var actionNames = []string{
	ActionForceOpen:   "force_open",
	ActionForceClosed: "force_closed",
	ActionDisable:     "disable",
	ActionClear:       "clear",
	ActionReset:       "reset",
}

func (a Action) String() string { return enum.String(a, actionNames) }

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
	// ReasonQueued: callers ranked ahead of this one wait for the source's
	// capacity (the sidecar's ordered admission; never a backend's answer).
	ReasonQueued
	// ReasonTenantLimit: the call's tenant is at its rpm, tpm or concurrency
	// limit in the scope; every source refuses it alike.
	ReasonTenantLimit
	// ReasonTenantBudget: the call's tenant has spent its token budget for
	// the window; every source refuses it alike.
	ReasonTenantBudget
)

var reasonNames = []string{
	ReasonNone:          "none",
	ReasonCooldown:      "cooldown",
	ReasonCircuitOpen:   "circuit_open",
	ReasonProbeInFlight: "probe_in_flight",
	ReasonForcedOpen:    "forced_open",
	ReasonAdaptivePaced: "adaptive_paced",
	ReasonRateLimited:   "rate_limited",
	ReasonQueued:        "queued",
	ReasonTenantLimit:   "tenant_limit",
	ReasonTenantBudget:  "tenant_budget",
}

func (r Reason) String() string { return enum.String(r, reasonNames) }

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

var verdictNames = []string{
	VerdictNone:      "none",
	VerdictSuccess:   "success",
	VerdictFailure:   "failure",
	VerdictForceOpen: "force_open",
}

func (v Verdict) String() string { return enum.String(v, verdictNames) }

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

var effectNames = []string{
	EffectApplied:   "applied",
	EffectNoVerdict: "no_verdict",
	EffectStale:     "stale",
	EffectIgnored:   "ignored",
}

func (e Effect) String() string { return enum.String(e, effectNames) }
