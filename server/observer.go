package server

import (
	"context"
	"log/slog"
	"slices"
	"sync"
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
// expiry and stale outcome. Waits are counted in waits and logged per scope
// once per interval; one line per call that starts waiting only at DEBUG.
type logObserver struct {
	policy.NopObserver
	log   *slog.Logger
	waits *waitLog
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
		msg = "breaker override " + e.Action.String()
		level = slog.LevelWarn
		attrs = append(attrs, "override", e.Override.String(), "actor", e.Actor, "why", e.Why)
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

// Waiting counts the start of a wait for the scope's next "calls waiting"
// line and, at DEBUG, logs it: the scope and call, the sleep decided, each
// source's reason and retry_after, and what the call did so far.
func (l logObserver) Waiting(c *policy.Call, sleep time.Duration, rs []gate.Rejection) {
	l.waits.started(c.Scope, rs)
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	reasons := make([]any, 0, len(rs))
	for _, r := range rs {
		reasons = append(reasons, slog.Group(r.Source, "reason", r.Reason.String(), "retry_after", r.RetryAfter))
	}
	st := c.Stats(time.Now())
	l.log.Debug("call waiting", "scope", c.Scope, "call", c.ID, "sleep", sleep, slog.Group("sources", reasons...),
		"attempts", st.Attempts, "waited", st.Waiting)
}

// waitLogInterval is how often a scope with waiting calls logs its "calls
// waiting" line.
const waitLogInterval = 10 * time.Second

// waitLog aggregates waits per scope: how many calls started waiting since
// the last line, for which reasons, and how many are held in OnNoRunnable
// now. Server.Sweep writes one INFO line per scope with waits every
// waitLogInterval, so that 10 000 waiting calls write one line, not 10 000.
type waitLog struct {
	log *slog.Logger

	mu     sync.Mutex
	last   time.Time // the last lines
	scopes map[string]*waitCounts
}

type waitCounts struct {
	started int            // calls that started waiting since the last line
	held    int            // calls held in OnNoRunnable now
	reasons map[string]int // started calls by the reasons of their refusal
}

func newWaitLog(log *slog.Logger, now time.Time) *waitLog {
	return &waitLog{log: log, last: now, scopes: make(map[string]*waitCounts)}
}

// counts returns a scope's counts; mu is held.
func (w *waitLog) counts(scope string) *waitCounts {
	c := w.scopes[scope]
	if c == nil {
		c = &waitCounts{reasons: make(map[string]int)}
		w.scopes[scope] = c
	}
	return c
}

// started counts a call that starts waiting, once under each reason its
// sources gave.
func (w *waitLog) started(scope string, rs []gate.Rejection) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.counts(scope)
	c.started++
	for i, r := range rs {
		if !slices.ContainsFunc(rs[:i], func(p gate.Rejection) bool { return p.Reason == r.Reason }) {
			c.reasons[r.Reason.String()]++
		}
	}
}

// hold counts a call held in OnNoRunnable of scope until unhold.
func (w *waitLog) hold(scope string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts(scope).held++
}

// unhold ends what hold counted.
func (w *waitLog) unhold(scope string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts(scope).held--
}

// flush writes, once waitLogInterval has passed since the last lines, one
// INFO line per scope where calls started waiting or are held, and starts
// counting anew.
func (w *waitLog) flush(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Sub(w.last) < waitLogInterval {
		return
	}
	w.last = now
	for _, scope := range sortedKeys(w.scopes) {
		c := w.scopes[scope]
		if c.started == 0 && c.held == 0 {
			delete(w.scopes, scope)
			continue
		}
		reasons := make([]any, 0, len(c.reasons))
		for _, r := range sortedKeys(c.reasons) {
			reasons = append(reasons, slog.Int(r, c.reasons[r]))
		}
		w.log.Info("calls waiting", "scope", scope, "started", c.started, "held", c.held,
			slog.Group("reasons", reasons...), "interval", waitLogInterval)
		c.started = 0
		clear(c.reasons)
	}
}
