package gate

import (
	"time"

	"github.com/polygate/polygate/internal/enum"
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

var eventKindNames = []string{
	EventTransition:    "transition",
	EventProbeLeased:   "probe_leased",
	EventProbeExpired:  "probe_expired",
	EventProbeReleased: "probe_released",
	EventStaleOutcome:  "stale_outcome",
	EventOverride:      "override",
}

func (k EventKind) String() string { return enum.String(k, eventKindNames) }

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

var causeNames = []string{
	CauseNone:                "none",
	CauseConsecutiveFailures: "consecutive_failures",
	CauseFailureRate:         "failure_rate",
	CauseSourceDead:          "source_dead",
	CauseCooldownElapsed:     "cooldown_elapsed",
	CauseProbeSucceeded:      "probe_succeeded",
	CauseProbeFailed:         "probe_failed",
	CauseReset:               "reset",
}

func (c Cause) String() string { return enum.String(c, causeNames) }

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
	// Override, Actor and Why describe an operator's change: the override
	// in force after it, who asked and why; Action is what they asked for
	// (a clear and a reset both leave no override).
	Override Override
	Actor    string
	Why      string
	Action   Action
}
