package policy_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// A call's tenant, with the tokens it estimates.
func tenantCall(s *policy.Scope, tenant string, tokens int64) *policy.Call {
	c := policy.NewCall(policy.NewID("c"), s.Name(), tokens, time.Time{}, time.Now())
	c.Tenant = tenant
	return c
}

// refusedByTenant picks c and fails the test unless every source refused it
// with reason and one wait, which it returns.
func refusedByTenant(t *testing.T, s *policy.Scope, c *policy.Call, reason gate.Reason) time.Duration {
	t.Helper()
	p := pick(t, s, c)
	if p.NoRunnable == nil || len(p.NoRunnable.Sources) != len(s.Config().Sources) || p.NoRunnable.GateRejections != 0 {
		t.Fatalf("Pick %+v, want every source refused by the tenant", p)
	}
	for _, r := range p.NoRunnable.Sources {
		if r.Reason != reason || r.RetryAfter != p.NoRunnable.Sources[0].RetryAfter {
			t.Fatalf("reasons %s, want %v with one wait", reasons(p.NoRunnable.Sources), reason)
		}
	}
	return p.NoRunnable.Sources[0].RetryAfter
}

func onNoRunnable(t *testing.T, s *policy.Scope, c *policy.Call) policy.Decision {
	t.Helper()
	d, err := s.OnNoRunnable(ctx(t), c)
	if err != nil {
		t.Fatalf("OnNoRunnable: %v", err)
	}
	return d
}

// TestTenantMinuteIsACertainWait: a tenant at its rpm waits, under
// quota_full: wait, exactly until its minute frees (plus jitter), while
// another tenant is served; a release of the other tenant's permit does
// not wake it. Under fail_fast it fails quota_exhausted with that wait.
func TestTenantMinuteIsACertainWait(t *testing.T) {
	const scope = `
backpressure: {poll_interval: 100ms}
tenants: {team: {rpm: 2}}
sources: [{name: a}, {name: b}]
`
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, scope)
		for range 2 {
			c := tenantCall(s, "team", 0)
			record(t, s, c, grant(t, s, c), policy.Success)
		}
		time.Sleep(10 * time.Second)
		c := tenantCall(s, "team", 0)
		if wait := refusedByTenant(t, s, c, gate.ReasonTenantLimit); wait != 50*time.Second {
			t.Fatalf("wait %v, want the 50s left of the minute", wait)
		}
		other := tenantCall(s, "other", 0)
		g := grant(t, s, other)
		go func() {
			time.Sleep(time.Second)
			record(t, s, other, g, policy.Success) // does not wake the tenant's call
		}()
		d := onNoRunnable(t, s, c)
		if want := 50*time.Second + 75*time.Millisecond; d.Failure != nil || d.Woken || d.Slept != want || d.Uncertain {
			t.Fatalf("decision %+v, want a certain wait of %v", d, want)
		}
		grant(t, s, c)
	})
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, "quota_full: fail_fast\n"+scope)
		for range 2 {
			c := tenantCall(s, "team", 0)
			record(t, s, c, grant(t, s, c), policy.Success)
		}
		c := tenantCall(s, "team", 0)
		refusedByTenant(t, s, c, gate.ReasonTenantLimit)
		f := wantFailure(t, policy.Action{Failure: onNoRunnable(t, s, c).Failure}, policy.FailQuotaExhausted)
		if f.RetryAfter != time.Minute {
			t.Fatalf("failure %+v, want retry_after 1m", f)
		}
	})
}

// TestTenantConcurrencyWaitsForARelease: a tenant at its max_concurrency
// has no certain time (its permit may end at any moment); it is held and
// re-asks when the scope's poller finds a source that admits after its
// permit ended.
func TestTenantConcurrencyWaitsForARelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
backpressure: {poll_interval: 100ms}
default_tenant: {max_concurrency: 1}
sources: [{name: a, max_concurrency: 4}]
`)
		first := tenantCall(s, "anyone", 0)
		g := grant(t, s, first)
		c := tenantCall(s, "someone-else", 0) // tenants not named share the default's limits
		if wait := refusedByTenant(t, s, c, gate.ReasonTenantLimit); wait != 0 {
			t.Fatalf("wait %v, want 0", wait)
		}
		go func() {
			time.Sleep(time.Second)
			record(t, s, first, g, policy.Success)
		}()
		d := onNoRunnable(t, s, c)
		if !d.Woken || !d.Uncertain || d.Slept < time.Second || d.Slept > time.Second+100*time.Millisecond {
			t.Fatalf("decision %+v, want woken within a poll interval of the release at 1s", d)
		}
		grant(t, s, c)
	})
}

// TestTenantConcurrencyNoticesALeaseEnd: a permit of the tenant that ends
// with its lease (nobody reports it here) is noticed by the poller's read,
// within a poll interval.
func TestTenantConcurrencyNoticesALeaseEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
backpressure: {poll_interval: 100ms}
lease_grace: 0s
tenants: {team: {max_concurrency: 1}}
sources: [{name: a, timeout: 2s}]
`)
		grant(t, s, tenantCall(s, "team", 0)) // never reported
		c := tenantCall(s, "team", 0)
		refusedByTenant(t, s, c, gate.ReasonTenantLimit)
		d := onNoRunnable(t, s, c)
		if !d.Woken || d.Slept < 2*time.Second || d.Slept > 2*time.Second+100*time.Millisecond {
			t.Fatalf("decision %+v, want woken within a poll interval of the lease's end at 2s", d)
		}
		grant(t, s, c)
	})
}

// TestBudgetExhausted: a spent token budget ends the call with
// budget_exhausted and the time until the window frees enough, unless that
// time fits in the stall budget and quota_full is wait, when the call waits
// for it. The budget counts actual tokens once reported.
func TestBudgetExhausted(t *testing.T) {
	const scope = `
tenants: {team: {token_budget: {tokens: 1000, per: 1h}}}
sources: [{name: a}]
`
	spend := func(t *testing.T, s *policy.Scope, estimate, actual int64) {
		c := tenantCall(s, "team", estimate)
		g := grant(t, s, c)
		if _, err := s.RecordOutcome(ctx(t), c, policy.Attempt{PermitID: g.Permit.ID, Outcome: policy.Success, ActualTokens: actual}); err != nil {
			t.Fatal(err)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, scope)
		spend(t, s, 100, 900) // the actual count is what the budget keeps
		time.Sleep(30 * time.Minute)
		spend(t, s, 50, 50)
		c := tenantCall(s, "team", 100)
		// 950 spent: 100 more needs the first slice (900) out, at 1h.
		if wait := refusedByTenant(t, s, c, gate.ReasonTenantBudget); wait != 30*time.Minute {
			t.Fatalf("wait %v, want 30m", wait)
		}
		f := wantFailure(t, policy.Action{Failure: onNoRunnable(t, s, c).Failure}, policy.FailBudgetExhausted)
		if f.RetryAfter != 30*time.Minute {
			t.Fatalf("failure %+v, want retry_after 30m", f)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, "backpressure: {stall_window: 2h, poll_interval: 100ms}\n"+scope)
		spend(t, s, 1000, -1)
		c := tenantCall(s, "team", 10)
		refusedByTenant(t, s, c, gate.ReasonTenantBudget)
		long, cancel := context.WithTimeout(context.Background(), 3*time.Hour) // longer than the wait
		defer cancel()
		d, err := s.OnNoRunnable(long, c)
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Hour + 75*time.Millisecond; d.Failure != nil || d.Slept != want {
			t.Fatalf("decision %+v, want a wait of %v: the window frees within the stall budget", d, want)
		}
		grant(t, s, c)
	})
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, "quota_full: fail_fast\nbackpressure: {stall_window: 2h}\n"+scope)
		spend(t, s, 1000, -1)
		c := tenantCall(s, "team", 10)
		refusedByTenant(t, s, c, gate.ReasonTenantBudget)
		wantFailure(t, policy.Action{Failure: onNoRunnable(t, s, c).Failure}, policy.FailBudgetExhausted)
	})
}

// TestEstimateAboveTheTenantsLimits: an estimate above the tenant's tpm or
// its whole budget can never be admitted.
func TestEstimateAboveTheTenantsLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
tenants: {team: {tpm: 100}, thrifty: {token_budget: {tokens: 50, per: 1h}}}
sources: [{name: a}]
`)
		for _, c := range []*policy.Call{tenantCall(s, "team", 101), tenantCall(s, "thrifty", 51)} {
			if _, err := s.Pick(ctx(t), c); !errors.Is(err, policy.ErrEstimateTooLarge) {
				t.Fatalf("%s: Pick error %v, want ErrEstimateTooLarge", c.Tenant, err)
			}
		}
		grant(t, s, tenantCall(s, "other", 1000))
	})
}

// TestDescribeShowsTenants: every tenant the scope names, then ~other, with
// its configuration and use.
func TestDescribeShowsTenants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
tenants: {gold: 4, team: {rpm: 5, token_budget: {tokens: 1000, per: 1h}}}
default_tenant: {max_concurrency: 3}
sources: [{name: a}]
`)
		grant(t, s, tenantCall(s, "team", 200))
		grant(t, s, tenantCall(s, "", 0))
		d, err := s.Describe(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Tenants) != 3 || d.Tenants[0].Name != "gold" || d.Tenants[1].Name != "team" || d.Tenants[2].Name != gate.OverflowTenant {
			t.Fatalf("tenants %+v", d.Tenants)
		}
		if team := d.Tenants[1]; team.View.Quota.InFlight != 1 || team.View.Quota.Requests != 1 || team.View.BudgetUsed != 200 || team.Config.RPM != 5 {
			t.Fatalf("team %+v", team)
		}
		if other := d.Tenants[2]; other.View.Quota.InFlight != 1 || other.Config.MaxConcurrency != 3 {
			t.Fatalf("~other %+v", other)
		}
	})
}
