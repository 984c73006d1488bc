package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/promcheck"
	"github.com/polygate/polygate/internal/sidecartest"
)

// gauge reads one series of a gauge from the sidecar's /metrics: the one
// whose labels include labels (name, value pairs); ok is false when no
// series matches.
func gauge(t *testing.T, ctx context.Context, metricsAddr, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	fams, err := promcheck.Scrape(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if hasLabels(m, labels) {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
		}
		if !found {
			return false
		}
	}
	return true
}

// TestReloadMetricsFollowEachReload: the start is a successful load; a
// file that fails validation sets polygate_config_last_reload_successful
// to 0 and leaves the success timestamp; a good file sets it back to 1 with
// a later timestamp and the limit on live calls it says.
func TestReloadMetricsFollowEachReload(t *testing.T) {
	metricsAddr := freeTCPAddr(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(extra string) {
		t.Helper()
		text := fmt.Sprintf("metrics_listen: %s\n%sscopes: {chat: {sources: [{name: primary}]}}\n", metricsAddr, extra)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	ctx := testContext(t)
	read := func(name string) float64 {
		t.Helper()
		v, ok := gauge(t, ctx, metricsAddr, name)
		if !ok {
			t.Fatalf("/metrics lacks %s", name)
		}
		return v
	}
	started := read("polygate_config_last_reload_success_timestamp_seconds")
	if ok, limit := read("polygate_config_last_reload_successful"), read("polygate_live_calls_limit"); ok != 1 || started <= 0 || limit != 10000 {
		t.Fatalf("at start: successful %v, timestamp %v, live calls limit %v; want 1, the start, 10000", ok, started, limit)
	}

	write("calls: {max_live: 0}\n") // rejected: at least 1
	eventually(t, ctx, "the rejected reload", func() bool { return read("polygate_config_last_reload_successful") == 0 })
	if at, limit := read("polygate_config_last_reload_success_timestamp_seconds"), read("polygate_live_calls_limit"); at != started || limit != 10000 {
		t.Errorf("after a rejected reload: timestamp %v, live calls limit %v; want the start's %v and 10000", at, limit, started)
	}

	write("calls: {max_live: 50}\n")
	eventually(t, ctx, "the applied reload", func() bool { return read("polygate_config_last_reload_successful") == 1 })
	if at, limit := read("polygate_config_last_reload_success_timestamp_seconds"), read("polygate_live_calls_limit"); at <= started || limit != 50 {
		t.Errorf("after an applied reload: timestamp %v, live calls limit %v; want after %v and 50", at, limit, started)
	}
}

// TestWaitingCallsMetricCountsHeldCalls: calls held in OnNoRunnable while
// the only source is OPEN are counted by polygate_waiting_calls, and leave
// it when they are cancelled.
func TestWaitingCallsMetricCountsHeldCalls(t *testing.T) {
	metricsAddr := freeTCPAddr(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`
metrics_listen: %s
scopes:
  chat:
    circuit_open: wait
    backpressure: {stall_window: 1h}
    breaker: {fail_threshold: 1, cooldown: 30m, max_cooldown: 30m}
    sources: [{name: only}]
`, metricsAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	c := caller{t: t, ctx: ctx, c: client}
	waiting := func() float64 {
		v, ok := gauge(t, ctx, metricsAddr, "polygate_waiting_calls", "scope", "chat")
		if !ok {
			t.Fatal("/metrics lacks polygate_waiting_calls{scope=\"chat\"}")
		}
		return v
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%v calls waiting before any, want 0", n)
	}
	if r := c.report("chat", c.pick("chat"), admissionv1.Outcome_OUTCOME_TRANSIENT); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("the transient failure left the breaker %v, want OPEN", r.GetBreakerState())
	}

	const held = 3
	holdCtx, release := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ids []string
	for range held {
		p := c.pick("chat")
		if p.GetNoRunnable() == nil {
			t.Fatalf("Pick with the only source OPEN: %v, want no runnable source", p)
		}
		ids = append(ids, p.GetCallId())
		wg.Go(func() {
			// Held for the cooldown (30m) until the test lets go.
			_, _ = client.OnNoRunnable(holdCtx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
		})
	}
	eventually(t, ctx, fmt.Sprintf("%d held calls counted", held), func() bool { return waiting() == held })
	release()
	wg.Wait()
	for _, id := range ids {
		if _, err := client.CancelCall(ctx, &admissionv1.CancelCallRequest{Scope: "chat", CallId: id}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, ctx, "no call waiting after the cancels", func() bool { return waiting() == 0 })
}
