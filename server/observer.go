package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// observers fans policy decisions out to every observer (logs, metrics,
// event watchers, telemetry).
type observers []policy.Observer

func (o observers) Breaker(scope string, e gate.Event) {
	for _, x := range o {
		x.Breaker(scope, e)
	}
}

func (o observers) Waiting(c *policy.Call, d time.Duration, rs []gate.Rejection) {
	for _, x := range o {
		x.Waiting(c, d, rs)
	}
}

func (o observers) Picked(c *policy.Call, p policy.Pick) {
	for _, x := range o {
		x.Picked(c, p)
	}
}

func (o observers) Settled(c *policy.Call, a policy.Attempt, r policy.Recorded) {
	for _, x := range o {
		x.Settled(c, a, r)
	}
}

func (o observers) Decided(c *policy.Call, d policy.Decision) {
	for _, x := range o {
		x.Decided(c, d)
	}
}

// logObserver writes one log line per breaker transition, override, probe
// expiry and stale outcome, and one when a call starts waiting.
type logObserver struct {
	policy.NopObserver
	log *slog.Logger
}

func (l logObserver) Breaker(scope string, e gate.Event) {
	attrs := []any{"scope", scope, "source", e.Source, "epoch", e.Epoch}
	level := slog.LevelInfo
	msg := ""
	switch e.Kind {
	case gate.EventTransition:
		msg = "breaker " + e.From.String() + " → " + e.To.String()
		attrs = append(attrs, "cause", e.Cause.String(), "reopens", e.Reopens)
		if e.To == gate.Open {
			level = slog.LevelWarn
			attrs = append(attrs, "cooldown", e.Cooldown)
		}
	case gate.EventOverride:
		msg = "breaker override " + e.Override.String()
		level = slog.LevelWarn
		attrs = append(attrs, "actor", e.Actor, "why", e.Why)
	case gate.EventProbeExpired:
		msg = "probe lease expired without an outcome; the next entrant probes"
		level = slog.LevelWarn
		attrs = append(attrs, "permit", e.PermitID)
	case gate.EventStaleOutcome:
		msg = "stale outcome ignored"
		attrs = append(attrs, "permit", e.PermitID, "state", e.To.String())
	case gate.EventProbeLeased, gate.EventProbeReleased:
		msg = e.Kind.String()
		level = slog.LevelDebug
		attrs = append(attrs, "permit", e.PermitID)
	}
	l.log.Log(context.Background(), level, msg, attrs...)
}

// Waiting logs the start of a wait: the scope and call, the sleep decided,
// each source's reason and retry_after, and what the call did so far.
func (l logObserver) Waiting(c *policy.Call, sleep time.Duration, rs []gate.Rejection) {
	if !l.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	reasons := make([]any, 0, len(rs))
	for _, r := range rs {
		reasons = append(reasons, slog.Group(r.Source, "reason", r.Reason.String(), "retry_after", r.RetryAfter))
	}
	st := c.Stats(time.Now())
	l.log.Info("call waiting", "scope", c.Scope, "call", c.ID, "sleep", sleep, slog.Group("sources", reasons...),
		"attempts", st.Attempts, "waited", st.Waiting)
}
