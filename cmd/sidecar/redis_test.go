package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/internal/sidecartest"
)

const sharedConfig = `
backend:
  kind: redis
  redis: {addrs: ["%s"], timeout: 200ms, on_unavailable: %s, replicas: 2}
scopes:
  pool:
    quota_full: fail_fast
    sources: [{name: only, max_concurrency: 2, timeout: 1s}]
    lease_grace: 0s
  probe:
    circuit_open: fail_fast
    breaker: {fail_threshold: 1, cooldown: 1s, max_cooldown: 1s, probe_ttl: 60s}
    sources: [{name: only, max_concurrency: 100}]
  reset:
    circuit_open: fail_fast
    breaker: {fail_threshold: 1, cooldown: 1h, max_cooldown: 1h}
    sources: [{name: only}]
`

// replica starts one sidecar on the shared Redis.
func replica(t *testing.T, addr, onUnavailable string) (admissionv1.AdmissionServiceClient, healthpb.HealthClient) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(sharedConfig, addr, onUnavailable)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	return dial(t, s.Addr)
}

type caller struct {
	t   *testing.T
	ctx context.Context
	c   admissionv1.AdmissionServiceClient
}

func (c caller) pick(scope string) *admissionv1.PickResponse {
	c.t.Helper()
	p, err := c.c.Pick(c.ctx, &admissionv1.PickRequest{Scope: scope})
	if err != nil {
		c.t.Fatalf("Pick(%s): %v", scope, err)
	}
	return p
}

func (c caller) report(scope string, p *admissionv1.PickResponse, o admissionv1.Outcome) *admissionv1.RecordOutcomeResponse {
	c.t.Helper()
	r, err := c.c.RecordOutcome(c.ctx, &admissionv1.RecordOutcomeRequest{Scope: scope, CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: o})
	if err != nil {
		c.t.Fatalf("RecordOutcome(%s): %v", scope, err)
	}
	return r
}

func (c caller) describe(scope string) *admissionv1.ScopeDescription {
	c.t.Helper()
	d, err := c.c.DescribeScope(c.ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		c.t.Fatalf("DescribeScope(%s): %v", scope, err)
	}
	return d.Scope
}

// eventually polls cond until it holds or the test's context ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never: %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestTwoSidecarsShareOneRedis(t *testing.T) {
	r := redistest.Start(t)
	c1, _ := replica(t, r.Addr, "fail_closed")
	c2, _ := replica(t, r.Addr, "fail_closed")
	ctx := testContext(t)
	a, b := caller{t, ctx, c1}, caller{t, ctx, c2}

	t.Run("ConcurrencyLimitHoldsAcrossBoth", func(t *testing.T) {
		first, second := a.pick("pool"), b.pick("pool")
		if first.GetGrant() == nil || second.GetGrant() == nil {
			t.Fatalf("two grants expected: %v / %v", first, second)
		}
		for _, c := range []caller{a, b} {
			p := c.pick("pool")
			if r := p.GetNoRunnable().GetPerSourceReasons(); len(r) != 1 || r[0].Reason != admissionv1.Reason_REASON_RATE_LIMITED {
				t.Fatalf("a third attempt through either sidecar: %v, want rate_limited", p)
			}
		}
		a.report("pool", first, admissionv1.Outcome_OUTCOME_SUCCESS)
		third := b.pick("pool")
		if third.GetGrant() == nil {
			t.Fatalf("a slot released through one sidecar is not free through the other: %v", third)
		}
		b.report("pool", second, admissionv1.Outcome_OUTCOME_SUCCESS)
		b.report("pool", third, admissionv1.Outcome_OUTCOME_SUCCESS)
	})

	t.Run("OneProbeAcrossBoth", func(t *testing.T) {
		a.report("probe", a.pick("probe"), admissionv1.Outcome_OUTCOME_TRANSIENT) // opens (threshold 1)
		refused := b.pick("probe").GetNoRunnable().GetPerSourceReasons()
		if len(refused) != 1 || refused[0].Reason != admissionv1.Reason_REASON_CIRCUIT_OPEN || refused[0].RetryAfter.AsDuration() <= 0 {
			t.Fatalf("a breaker opened through one sidecar, through the other: %v", refused)
		}
		eventually(t, ctx, "the 1s cooldown ends", func() bool {
			ra, err := c2.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: "probe"})
			return err == nil && ra.RetryAfter.AsDuration() == 0
		})
		const perSidecar = 16
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			probes []*admissionv1.PickResponse
			via    []caller
			others []admissionv1.Reason
		)
		for i := range 2 * perSidecar {
			c := []caller{a, b}[i%2]
			wg.Go(func() {
				p, err := c.c.Pick(ctx, &admissionv1.PickRequest{Scope: "probe"})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if p.GetGrant().GetProbe() {
					probes, via = append(probes, p), append(via, c)
				} else {
					others = append(others, p.GetNoRunnable().GetPerSourceReasons()[0].Reason)
				}
			})
		}
		wg.Wait()
		if len(probes) != 1 || len(others) != 2*perSidecar-1 {
			t.Fatalf("%d probes and %d refusals among %d concurrent callers on two sidecars, want exactly one probe", len(probes), len(others), 2*perSidecar)
		}
		for _, r := range others {
			if r != admissionv1.Reason_REASON_PROBE_IN_FLIGHT {
				t.Fatalf("refusal %v, want probe_in_flight", r)
			}
		}
		if r := via[0].report("probe", probes[0], admissionv1.Outcome_OUTCOME_SUCCESS); r.BreakerState != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
			t.Fatalf("probe success: %v", r)
		}
		for _, c := range []caller{a, b} {
			if g := c.pick("probe").GetGrant(); g == nil || g.Probe {
				t.Fatalf("after the probe closed the breaker, the next Pick through either sidecar: %v", g)
			}
		}
	})

	t.Run("ResetThroughOneClearsTheOthersMemo", func(t *testing.T) {
		a.report("reset", a.pick("reset"), admissionv1.Outcome_OUTCOME_TRANSIENT) // opens for an hour
		if b.pick("reset").GetNoRunnable() == nil || b.describe("reset").Sources[0].CooldownMemo.AsDuration() < 59*time.Minute {
			t.Fatal("the second sidecar should remember the hour-long OPEN in its cooldown memo")
		}
		if _, err := c1.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{
			Scope: "reset", Source: "only", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_RESET, Actor: "test", Reason: "recovered",
		}); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, "the reset's announcement reaches the other sidecar", func() bool {
			return b.describe("reset").Sources[0].CooldownMemo.AsDuration() == 0
		})
		if b.pick("reset").GetGrant() == nil {
			t.Fatal("the other sidecar still skips a source reset through the first")
		}
	})
}

func TestRedisOutage(t *testing.T) {
	// AOF with fsync always, so that a restarted Redis comes back with the
	// leases that were out when it died.
	r := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	closedClient, closedHealth := replica(t, r.Addr, "fail_closed")
	localClient, _ := replica(t, r.Addr, "local")
	ctx := testContext(t)
	closed, local := caller{t, ctx, closedClient}, caller{t, ctx, localClient}

	held := closed.pick("pool") // out when Redis dies; its report will fail
	r.Stop()

	// fail_closed: every RPC answers UNAVAILABLE within the 200ms backend
	// timeout; the client's deadline (1s) would turn a hang into DEADLINE_EXCEEDED.
	for range 5 {
		rpc, cancel := context.WithTimeout(ctx, time.Second)
		_, err := closedClient.Pick(rpc, &admissionv1.PickRequest{Scope: "pool"})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Pick during the outage: %v, want UNAVAILABLE", err)
		}
	}
	rpc, cancel := context.WithTimeout(ctx, time.Second)
	_, err := closedClient.RecordOutcome(rpc, &admissionv1.RecordOutcomeRequest{Scope: "pool", CallId: held.CallId, PermitId: held.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("RecordOutcome during the outage: %v, want UNAVAILABLE", err)
	}
	hc, err := closedHealth.Check(ctx, &healthpb.HealthCheckRequest{Service: admissionv1.AdmissionService_ServiceDesc.ServiceName})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("admission health during the outage under fail_closed: %v %v", hc, err)
	}
	if _, err := closedClient.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "pool"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("DescribeScope during the outage: %v", err)
	}

	// local: calls keep being admitted, each replica with half the limits.
	for range 3 {
		p := local.pick("pool")
		if p.GetGrant() == nil {
			t.Fatalf("local fallback refused: %v", p)
		}
		local.report("pool", p, admissionv1.Outcome_OUTCOME_SUCCESS)
	}
	if d := local.describe("pool"); d.Backend != "redis (unavailable: local fallback)" {
		t.Fatalf("DescribeScope under the local fallback says backend %q", d.Backend)
	}

	r.Start()
	eventually(t, ctx, "fail_closed serves again after Redis returns", func() bool {
		_, err := closedClient.ListScopes(ctx, &admissionv1.ListScopesRequest{})
		return err == nil
	})
	hc, err = closedHealth.Check(ctx, &healthpb.HealthCheckRequest{Service: admissionv1.AdmissionService_ServiceDesc.ServiceName})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("admission health after the outage: %v %v", hc, err)
	}
	eventually(t, ctx, "the local replica hands back to Redis", func() bool {
		p, err := localClient.Pick(ctx, &admissionv1.PickRequest{Scope: "pool"})
		if err != nil || p.GetGrant() == nil {
			return false
		}
		local.report("pool", p, admissionv1.Outcome_OUTCOME_SUCCESS)
		return local.describe("pool").Backend == "redis"
	})

	// The permit out when Redis died survived in the AOF; its report was lost,
	// so its slot stays taken until its lease (timeout 1s + grace 0) ends —
	// then the whole pool is free again: nothing leaked.
	eventually(t, ctx, "the lost permit's lease frees its slot", func() bool {
		return closed.describe("pool").Sources[0].InFlight == 0
	})
	a, b := closed.pick("pool"), local.pick("pool")
	if a.GetGrant() == nil || b.GetGrant() == nil {
		t.Fatalf("after the outage both slots are free again: %v / %v", a, b)
	}
}

// A sidecar started while Redis is down says so at once in its health, and
// turns SERVING when Redis answers.
func TestHealthWhenRedisIsDownAtStart(t *testing.T) {
	r := redistest.Start(t)
	r.Stop()
	client, health := replica(t, r.Addr, "fail_closed")
	ctx := testContext(t)
	for _, svc := range []string{"polygate.backend", admissionv1.AdmissionService_ServiceDesc.ServiceName} {
		hc, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || hc.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health of %s with Redis down at start: %v %v", svc, hc, err)
		}
	}
	r.Start()
	eventually(t, ctx, "the sidecar serves once Redis answers", func() bool {
		_, err := client.ListScopes(ctx, &admissionv1.ListScopesRequest{})
		return err == nil
	})
	hc, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "polygate.backend"})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("backend health after Redis came up: %v %v", hc, err)
	}
}
