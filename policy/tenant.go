package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// A call's tenant has limits in its scope (rpm, tpm, concurrency, a token
// budget) that the backend keeps beside the sources, so that on Redis they
// are the fleet's: Pick's Admit asks the tenant before the walk and refuses
// every source alike (gate.ReasonTenantLimit, gate.ReasonTenantBudget) with
// the exact wait; RecordOutcome settles the permit's tokens there too.
// OnNoRunnable decides a tenant's refusal by quota_full, as a source's
// capacity, with two differences: the wait is certain when the refusal says
// how long (the tenant's minute or budget frees then), and a spent budget
// ends the call (budget_exhausted) unless quota_full is wait and that time
// fits in the rest of the stall budget. A call refused by its tenant waits
// for its tenant, not in a source's line, and a release of another
// tenant's permit does not wake it.

// tenantCalls are cfg's tenants as the backend keeps them, by key (a
// tenant's name, or gate.OverflowTenant for every tenant cfg does not
// name): those with limits, made once per configuration (a Pick and a
// RecordOutcome look theirs up).
func tenantCalls(cfg *config.Scope) map[string]*gate.TenantCall {
	out := map[string]*gate.TenantCall{}
	add := func(key string, t config.Tenant) {
		if l := t.Limits(); l.Limited() {
			out[key] = &gate.TenantCall{Name: key, Limits: l}
		}
	}
	for name, t := range cfg.Tenants {
		add(name, t)
	}
	add(gate.OverflowTenant, cfg.DefaultTenant)
	return out
}

// tenantCall is tenant's call under cfg (one of calls, made of cfg); nil
// when the tenant has no limits, so that the backend keeps nothing for it.
func tenantCall(cfg *config.Scope, calls map[string]*gate.TenantCall, tenant string) *gate.TenantCall {
	return calls[cfg.TenantKey(tenant)]
}

// tooBigForTenant is why an estimate of tokens can never be admitted for
// tc ("" when it can): above its tpm or its whole budget.
func tooBigForTenant(tc *gate.TenantCall, tokens int64) error {
	if tc == nil {
		return nil
	}
	switch l := tc.Limits; {
	case l.TPM > 0 && tokens > l.TPM:
		return fmt.Errorf("%w: %d tokens exceed the tpm (%d) of tenant %s", ErrEstimateTooLarge, tokens, l.TPM, tc.Name)
	case l.Budget > 0 && tokens > l.Budget:
		return fmt.Errorf("%w: %d tokens exceed the token budget (%d) of tenant %s", ErrEstimateTooLarge, tokens, l.Budget, tc.Name)
	}
	return nil
}

// tenantRefusal is the tenant's refusal among a walk's reasons (Reason
// ReasonNone when its tenant did not refuse it).
func tenantRefusal(rs []gate.Rejection) gate.Rejection {
	i := slices.IndexFunc(rs, func(r gate.Rejection) bool {
		return r.Reason == gate.ReasonTenantLimit || r.Reason == gate.ReasonTenantBudget
	})
	if i < 0 {
		return gate.Rejection{}
	}
	return rs[i]
}

// tenantVerdict is the tenant's verdict of a snapshot that read it, else
// the refusal the call had (a backend that keeps no tenants reads none).
func tenantVerdict(snap gate.Snapshot, had gate.Rejection) gate.Rejection {
	if len(snap.Tenants) > 0 {
		return snap.Tenants[0].Verdict
	}
	return had
}

// TenantState is a tenant of a scope as DescribeScope shows it.
type TenantState struct {
	// Name is a tenant's name, or gate.OverflowTenant for every tenant the
	// scope does not name.
	Name   string
	Config config.Tenant
	View   gate.TenantView
}

// describedTenants are the tenants a describe shows: every tenant cfg
// names, then gate.OverflowTenant for the others; and the calls that read
// those with limits (the backend keeps nothing of the others), with each
// call's index in the states.
func describedTenants(cfg *config.Scope) ([]TenantState, []gate.TenantCall, []int) {
	names := make([]string, 0, len(cfg.Tenants)+1)
	for name := range cfg.Tenants {
		names = append(names, name)
	}
	slices.Sort(names)
	names = append(names, gate.OverflowTenant)
	states := make([]TenantState, len(names))
	var calls []gate.TenantCall
	var at []int
	for i, name := range names {
		t, ok := cfg.Tenants[name]
		if !ok {
			t = cfg.DefaultTenant
		}
		states[i] = TenantState{Name: name, Config: t, View: gate.TenantView{Tenant: name}}
		if l := t.Limits(); l.Limited() {
			calls = append(calls, gate.TenantCall{Name: name, Limits: l})
			at = append(at, i)
		}
	}
	return states, calls, at
}

// bells wake the calls held for their tenant's concurrency: one bell per
// tenant (by key) while calls wait for it, rung by a release of one of the
// tenant's permits here and by the scope's poller when its read finds the
// tenant admits again (a permit released on another replica, a lease that
// ran out). A ring wakes every call of the tenant, and none of another. Its
// lock is a leaf.
type bells struct {
	mu      sync.Mutex
	ch      map[string]chan struct{}
	waiting map[string]int
}

func newBells() *bells {
	return &bells{ch: map[string]chan struct{}{}, waiting: map[string]int{}}
}

// take registers a call waiting for tenant key, before the read that
// decides its wait, and returns the bell that rings for it; done ends it.
func (b *bells) take(key string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := b.ch[key]
	if ch == nil {
		ch = make(chan struct{})
		b.ch[key] = ch
	}
	b.waiting[key]++
	return ch
}

func (b *bells) done(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting[key]--; b.waiting[key] <= 0 {
		delete(b.waiting, key)
		delete(b.ch, key)
	}
}

// ring wakes the calls waiting for tenant key.
func (b *bells) ring(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch := b.ch[key]; ch != nil {
		close(ch)
		b.ch[key] = make(chan struct{})
	}
}

// keys are the tenants calls wait for, sorted.
func (b *bells) keys() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(maps.Keys(b.waiting))
}

// holdTenant holds a call refused by its tenant for at most nap: until the
// tenant's minute or budget frees (the nap of a certain wait), or, waiting
// for the tenant's concurrency (bell set), until the bell rings. The poller
// runs meanwhile, whose read rings the bell when the tenant admits. It
// reports whether the bell ended the hold; a hold ended by ctx returns
// ctx's error; Close ends it at once.
func (s *Scope) holdTenant(ctx context.Context, bell <-chan struct{}, nap time.Duration) (woken bool, err error) {
	if bell != nil {
		s.wait.watch(true)
		defer s.wait.unwatch(true)
	}
	timer := time.NewTimer(nap)
	defer timer.Stop()
	select {
	case <-bell:
		return true, nil
	case <-timer.C:
	case <-s.wait.closing:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return false, nil
}

// tenantFreed rings the bell of a released permit's tenant.
func (s *Scope) tenantFreed(tc *gate.TenantCall, released bool) {
	if tc != nil && released {
		s.bells.ring(tc.Name)
	}
}

// pollTenants is the poller's part for the calls held for their tenant: it
// reads their tenants with the scope's sources (req) and rings each tenant
// that admits.
func (s *Scope) pollTenants(req *gate.PeekRequest) func(gate.Snapshot) {
	keys := s.bells.keys()
	if len(keys) == 0 {
		return func(gate.Snapshot) {}
	}
	for _, k := range keys {
		if tc := s.tenantByKey(k); tc != nil {
			req.Tenants = append(req.Tenants, *tc)
		}
	}
	return func(snap gate.Snapshot) {
		for _, v := range snap.Tenants {
			if v.Verdict.Reason == gate.ReasonNone {
				s.bells.ring(v.Tenant)
			}
		}
	}
}
