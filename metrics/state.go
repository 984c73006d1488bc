package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// ScopeState is one scope's live state, as DescribeScope reads it.
type ScopeState struct {
	Name        string
	Description policy.Description
	LiveCalls   int
	// TenantLiveCalls are the calls open of each of Description.Tenants,
	// index by index.
	TenantLiveCalls []int
	// Waiting counts the calls of the scope waiting now: refused by every
	// source, from their first Wait until a grant or their end.
	Waiting int
	// Err: the backend could not be read; only polygate_scope_up is exported.
	Err error
}

// ReadStates reads every scope's state; the collector calls it at each scrape.
type ReadStates func(ctx context.Context) []ScopeState

// StateCollector exports each scope's live breaker, quota and pacer state,
// read at scrape time (one backend read per scope, which never takes a
// probe).
type StateCollector struct {
	read    ReadStates
	timeout time.Duration
}

// NewStateCollector returns a collector that reads states with read, each
// scrape bounded by timeout.
func NewStateCollector(read ReadStates, timeout time.Duration) *StateCollector {
	return &StateCollector{read: read, timeout: timeout}
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("polygate_"+name, help, labels, nil)
}

var (
	scopeUp      = desc("scope_up", "1 when the scope's state could be read from the backend at this scrape.", "scope")
	liveCalls    = desc("live_calls", "Calls of the scope the sidecar holds open.", "scope")
	waitingCalls = desc("waiting_calls", "Calls of the scope waiting now: refused by every source, from their first Wait (held in OnNoRunnable, or sleeping in the client) until a grant or their end.", "scope")
	progressAge  = desc("scope_progress_age_seconds", "Time since the scope's last successful attempt (absent if none yet).", "scope")
	breakerState = desc("breaker_state", "1 for the breaker's automatic state as a reader sees it (closed, open, half_open), 0 for the others.", "scope", "source", "state")
	overrideSet  = desc("breaker_override", "1 for the operator override in force (none, forced_open, forced_closed, disabled), 0 for the others.", "scope", "source", "override")
	retryAfter   = desc("breaker_retry_after_seconds", "Time until the breaker's earliest certain retry (remaining cooldown of an OPEN breaker).", "scope", "source")
	reopens      = desc("breaker_reopens", "Consecutive openings without a successful probe.", "scope", "source")
	probeOut     = desc("breaker_probe_out", "1 while a HALF_OPEN breaker's probe is out.", "scope", "source")
	windowCalls  = desc("breaker_window_calls", "Attempts counted in the failure-rate window.", "scope", "source")
	windowFails  = desc("breaker_window_failures", "Failures counted in the failure-rate window.", "scope", "source")
	consecutive  = desc("breaker_consecutive_failures", "Consecutive failures while CLOSED.", "scope", "source")
	inUse        = desc("permits_in_use", "Permits holding a concurrency slot.", "scope", "source")
	permitLimit  = desc("permits_limit", "The source's max_concurrency.", "scope", "source")
	pacerCeiling = desc("pacer_ceiling", "The AIMD pacer's concurrency ceiling (1..max_concurrency).", "scope", "source")
	rpmLimit     = desc("rpm_limit", "The source's requests-per-minute limit (0: none).", "scope", "source")
	rpmUsed      = desc("requests_last_minute", "Admissions over the sliding minute (counted when rpm or tpm is set).", "scope", "source")
	tpmLimit     = desc("tpm_limit", "The source's tokens-per-minute limit (0: none).", "scope", "source")
	tpmUsed      = desc("tokens_last_minute", "Tokens over the sliding minute (counted when rpm or tpm is set).", "scope", "source")
	// A tenant label is a tenant the scope names, or ~other for all the
	// others together: bounded by the configuration.
	tenantInUse   = desc("tenant_permits_in_use", "A tenant's permits out now, over every source of the scope.", "scope", "tenant")
	tenantRPMUsed = desc("tenant_requests_last_minute", "A tenant's admissions over the sliding minute (counted when it has an rpm or tpm).", "scope", "tenant")
	tenantTPMUsed = desc("tenant_tokens_last_minute", "A tenant's tokens over the sliding minute (counted when it has an rpm or tpm).", "scope", "tenant")
	tenantBudget  = desc("tenant_budget_used_tokens", "Tokens a tenant spent in its token budget's window (exported when it has a budget).", "scope", "tenant")
	tenantLive    = desc("tenant_live_calls", "A tenant's calls the sidecar holds open in the scope.", "scope", "tenant")
)

var allDescs = []*prometheus.Desc{
	scopeUp, liveCalls, waitingCalls, progressAge, breakerState, overrideSet, retryAfter, reopens, probeOut, windowCalls,
	windowFails, consecutive, inUse, permitLimit, pacerCeiling, rpmLimit, rpmUsed, tpmLimit, tpmUsed,
	tenantInUse, tenantRPMUsed, tenantTPMUsed, tenantBudget, tenantLive,
}

var (
	stateNames    = []gate.State{gate.Closed, gate.Open, gate.HalfOpen}
	overrideNames = []gate.Override{gate.NoOverride, gate.ForcedOpen, gate.ForcedClosed, gate.Disabled}
)

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, s := range c.read(ctx) {
		gauge(scopeUp, flag(s.Err == nil), s.Name)
		gauge(liveCalls, float64(s.LiveCalls), s.Name)
		gauge(waitingCalls, float64(s.Waiting), s.Name)
		if s.Err != nil {
			continue
		}
		d := s.Description
		if d.ProgressAge != gate.Never {
			gauge(progressAge, d.ProgressAge.Seconds(), s.Name)
		}
		for _, src := range d.Sources {
			b, q, name := src.View.Breaker, src.View.Quota, src.Config.Name
			for _, st := range stateNames {
				gauge(breakerState, flag(b.State == st), s.Name, name, st.String())
			}
			for _, o := range overrideNames {
				gauge(overrideSet, flag(b.Override == o), s.Name, name, o.String())
			}
			gauge(retryAfter, b.RetryAfter.Seconds(), s.Name, name)
			gauge(reopens, float64(b.Reopens), s.Name, name)
			gauge(probeOut, flag(b.ProbeOut), s.Name, name)
			gauge(windowCalls, float64(b.Calls), s.Name, name)
			gauge(windowFails, float64(b.Fails), s.Name, name)
			gauge(consecutive, float64(b.Consecutive), s.Name, name)
			gauge(inUse, float64(q.InFlight), s.Name, name)
			gauge(permitLimit, float64(src.Config.MaxConcurrency), s.Name, name)
			gauge(pacerCeiling, float64(src.Ceiling), s.Name, name)
			gauge(rpmLimit, float64(src.Config.RPM), s.Name, name)
			gauge(rpmUsed, float64(q.Requests), s.Name, name)
			gauge(tpmLimit, float64(src.Config.TPM), s.Name, name)
			gauge(tpmUsed, float64(q.Tokens), s.Name, name)
		}
		for i, t := range d.Tenants {
			q := t.View.Quota
			gauge(tenantInUse, float64(q.InFlight), s.Name, t.Name)
			gauge(tenantRPMUsed, float64(q.Requests), s.Name, t.Name)
			gauge(tenantTPMUsed, float64(q.Tokens), s.Name, t.Name)
			if t.Config.Budget > 0 {
				gauge(tenantBudget, float64(t.View.BudgetUsed), s.Name, t.Name)
			}
			if i < len(s.TenantLiveCalls) {
				gauge(tenantLive, float64(s.TenantLiveCalls[i]), s.Name, t.Name)
			}
		}
	}
}
