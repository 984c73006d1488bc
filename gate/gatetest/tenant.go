package gatetest

import (
	"slices"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// runTenants runs the contract of a scope's tenants (gate/tenant.go) and of
// the line's share table against the backends factory makes: limits that
// hold across every source of a scope, refusals with the exact time until
// the tenant's capacity frees, the token budget's window, and configured
// tenants that keep their fair share whatever tenants pass through.
func runTenants(t *testing.T, factory Factory) {
	t.Run("Limits", func(t *testing.T) { runTenantLimits(t, factory) })
	t.Run("Budget", func(t *testing.T) { runTenantBudget(t, factory) })
	t.Run("ShareTable", func(t *testing.T) { runShareTable(t, factory) })
}

// tenant is a tenant call of name with limits.
func tenant(name string, l gate.TenantLimits) *gate.TenantCall {
	return &gate.TenantCall{Name: name, Limits: l}
}

// admitFor asks for a permit of tokens for tc from the sources, in order.
func (e *env) admitFor(tc *gate.TenantCall, tokens int64, srcs ...*gate.Source) gate.Admission {
	e.t.Helper()
	cands := make([]gate.Candidate, len(srcs))
	for i, s := range srcs {
		cands[i] = gate.Candidate{Source: s, Ceiling: s.Limits.MaxConcurrency}
	}
	a, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Tokens: tokens, Candidates: cands, Tenant: tc})
	if err != nil {
		e.t.Fatalf("Admit: %v", err)
	}
	return a
}

// grantFor admits for tc and fails the test unless it is granted.
func (e *env) grantFor(tc *gate.TenantCall, tokens int64, srcs ...*gate.Source) gate.Permit {
	e.t.Helper()
	a := e.admitFor(tc, tokens, srcs...)
	if !a.Granted {
		e.t.Fatalf("Admit for %s refused: %+v", tc.Name, a.Rejections)
	}
	return a.Permit
}

// refusedFor admits for tc and fails the test unless every source refuses
// with reason and the same wait; it returns the wait.
func (e *env) refusedFor(tc *gate.TenantCall, tokens int64, reason gate.Reason, srcs ...*gate.Source) time.Duration {
	e.t.Helper()
	a := e.admitFor(tc, tokens, srcs...)
	if a.Granted || len(a.Rejections) != len(srcs) {
		e.t.Fatalf("Admit for %s: %+v, want every source refused %v", tc.Name, a, reason)
	}
	for i, r := range a.Rejections {
		if r.Source != srcs[i].Name || r.Reason != reason || r.RetryAfter != a.Rejections[0].RetryAfter {
			e.t.Fatalf("Admit for %s: rejections %+v, want %v on every source with one wait", tc.Name, a.Rejections, reason)
		}
	}
	if len(a.Events) > 0 {
		e.t.Fatalf("a tenant's refusal asked a breaker: %+v", a.Events)
	}
	return a.Rejections[0].RetryAfter
}

// settleFor settles p of src for tc with actual tokens (< 0: the estimate).
func (e *env) settleFor(tc *gate.TenantCall, src *gate.Source, p gate.Permit, actual int64) {
	e.t.Helper()
	e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: gate.VerdictSuccess,
		ActualTokens: actual, Progress: true, Tenant: tc})
}

// tenantView reads tc at tokens.
func (e *env) tenantView(tc *gate.TenantCall, tokens int64, src *gate.Source) gate.TenantView {
	e.t.Helper()
	s, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: []*gate.Source{src}, Tokens: tokens, Tenants: []gate.TenantCall{*tc}})
	if err != nil {
		e.t.Fatalf("Peek: %v", err)
	}
	if len(s.Tenants) != 1 || s.Tenants[0].Tenant != tc.Name {
		e.t.Fatalf("Peek's tenants %+v, want %s", s.Tenants, tc.Name)
	}
	return s.Tenants[0]
}

func runTenantLimits(t *testing.T, factory Factory) {
	t.Run("ConcurrencyAcrossSources", func(t *testing.T) {
		e := newEnv(t, factory)
		a, b := Src("a"), Src("b")
		gold := tenant("gold", gate.TenantLimits{MaxConcurrency: 2})
		pa := e.grantFor(gold, 0, a, b)
		pb := e.grantFor(gold, 0, b, a)
		if pa.Source != "a" || pb.Source != "b" {
			t.Fatalf("grants on %s and %s, want a and b", pa.Source, pb.Source)
		}
		if wait := e.refusedFor(gold, 0, gate.ReasonTenantLimit, a, b); wait != 0 {
			t.Fatalf("a full tenant's wait %v, want 0 (a slot may free at any moment)", wait)
		}
		if q := e.view(a).Quota; q.InFlight != 1 {
			t.Fatalf("a tenant's refusal took a slot of a: in flight %d", q.InFlight)
		}
		// Another tenant, and the tenants not named, are not limited by gold.
		e.grantFor(tenant("silver", gate.TenantLimits{MaxConcurrency: 1}), 0, a)
		e.grantFor(tenant(gate.OverflowTenant, gate.TenantLimits{MaxConcurrency: 1}), 0, b)
		if v := e.tenantView(gold, 0, a); v.Quota.InFlight != 2 || v.Verdict.Reason != gate.ReasonTenantLimit {
			t.Fatalf("gold read as %+v, want 2 in flight and refused", v)
		}
		e.settleFor(gold, a, pa, -1)
		if v := e.tenantView(gold, 0, a); v.Quota.InFlight != 1 || v.Verdict.Reason != gate.ReasonNone {
			t.Fatalf("gold after a settle: %+v, want 1 in flight and admitted", v)
		}
		e.grantFor(gold, 0, a, b)
	})
	t.Run("LeaseFreesTheTenantsSlot", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.Lease = 10 * time.Second })
		one := tenant("one", gate.TenantLimits{MaxConcurrency: 1})
		lost := e.grantFor(one, 0, src)
		e.clock.Advance(10*time.Second - time.Millisecond)
		e.refusedFor(one, 0, gate.ReasonTenantLimit, src)
		e.clock.Advance(time.Millisecond)
		e.grantFor(one, 0, src)
		e.settleFor(one, src, lost, -1) // late: frees nothing of the permit after it
		e.refusedFor(one, 0, gate.ReasonTenantLimit, src)
	})
	t.Run("RPMOverASlidingMinute", func(t *testing.T) {
		e := newEnv(t, factory)
		a, b := Src("a"), Src("b")
		team := tenant("team", gate.TenantLimits{RPM: 3})
		e.settleFor(team, a, e.grantFor(team, 0, a), -1)
		e.clock.Advance(10 * time.Second)
		e.settleFor(team, b, e.grantFor(team, 0, b), -1)
		e.grantFor(team, 0, a)
		e.clock.Advance(5 * time.Second)
		if wait := e.refusedFor(team, 0, gate.ReasonTenantLimit, a, b); wait != 45*time.Second {
			t.Fatalf("the 4th request in the minute: wait %v, want 45s", wait)
		}
		e.grantFor(tenant("other", gate.TenantLimits{RPM: 3}), 0, a, b)
		e.clock.Advance(45*time.Second - time.Millisecond)
		e.refusedFor(team, 0, gate.ReasonTenantLimit, a, b)
		e.clock.Advance(time.Millisecond)
		e.grantFor(team, 0, b)
		if v := e.tenantView(team, 0, a); v.Quota.Requests != 3 {
			t.Fatalf("requests in the minute %d, want 3", v.Quota.Requests)
		}
	})
	t.Run("TPMEstimateThenActual", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		team := tenant("team", gate.TenantLimits{TPM: 100})
		first := e.grantFor(team, 60, src)
		e.clock.Advance(time.Second)
		if wait := e.refusedFor(team, 60, gate.ReasonTenantLimit, src); wait != 59*time.Second {
			t.Fatalf("over the tenant's tpm: wait %v, want 59s", wait)
		}
		e.settleFor(team, src, first, 10)
		e.grantFor(team, 60, src)
		if v := e.tenantView(team, 0, src); v.Quota.Tokens != 70 {
			t.Fatalf("tokens in the minute %d, want 70", v.Quota.Tokens)
		}
		if q := e.view(src).Quota; q.InFlight != 1 {
			t.Fatalf("the source's in flight %d, want 1", q.InFlight)
		}
	})
	t.Run("RefusalLeavesTheLines", func(t *testing.T) {
		// A waiter refused by its tenant waits for its tenant, not for the
		// source: it leaves the line, and the next waiter is the head.
		e := newEnv(t, factory)
		src := one(1)
		held := e.grant(src)
		w1, w2 := waiter("w1", 0, "x"), waiter("w2", 0, "y")
		e.join(src, w1)
		e.join(src, w2)
		x := tenant("x", gate.TenantLimits{RPM: 1})
		e.settleFor(x, src, e.grantFor(x, 0, Src("b")), -1)
		e.settle(src, held, gate.VerdictSuccess)
		a, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Line: w1, Tenant: x,
			Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if a.Granted || len(a.Rejections) != 1 || a.Rejections[0].Reason != gate.ReasonTenantLimit || len(a.Places) != 0 {
			t.Fatalf("the head refused by its tenant: %+v, want tenant_limit and no place", a)
		}
		if a := e.pick(src, w2); !a.Granted {
			t.Fatalf("the next waiter: %+v, want granted", a)
		}
	})
	t.Run("IdleTenantsAreForgotten", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		team := tenant("team", gate.TenantLimits{RPM: 1, MaxConcurrency: 1})
		e.settleFor(team, src, e.grantFor(team, 0, src), -1)
		e.clock.Advance(time.Minute)
		if v := e.tenantView(team, 0, src); v != (gate.TenantView{Tenant: "team"}) {
			t.Fatalf("a tenant a minute after its last request: %+v, want nothing held", v)
		}
	})
}

func runTenantBudget(t *testing.T, factory Factory) {
	// The test clock starts on a whole hour, so the budget's slices of a
	// minute start with it.
	budget := gate.TenantLimits{Budget: 1000, BudgetWindow: time.Hour}
	t.Run("RetryWhenTheWindowFreesEnough", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		team := tenant("team", budget)
		e.clock.Advance(30 * time.Second) // into the first slice: it counts until 1h
		first := e.grantFor(team, 600, src)
		e.clock.Advance(10 * time.Minute)
		second := e.grantFor(team, 300, src)
		e.clock.Advance(5 * time.Minute)
		// 600 + 300 spent (estimates): 200 more needs the first slice gone.
		if wait := e.refusedFor(team, 200, gate.ReasonTenantBudget, src); wait != time.Hour-15*time.Minute-30*time.Second {
			t.Fatalf("wait %v, want the first slice's end (44m30s)", wait)
		}
		// 1000 more needs both slices gone: the second counts until 1h10m.
		e.settleFor(team, src, second, -1)
		if wait := e.refusedFor(team, 1000, gate.ReasonTenantBudget, src); wait != time.Hour-5*time.Minute-30*time.Second {
			t.Fatalf("wait for the whole budget %v, want the second slice's end (54m30s)", wait)
		}
		// The actual tokens settle the estimate.
		e.settleFor(team, src, first, 400)
		if v := e.tenantView(team, 0, src); v.BudgetUsed != 700 {
			t.Fatalf("spent %d, want 700", v.BudgetUsed)
		}
		e.grantFor(team, 300, src)
		e.refusedFor(team, 1, gate.ReasonTenantBudget, src)
		e.clock.Advance(time.Hour - 15*time.Minute - 30*time.Second - time.Millisecond)
		e.refusedFor(team, 1, gate.ReasonTenantBudget, src)
		e.clock.Advance(time.Millisecond)
		e.grantFor(team, 400, src)
	})
	t.Run("LargerThanTheBudgetNeverFits", func(t *testing.T) {
		e := newEnv(t, factory)
		if wait := e.refusedFor(tenant("team", budget), 1001, gate.ReasonTenantBudget, Src("a")); wait != 0 {
			t.Fatalf("wait %v for more than the whole budget, want 0", wait)
		}
	})
	t.Run("LateOutcomeKeepsTheEstimate", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.Lease = 10 * time.Second })
		team := tenant("team", budget)
		p := e.grantFor(team, 800, src)
		e.clock.Advance(10 * time.Second)
		e.settleFor(team, src, p, 10)
		if v := e.tenantView(team, 0, src); v.BudgetUsed != 800 {
			t.Fatalf("spent %d after an outcome past its lease, want the estimate 800", v.BudgetUsed)
		}
	})
	t.Run("BudgetBeforeLimits", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		team := tenant("team", gate.TenantLimits{RPM: 1, Budget: 100, BudgetWindow: time.Hour})
		e.grantFor(team, 100, src)
		e.refusedFor(team, 1, gate.ReasonTenantBudget, src)
	})
}

// shareWaiter is a waiter of tenant; named ones are those the
// configuration names, with their weight.
func shareWaiter(id, tenant string, weight int, named bool) *gate.Waiter {
	return waiter(id, 0, tenant, func(w *gate.Waiter) { w.Weight, w.Named, w.MaxTenants = weight, named, 2 })
}

// leave takes w out of src's line.
func (e *env) leave(src *gate.Source, w *gate.Waiter) {
	e.t.Helper()
	if err := e.b.Leave(e.ctx, gate.LeaveRequest{Scope: e.scope, Waiter: w.ID, Sources: []string{src.Name}}); err != nil {
		e.t.Fatalf("Leave: %v", err)
	}
}

func runShareTable(t *testing.T, factory Factory) {
	roomy := Src("s")
	groups := func(e *env) map[string]int {
		v := e.readLine(roomy, &gate.LineRead{Replica: "r1", Lease: lineLease, Describe: true})
		out := map[string]int{}
		for _, g := range v.Groups {
			out[g.Tenant] += g.Waiting
		}
		return out
	}
	t.Run("NamedTenantsKeepTheirBucket", func(t *testing.T) {
		// Two tenants not named fill max_tenants (2): the third shares
		// ~other, but gold and x, named, have buckets of their own, and
		// share by weight.
		e := newEnv(t, factory)
		for _, w := range []*gate.Waiter{shareWaiter("u1", "u1", 1, false), shareWaiter("u2", "u2", 1, false), shareWaiter("u3", "u3", 1, false)} {
			e.join(roomy, w)
		}
		ws := []*gate.Waiter{shareWaiter("u1", "u1", 1, false), shareWaiter("u2", "u2", 1, false), shareWaiter("u3", "u3", 1, false)}
		for _, w := range ws {
			e.join(roomy, w)
		}
		for i := range 4 {
			g, x := shareWaiter("g"+string(rune('1'+i)), "gold", 4, true), shareWaiter("x"+string(rune('1'+i)), "x", 1, true)
			e.join(roomy, g)
			e.join(roomy, x)
			ws = append(ws, g, x)
		}
		if g := groups(e); g["gold"] != 4 || g["x"] != 4 || g["u3"] != 0 || g[gate.OverflowTenant] != 1 {
			t.Fatalf("groups %v, want gold and x on their own and u3 in %s", g, gate.OverflowTenant)
		}
		var named []string
		for _, id := range e.serve(roomy, ws) {
			if id[0] != 'u' {
				named = append(named, id)
			}
		}
		if want := []string{"g1", "g2", "g3", "x1", "g4", "x2", "x3", "x4"}; !slices.Equal(named, want) {
			t.Fatalf("order of gold and x %v, want %v: gold (4) takes four grants to x's (1) one", named, want)
		}
	})
	t.Run("BucketFreedWhenNobodyWaits", func(t *testing.T) {
		// One-off tenants pass through a line that never empties: each
		// bucket is freed when its waiter is served, so a later tenant
		// still has a bucket of its own.
		e := newEnv(t, factory)
		stay := shareWaiter("stay", "stay", 1, false)
		e.join(roomy, stay)
		for i := range 5 {
			w := shareWaiter("once-"+string(rune('a'+i)), "once-"+string(rune('a'+i)), 1, false)
			e.join(roomy, w)
			e.leave(roomy, w)
		}
		late := shareWaiter("late", "late", 1, false)
		e.join(roomy, late)
		if g := groups(e); g["late"] != 1 || g[gate.OverflowTenant] != 0 {
			t.Fatalf("groups %v, want late in a bucket of its own", g)
		}
	})
	t.Run("NoDebtFromWaitersThatLeft", func(t *testing.T) {
		// A tenant whose waiters left unserved starts where the line is,
		// not behind the tags they would have had.
		e := newEnv(t, factory)
		head := shareWaiter("head", "h", 1, true)
		e.join(roomy, head)
		for i := range 3 {
			w := shareWaiter("b"+string(rune('1'+i)), "b", 1, true)
			e.join(roomy, w)
			e.leave(roomy, w)
		}
		c1, c2 := shareWaiter("c1", "c", 1, true), shareWaiter("c2", "c", 1, true)
		b := shareWaiter("b4", "b", 1, true)
		for _, w := range []*gate.Waiter{c1, c2, b} {
			e.join(roomy, w)
		}
		if order := e.serve(roomy, []*gate.Waiter{head, c1, c2, b}); !slices.Equal(order, []string{"head", "c1", "b4", "c2"}) {
			t.Fatalf("order %v, want b4 to share with c from where the line is", order)
		}
	})
}
