package sidecar

import (
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/admissiontest"
	"github.com/polygate/polygate/internal/promcheck"
)

const metricsConfig = `
metrics_listen: 127.0.0.1:0
scopes:
  chat:
    circuit_open: fail_fast
    quota_full: wait
    backoff: {base: 1s, max: 1s}
    backpressure: {stall_window: 300s, poll_interval: 1ms}
    breaker: {fail_threshold: 1, cooldown: 10s, max_cooldown: 10s, probe_ttl: 60s}
    sources:
      - {name: primary, max_concurrency: 4, rpm: 100, tpm: 10000}
      - {name: backup, priority: 1, max_concurrency: 1}
  other:
    circuit_open: fail_fast
    tenants: {team: {max_live_calls: 5, token_budget: {tokens: 1000, per: 1h}}}
    sources: [{name: only}]
  trial:
    mode: shadow
    sources: [{name: only, max_concurrency: 1}]
`

// TestMetricsAfterScriptedSequence drives a scripted sequence of Pick,
// RecordOutcome and OnNoRunnable through the real gRPC server and interceptor
// chain, in a synctest bubble (fake time), then scrapes /metrics over the real HTTP listener
// and checks counters, histograms and gauges exactly.
func TestMetricsAfterScriptedSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "telemetry.db")
		e := startOps(t, metricsConfig+"telemetry: {path: "+db+"}\n")
		const (
			success     = admissionv1.Outcome_OUTCOME_SUCCESS
			transient   = admissionv1.Outcome_OUTCOME_TRANSIENT
			rateLimited = admissionv1.Outcome_OUTCOME_RATE_LIMITED
		)
		thirty := int64(30)

		// A's first attempt is rate limited: the primary's pacer halves to 2.
		a := e.Grant(t, "chat", "", 100)
		if r := e.Record(t, "chat", a, admissiontest.Outcome{Outcome: rateLimited, Status: 429, Hint: 2 * time.Second}); r.GetRetry() == nil {
			t.Fatalf("429: %v", r)
		}
		call := a.GetCallId()
		a = e.Grant(t, "chat", call, 0)  // primary, in flight 1
		x := e.Grant(t, "chat", "", 50)  // primary, in flight 2 = the pacer's ceiling
		y := e.Grant(t, "chat", "", 100) // primary adaptive_paced → backup
		if y.GetGrant().GetSource() != "backup" || len(y.GetGrant().GetSkipped()) != 1 ||
			y.GetGrant().GetSkipped()[0].GetReason() != admissionv1.Reason_REASON_ADAPTIVE_PACED {
			t.Fatalf("third grant %v, want backup after primary adaptive_paced", y.GetGrant())
		}
		// A's transient failure opens the primary; X's success, admitted
		// before, is stale.
		if r := e.Record(t, "chat", a, admissiontest.Outcome{Outcome: transient, Status: 503}); r.GetRetry() == nil || r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
			t.Fatalf("transient: %v", r)
		}
		if r := e.Record(t, "chat", x, admissiontest.Outcome{Outcome: success, Status: 200}); r.GetDone() == nil || r.GetEffect() != admissionv1.OutcomeEffect_OUTCOME_EFFECT_STALE {
			t.Fatalf("stale success: %v", r)
		}
		// B is refused by both (primary's cooldown memo, backup's concurrency)
		// and waits.
		b := e.Pick(t, "chat", "", 100)
		if b.GetNoRunnable().GetGateRejections() != 1 {
			t.Fatalf("B: %v", b)
		}
		e.answerWaitsAtOnce(t, "chat")
		if d := e.OnNoRunnable(t, "chat", b.GetCallId()); d.GetWait() == nil {
			t.Fatalf("B OnNoRunnable: %v", d)
		}
		if r := e.Record(t, "chat", y, admissiontest.Outcome{Outcome: success, Status: 200}); r.GetDone() == nil {
			t.Fatalf("Y: %v", r)
		}
		// After the cooldown B probes the primary and closes it.
		time.Sleep(10 * time.Second)
		b = e.Grant(t, "chat", b.GetCallId(), 0)
		if !b.GetGrant().GetProbe() || b.GetGrant().GetSource() != "primary" {
			t.Fatalf("B's probe: %v", b)
		}
		if r := e.Record(t, "chat", b, admissiontest.Outcome{Outcome: success, Status: 200, Actual: &thirty}); r.GetDone() == nil || r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
			t.Fatalf("probe: %v", r)
		}
		// E holds a primary permit through the scrape. (A, which failed on the
		// primary, would be sent to the backup first.)
		if g := e.Grant(t, "chat", "", 100).GetGrant(); g.GetSource() != "primary" {
			t.Fatalf("E: %v", g)
		}
		// D fails fast on a forced-open breaker.
		e.Override(t, "other", "only", admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN)
		d := e.Pick(t, "other", "", 0)
		if f := e.OnNoRunnable(t, "other", d.GetCallId()).GetFailure(); f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN {
			t.Fatalf("D: %v", f)
		}
		// In shadow mode a full quota still grants, and counts the refusal.
		e.Grant(t, "trial", "", 0)
		if g := e.Grant(t, "trial", "", 0).GetGrant(); !g.GetShadow() || len(g.GetShadowRefusals()) != 1 {
			t.Fatalf("shadow grant: %v", g)
		}
		if err := e.sc.sink.Flush(e.Ctx); err != nil {
			t.Fatal(err)
		}

		m := e.scrape(t)
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"polygate_decisions_total", []string{"scope=chat", "rpc=pick", "verdict=grant"}, 6},
			{"polygate_decisions_total", []string{"scope=chat", "rpc=pick", "verdict=no_runnable"}, 1},
			{"polygate_decisions_total", []string{"scope=chat", "rpc=on_no_runnable", "verdict=wait"}, 1},
			{"polygate_decisions_total", []string{"scope=chat", "rpc=record_outcome", "verdict=retry"}, 2},
			{"polygate_decisions_total", []string{"scope=chat", "rpc=record_outcome", "verdict=done"}, 3},
			{"polygate_decisions_total", []string{"scope=other", "rpc=pick", "verdict=no_runnable"}, 1},
			{"polygate_decisions_total", []string{"scope=other", "rpc=on_no_runnable", "verdict=failure", "reason=circuit_open"}, 1},
			{"polygate_refusals_total", []string{"scope=chat", "source=primary", "reason=adaptive_paced"}, 1},
			{"polygate_refusals_total", []string{"scope=chat", "source=primary", "reason=cooldown"}, 1},
			{"polygate_refusals_total", []string{"scope=chat", "source=backup", "reason=rate_limited"}, 1},
			{"polygate_refusals_total", []string{"scope=other", "source=only", "reason=forced_open"}, 1},
			{"polygate_grants_total", []string{"scope=chat", "source=primary"}, 5},
			{"polygate_grants_total", []string{"scope=chat", "source=backup"}, 1},
			{"polygate_attempts_total", []string{"scope=chat", "source=primary", "outcome=rate_limited"}, 1},
			{"polygate_attempts_total", []string{"scope=chat", "source=primary", "outcome=transient"}, 1},
			{"polygate_attempts_total", []string{"scope=chat", "source=primary", "outcome=success"}, 2},
			{"polygate_attempts_total", []string{"scope=chat", "source=backup", "outcome=success"}, 1},
			{"polygate_attempts_total", []string{"scope=chat", "source=backup", "outcome=transient"}, 0},
			{"polygate_breaker_transitions_total", []string{"scope=chat", "source=primary", "from=closed", "to=open", "cause=consecutive_failures"}, 1},
			{"polygate_breaker_transitions_total", []string{"scope=chat", "source=primary", "from=open", "to=half_open", "cause=cooldown_elapsed"}, 1},
			{"polygate_breaker_transitions_total", []string{"scope=chat", "source=primary", "from=half_open", "to=closed", "cause=probe_succeeded"}, 1},
			{"polygate_probes_total", []string{"scope=chat", "source=primary", "event=leased"}, 1},
			{"polygate_probes_total", []string{"scope=chat", "source=primary", "event=settled"}, 1},
			{"polygate_stale_outcomes_total", []string{"scope=chat", "source=primary"}, 1},
			{"polygate_breaker_overrides_total", []string{"scope=other", "source=only", "override=forced_open"}, 1},
			{"polygate_waits_started_total", []string{"scope=chat"}, 1},
			// Gauges read from the scopes' state at scrape time.
			{"polygate_scope_up", []string{"scope=chat"}, 1},
			{"polygate_live_calls", []string{"scope=chat"}, 2}, // A waits for its retry, E holds a permit
			{"polygate_live_calls", []string{"scope=other"}, 0},
			{"polygate_tenant_live_calls", []string{"scope=chat", "tenant=~other"}, 2},
			{"polygate_tenant_permits_in_use", []string{"scope=chat", "tenant=~other"}, 0}, // no limits: nothing kept
			{"polygate_tenant_live_calls", []string{"scope=other", "tenant=team"}, 0},
			{"polygate_tenant_budget_used_tokens", []string{"scope=other", "tenant=team"}, 0},
			{"polygate_breaker_state", []string{"scope=chat", "source=primary", "state=closed"}, 1},
			{"polygate_breaker_state", []string{"scope=chat", "source=primary", "state=open"}, 0},
			{"polygate_breaker_state", []string{"scope=chat", "source=primary", "state=half_open"}, 0},
			{"polygate_breaker_state", []string{"scope=chat", "source=backup", "state=closed"}, 1},
			{"polygate_breaker_override", []string{"scope=other", "source=only", "override=forced_open"}, 1},
			{"polygate_breaker_override", []string{"scope=other", "source=only", "override=none"}, 0},
			{"polygate_breaker_reopens", []string{"scope=chat", "source=primary"}, 0},
			{"polygate_permits_in_use", []string{"scope=chat", "source=primary"}, 1},
			{"polygate_permits_in_use", []string{"scope=chat", "source=backup"}, 0},
			{"polygate_permits_limit", []string{"scope=chat", "source=primary"}, 4},
			{"polygate_permits_limit", []string{"scope=chat", "source=backup"}, 1},
			// 4 halved to 2 by the 429; two successes add 1/2 and 1/2.5: 2.9 → 2.
			{"polygate_pacer_ceiling", []string{"scope=chat", "source=primary"}, 2},
			{"polygate_pacer_ceiling", []string{"scope=chat", "source=backup"}, 1},
			{"polygate_rpm_limit", []string{"scope=chat", "source=primary"}, 100},
			{"polygate_tpm_limit", []string{"scope=chat", "source=primary"}, 10000},
			// Five admissions within the minute: 100 (429) + 100 + 50 + 30 (the
			// probe settled to its actual count) + 100 tokens.
			{"polygate_requests_last_minute", []string{"scope=chat", "source=primary"}, 5},
			{"polygate_tokens_last_minute", []string{"scope=chat", "source=primary"}, 380},
			// The event hub, telemetry and the RPC latency provider.
			{"polygate_event_watchers", nil, 0},
			{"polygate_telemetry_records_total", []string{"table=calls"}, 4},
			{"polygate_telemetry_records_total", []string{"table=attempts"}, 5},
			{"polygate_telemetry_dropped_records_total", []string{"reason=queue_full"}, 0},
			{"polygate_telemetry_degraded", nil, 0},
			{"grpc_server_handled_total", []string{"grpc_method=Pick", "grpc_code=OK"}, 10},
			{"polygate_shadow_refusals_total", []string{"scope=trial", "source=only", "reason=rate_limited"}, 1},
			{"grpc_server_handled_total", []string{"grpc_method=RecordOutcome", "grpc_code=OK"}, 5},
			{"grpc_server_handled_total", []string{"grpc_method=OnNoRunnable", "grpc_code=OK"}, 2},
			{"grpc_server_handled_total", []string{"grpc_method=OverrideBreaker", "grpc_code=OK"}, 1},
		} {
			if got := m.value(c.name, c.labels...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
		for _, h := range []struct {
			name   string
			labels []string
			count  int64
			sum    float64
		}{
			// X, Y and B ended done after 1 attempt each; B waited the 10s
			// cooldown, the others nothing (the clock stood still).
			{"polygate_call_attempts", []string{"scope=chat", "result=done"}, 3, 3},
			{"polygate_call_waiting_seconds", []string{"scope=chat", "result=done"}, 3, 10},
			{"polygate_call_attempts", []string{"scope=other", "result=circuit_open"}, 1, 0},
			{"polygate_attempt_duration_seconds", []string{"scope=chat", "source=primary"}, 4, 0},
			{"polygate_attempt_duration_seconds", []string{"scope=chat", "source=backup"}, 1, 0},
			{"polygate_wait_sleep_seconds", []string{"scope=chat"}, 1, 0},
		} {
			if count, sum := m.histogram(h.name, h.labels...); count != h.count || sum != h.sum {
				t.Errorf("%s%v: count %d sum %v, want %d and %v", h.name, h.labels, count, sum, h.count, h.sum)
			}
		}
		if count, _ := m.histogram("grpc_server_handling_seconds", "grpc_method=Pick"); count != 10 {
			t.Errorf("grpc_server_handling_seconds{Pick} count %d, want 10", count)
		}
		documentedMetricsExist(t, m)
	})
}

// documentedMetricsExist checks that every metric the alerting rules and the
// operations guide name is one the sidecar exports.
func documentedMetricsExist(t *testing.T, m families) {
	t.Helper()
	for _, file := range []string{"../../deploy/prometheus/polygate-alerts.yaml", "../../docs/operations.md", "../../docs/configuration.md"} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range promcheck.Families(m).Unknown(string(text)) {
			t.Errorf("%s names %s, which the sidecar does not export", file, n)
		}
	}
}
