package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// Label values of polygate_decisions_total.
const (
	rpcPick     = "pick"
	rpcDecide   = "on_no_runnable"
	rpcRecord   = "record_outcome"
	verdictOK   = "grant"
	verdictNone = "no_runnable"
	verdictFail = "failure"
	verdictWait = "wait"
	verdictDone = "done"
	verdictNext = "retry"
)

// Buckets of the histograms, in seconds (attempts for call_attempts).
var (
	WaitBuckets     = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	AttemptBuckets  = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	AttemptsBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20}
)

// Metrics is a policy.Observer that counts decisions. Every label is a
// scope, a source, or a value of a closed set (verdicts, reasons, outcomes,
// states), so the number of series is bounded by scope × source × reason;
// calls, permits and actors never become labels. It takes no lock of the
// decision it observes; the series of each scope and source are looked up
// once and kept.
type Metrics struct {
	now func() time.Time

	decisions    *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	shadow       *prometheus.CounterVec
	grants       *prometheus.CounterVec
	attempts     *prometheus.CounterVec
	attemptSecs  *prometheus.HistogramVec
	transitions  *prometheus.CounterVec
	probes       *prometheus.CounterVec
	stale        *prometheus.CounterVec
	overrides    *prometheus.CounterVec
	waits        *prometheus.CounterVec
	waitSleep    *prometheus.HistogramVec
	callWaiting  *prometheus.HistogramVec
	callAttempts *prometheus.HistogramVec
	backend      prometheus.Gauge
	backendFlips *prometheus.CounterVec

	sources sync.Map // sourceKey → *sourceSeries
}

type sourceKey struct{ scope, source string }

// sourceSeries are the hot series of one source, looked up once.
type sourceSeries struct {
	grants      prometheus.Counter
	attempts    [policy.Cancelled + 1]prometheus.Counter
	attemptSecs prometheus.Observer
}

// New registers polygate's decision metrics on reg. now is the clock the
// call accounting is read with (time.Now if nil).
func New(reg prometheus.Registerer, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "polygate", Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "polygate", Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		now: now,
		decisions: counter("decisions_total",
			"Decisions by RPC (pick, on_no_runnable, record_outcome), verdict (grant, no_runnable, wait, done, retry, failure) and failure reason.",
			"scope", "rpc", "verdict", "reason"),
		refusals: counter("refusals_total",
			"Sources refused by a Pick (in a NoRunnable or skipped before a grant), by reason.",
			"scope", "source", "reason"),
		shadow: counter("shadow_refusals_total",
			"Refusals that enforcement would have made, on grants of a scope in shadow mode, by source and reason.",
			"scope", "source", "reason"),
		grants: counter("grants_total", "Permits granted.", "scope", "source"),
		attempts: counter("attempts_total",
			"Attempts reported by RecordOutcome, by outcome (success, transient, rate_limited, source_dead, client_error, cancelled).",
			"scope", "source", "outcome"),
		attemptSecs: histogram("attempt_duration_seconds", "Time from grant to reported outcome.", AttemptBuckets, "scope", "source"),
		transitions: counter("breaker_transitions_total", "Breaker transitions seen by this sidecar.", "scope", "source", "from", "to", "cause"),
		probes: counter("probes_total",
			"Probe events: leased, settled (with a verdict), expired (lease ran out), released (no verdict).",
			"scope", "source", "event"),
		stale:     counter("stale_outcomes_total", "Outcomes of an ended breaker round; they changed nothing.", "scope", "source"),
		overrides: counter("breaker_overrides_total", "Operator actions, by the override in force after them (none: cleared or reset).", "scope", "source", "override"),
		waits:     counter("waits_started_total", "Calls that started waiting (first Wait after the call opened or after a grant).", "scope"),
		waitSleep: histogram("wait_sleep_seconds", "Server-side sleeps of OnNoRunnable Waits (ended early when woken).", WaitBuckets, "scope"),
		callWaiting: histogram("call_waiting_seconds",
			"Non-productive time of each ended call (waits, backoffs, 429 attempts), by result (done, a failure reason, expired, interrupted).",
			WaitBuckets, "scope", "result"),
		callAttempts: histogram("call_attempts", "Attempts of each ended call, by result.", AttemptsBuckets, "scope", "result"),
		backend: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "polygate", Name: "backend_degraded",
			Help: "1 while the shared backend reports itself degraded."}),
		backendFlips: counter("backend_health_changes_total", "Backend health changes, by state (degraded, recovered).", "state"),
	}
	for _, state := range []string{"degraded", "recovered"} {
		m.backendFlips.WithLabelValues(state) // exported at 0 before the first change
	}
	reg.MustRegister(m.decisions, m.refusals, m.shadow, m.grants, m.attempts, m.attemptSecs, m.transitions, m.probes,
		m.stale, m.overrides, m.waits, m.waitSleep, m.callWaiting, m.callAttempts, m.backend, m.backendFlips)
	return m
}

func (m *Metrics) source(scope, source string) *sourceSeries {
	k := sourceKey{scope, source}
	if s, ok := m.sources.Load(k); ok {
		return s.(*sourceSeries)
	}
	s := &sourceSeries{
		grants:      m.grants.WithLabelValues(scope, source),
		attemptSecs: m.attemptSecs.WithLabelValues(scope, source),
	}
	for o := policy.Success; o <= policy.Cancelled; o++ {
		s.attempts[o] = m.attempts.WithLabelValues(scope, source, o.String())
	}
	actual, _ := m.sources.LoadOrStore(k, s)
	return actual.(*sourceSeries)
}

func (m *Metrics) refused(scope string, rs []gate.Rejection) {
	for _, r := range rs {
		m.refusals.WithLabelValues(scope, r.Source, r.Reason.String()).Inc()
	}
}

// ended observes a call's accounting once it ended with result.
func (m *Metrics) ended(c *policy.Call, result string) {
	st := c.Stats(m.now())
	m.callWaiting.WithLabelValues(c.Scope, result).Observe(st.Waiting.Seconds())
	m.callAttempts.WithLabelValues(c.Scope, result).Observe(float64(st.Attempts))
}

// Picked implements policy.Observer.
func (m *Metrics) Picked(c *policy.Call, p policy.Pick) {
	switch {
	case p.Grant != nil:
		m.decisions.WithLabelValues(c.Scope, rpcPick, verdictOK, "").Inc()
		m.source(c.Scope, p.Grant.Source.Name).grants.Inc()
		m.refused(c.Scope, p.Grant.Skipped)
		for _, r := range p.Grant.ShadowRefusals {
			m.shadow.WithLabelValues(c.Scope, r.Source, r.Reason.String()).Inc()
		}
	case p.NoRunnable != nil:
		m.decisions.WithLabelValues(c.Scope, rpcPick, verdictNone, "").Inc()
		m.refused(c.Scope, p.NoRunnable.Sources)
	case p.Failure != nil:
		reason := p.Failure.Reason.String()
		m.decisions.WithLabelValues(c.Scope, rpcPick, verdictFail, reason).Inc()
		m.ended(c, reason)
	}
}

// Decided implements policy.Observer.
func (m *Metrics) Decided(c *policy.Call, d policy.Decision) {
	if d.Failure != nil {
		reason := d.Failure.Reason.String()
		m.decisions.WithLabelValues(c.Scope, rpcDecide, verdictFail, reason).Inc()
		m.ended(c, reason)
		return
	}
	m.decisions.WithLabelValues(c.Scope, rpcDecide, verdictWait, "").Inc()
	m.waitSleep.WithLabelValues(c.Scope).Observe(d.Slept.Seconds())
}

// Settled implements policy.Observer.
func (m *Metrics) Settled(c *policy.Call, a policy.Attempt, r policy.Recorded) {
	s := m.source(c.Scope, a.Source)
	if a.Outcome >= policy.Success && a.Outcome <= policy.Cancelled {
		s.attempts[a.Outcome].Inc()
	}
	s.attemptSecs.Observe(a.Latency.Seconds())
	if a.Probe && r.Effect == gate.EffectApplied {
		m.probes.WithLabelValues(c.Scope, a.Source, "settled").Inc()
	}
	switch {
	case r.Next.Done:
		m.decisions.WithLabelValues(c.Scope, rpcRecord, verdictDone, "").Inc()
		m.ended(c, verdictDone)
	case r.Next.Retry != nil:
		m.decisions.WithLabelValues(c.Scope, rpcRecord, verdictNext, "").Inc()
	case r.Next.Failure != nil:
		reason := r.Next.Failure.Reason.String()
		m.decisions.WithLabelValues(c.Scope, rpcRecord, verdictFail, reason).Inc()
		m.ended(c, reason)
	}
}

// Waiting implements policy.Observer.
func (m *Metrics) Waiting(c *policy.Call, _ time.Duration, _ []gate.Rejection) {
	m.waits.WithLabelValues(c.Scope).Inc()
}

// Breaker implements policy.Observer.
func (m *Metrics) Breaker(scope string, e gate.Event) {
	switch e.Kind {
	case gate.EventTransition:
		m.transitions.WithLabelValues(scope, e.Source, e.From.String(), e.To.String(), e.Cause.String()).Inc()
	case gate.EventProbeLeased:
		m.probes.WithLabelValues(scope, e.Source, "leased").Inc()
	case gate.EventProbeExpired:
		m.probes.WithLabelValues(scope, e.Source, "expired").Inc()
	case gate.EventProbeReleased:
		m.probes.WithLabelValues(scope, e.Source, "released").Inc()
	case gate.EventStaleOutcome:
		m.stale.WithLabelValues(scope, e.Source).Inc()
	case gate.EventOverride:
		m.overrides.WithLabelValues(scope, e.Source, e.Override.String()).Inc()
	}
}

// Abandoned counts a call that ended without a decision (expired idle, or
// open at shutdown).
func (m *Metrics) Abandoned(c *policy.Call, why string) { m.ended(c, why) }

// BackendChanged sets the backend health gauge.
func (m *Metrics) BackendChanged(degraded bool) {
	if degraded {
		m.backend.Set(1)
		m.backendFlips.WithLabelValues("degraded").Inc()
	} else {
		m.backend.Set(0)
		m.backendFlips.WithLabelValues("recovered").Inc()
	}
}
