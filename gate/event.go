package gate

import (
	"fmt"
	"time"
)

// EventKind names a thing that happened to a breaker.
type EventKind uint8

const (
	// EventTransition: the automatic state changed (From → To, Cause says why).
	// An OPEN that a late dead-source outcome extends is a transition OPEN → OPEN.
	EventTransition EventKind = iota + 1
	// EventProbeLeased: a probe was handed out under a new epoch.
	EventProbeLeased
	// EventProbeExpired: a probe's lease ran out before its outcome came back;
	// the next entrant gets a new probe and the old one's outcome is stale.
	EventProbeExpired
	// EventProbeReleased: the probe ended without a verdict (cancelled,
	// rate limited, client error); the next entrant may probe at once.
	EventProbeReleased
	// EventStaleOutcome: an outcome from an ended round arrived and changed nothing.
	EventStaleOutcome
	// EventOverride: an operator set or cleared an override, or reset the breaker.
	EventOverride
)

func (k EventKind) String() string {
	switch k {
	case EventTransition:
		return "transition"
	case EventProbeLeased:
		return "probe_leased"
	case EventProbeExpired:
		return "probe_expired"
	case EventProbeReleased:
		return "probe_released"
	case EventStaleOutcome:
		return "stale_outcome"
	case EventOverride:
		return "override"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Cause says why a transition happened.
type Cause uint8

const (
	CauseNone Cause = iota
	CauseConsecutiveFailures
	CauseFailureRate
	CauseSourceDead
	CauseCooldownElapsed
	CauseProbeSucceeded
	CauseProbeFailed
	CauseReset
)

func (c Cause) String() string {
	switch c {
	case CauseNone:
		return "none"
	case CauseConsecutiveFailures:
		return "consecutive_failures"
	case CauseFailureRate:
		return "failure_rate"
	case CauseSourceDead:
		return "source_dead"
	case CauseCooldownElapsed:
		return "cooldown_elapsed"
	case CauseProbeSucceeded:
		return "probe_succeeded"
	case CauseProbeFailed:
		return "probe_failed"
	case CauseReset:
		return "reset"
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}

// Event is one thing that happened to one source's breaker. Backends return
// the events a decision caused; they never call anybody back while holding
// state, so an observer may call into the backend again.
type Event struct {
	Kind   EventKind
	Source string
	From   State
	To     State
	Cause  Cause
	// Epoch is the breaker's epoch after the event.
	Epoch uint64
	// Reopens counts consecutive openings without a successful probe.
	Reopens int
	// Cooldown is how long the breaker stays OPEN, for a transition to OPEN.
	Cooldown time.Duration
	// PermitID names the probe (probe events) or the settled permit (stale outcome).
	PermitID string
	// Override, Actor and Why describe an operator's change.
	Override Override
	Actor    string
	Why      string
}
