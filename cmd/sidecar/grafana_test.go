package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/promcheck"
	"github.com/polygate/polygate/internal/sidecartest"
)

// dashboardQueries returns every PromQL query of a Grafana dashboard: the
// panels' targets, the annotations and the template variables (every
// string under "expr", "query" or "definition", wherever it is nested).
func dashboardQueries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				out = append(out, s)
			} else {
				out = append(out, dashboardQueries(x)...)
			}
		}
	case []any:
		for _, x := range v {
			out = append(out, dashboardQueries(x)...)
		}
	}
	return out
}

// TestDashboardAndAlertsUseExportedMetrics runs the real binary with
// metrics and telemetry on, drives every kind of decision through it (so
// that labelled series exist: a breaker that opens, a stale outcome, a
// wait, a probe, an override), scrapes /metrics and checks that every
// metric the Grafana dashboard's queries and the alerting rules name is
// exported, and that every dashboard query names at least one.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	metricsAddr := freeTCPAddr(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "polygate.yaml")
	const cooldown = "200ms"
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`
metrics_listen: %s
telemetry: {path: %s}
scopes:
  chat:
    circuit_open: wait
    backoff: {base: 1ms, max: 1ms}
    backpressure: {stall_window: 60s, poll_interval: 10ms}
    breaker: {fail_threshold: 1, cooldown: %s, max_cooldown: %s}
    sources:
      - {name: primary, max_concurrency: 2, rpm: 100, tpm: 10000}
`, metricsAddr, filepath.Join(dir, "telemetry.db"), cooldown, cooldown)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	c := caller{t: t, ctx: ctx, c: client}

	// Two attempts in flight; the first fails and opens the breaker, so
	// the second's success is stale.
	a, b := c.pick("chat"), c.pick("chat")
	if r := c.report("chat", a, admissionv1.Outcome_OUTCOME_TRANSIENT); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("transient: %v, want the breaker OPEN", r)
	}
	if r := c.report("chat", b, admissionv1.Outcome_OUTCOME_SUCCESS); r.GetEffect() != admissionv1.OutcomeEffect_OUTCOME_EFFECT_STALE {
		t.Fatalf("the second attempt's success: %v, want stale", r)
	}
	// The first call is refused, waits out the cooldown and takes the probe.
	var probe *admissionv1.PickResponse
	eventually(t, ctx, "a probe after the cooldown", func() bool {
		p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", CallId: a.GetCallId()})
		if err != nil {
			t.Fatal(err)
		}
		if p.GetGrant() != nil {
			probe = p
			return true
		}
		if _, err := client.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: a.GetCallId()}); err != nil {
			t.Fatal(err)
		}
		return false
	})
	if !probe.GetGrant().GetProbe() {
		t.Fatalf("grant after the cooldown %v, want the probe", probe.GetGrant())
	}
	if r := c.report("chat", probe, admissionv1.Outcome_OUTCOME_SUCCESS); r.GetDone() == nil {
		t.Fatalf("probe success: %v", r)
	}
	for _, action := range []admissionv1.OverrideAction{admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR} {
		if _, err := client.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "primary", Action: action, Actor: "test", Reason: "metrics"}); err != nil {
			t.Fatal(err)
		}
	}

	fams, err := promcheck.Scrape(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}

	text, err := os.ReadFile("../../deploy/grafana/polygate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(text, &dash); err != nil {
		t.Fatalf("deploy/grafana/polygate.json: %v", err)
	}
	queries := dashboardQueries(dash)
	if len(queries) < 20 {
		t.Fatalf("found %d queries in the dashboard; the walk is broken", len(queries))
	}
	names := 0
	for _, q := range queries {
		if q == "prometheus" { // the datasource variable's plugin type
			continue
		}
		n := promcheck.Names(q)
		if len(n) == 0 {
			t.Errorf("dashboard query %q names no metric of the sidecar", q)
		}
		names += len(n)
		for _, u := range fams.Unknown(q) {
			t.Errorf("dashboard query %q uses %s, which the sidecar does not export", q, u)
		}
	}
	t.Logf("%d dashboard queries, %d metric references, all exported", len(queries), names)
	// Descriptions and the alerting rules may name metrics too.
	for _, f := range []string{"../../deploy/grafana/polygate.json", "../../deploy/prometheus/polygate-alerts.yaml"} {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range fams.Unknown(string(text)) {
			t.Errorf("%s names %s, which the sidecar does not export", f, u)
		}
	}
}
