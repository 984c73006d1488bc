package config

import (
	"slices"
	"time"

	"github.com/polygate/polygate/gate"
)

// OnRefusal is what a call does when every source refused it for one kind of
// reason: fail at once, or wait and ask again.
type OnRefusal string

const (
	FailFast OnRefusal = "fail_fast"
	Wait     OnRefusal = "wait"
)

// Mode says whether a scope enforces its decisions (enforce) or only reports
// them on grants that it always gives (shadow).
type Mode string

const (
	Enforce Mode = "enforce"
	Shadow  Mode = "shadow"
)

// Scope is one logical upstream service and its policies, validated.
type Scope struct {
	Name string
	// CircuitOpen decides when every source is refused by its breaker (or the
	// cooldown memo); QuotaFull when at least one is refused by quota or pacer.
	CircuitOpen OnRefusal
	QuotaFull   OnRefusal
	// SourceDead decides, whatever CircuitOpen says, when every source is
	// refused by a breaker OPEN because of a SOURCE_DEAD outcome.
	SourceDead OnRefusal
	// MaxAttempts is the retry budget: real attempts, 429s excluded.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the exponential backoff after a failed attempt.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxRetryAfter caps an upstream Retry-After that lengthens a backoff:
	// a longer hint fails the call (retry_after_too_long) instead.
	MaxRetryAfter time.Duration
	// StallWindow is the stall budget: non-productive time a call may spend
	// while the scope makes no progress; PollInterval paces re-asking when
	// there is no certain time to wait for.
	StallWindow  time.Duration
	PollInterval time.Duration
	// LeaseGrace is added to a source's timeout to make a permit's lease.
	LeaseGrace time.Duration
	Sources    []Source
	// Mode: enforce, or shadow (every Pick granted, would-be refusals reported).
	Mode Mode
	// Tenants are the tenants the configuration names, each with its weight
	// in the fair share of a source's capacity, its priority ceiling and its
	// limits; DefaultTenant is every other tenant's (and a call's without a
	// tenant). Beyond MaxTenants tenants it does not name waiting in a line,
	// the others share one bucket of the fair share.
	Tenants       map[string]Tenant
	DefaultTenant Tenant
	MaxTenants    int
	// PriorityAging adds 1 to a waiting call's effective priority per
	// PriorityAging waited; 0: no aging.
	PriorityAging time.Duration
}

// Tenant is a tenant's policy in a scope. A zero limit is no limit.
type Tenant struct {
	// Weight is its weight in the fair share (1 to MaxTenantWeight).
	Weight int
	// MaxPriority is the highest priority its calls rank at: a higher one
	// is clamped to it.
	MaxPriority int32
	// RPM, TPM and MaxConcurrency hold across every source of the scope.
	RPM, TPM       int64
	MaxConcurrency int
	// MaxLiveCalls caps its calls open at once in the scope.
	MaxLiveCalls int
	// Budget is the tokens it may spend over BudgetPer (0: no budget).
	Budget    int64
	BudgetPer time.Duration
}

// Limits are t's limits as the backend keeps them.
func (t Tenant) Limits() gate.TenantLimits {
	return gate.TenantLimits{MaxConcurrency: t.MaxConcurrency, RPM: t.RPM, TPM: t.TPM, Budget: t.Budget, BudgetWindow: t.BudgetPer}
}

// Tenant is the policy of the named tenant: its own when the configuration
// names it (named), else DefaultTenant.
func (sc *Scope) Tenant(name string) (t Tenant, named bool) {
	if t, ok := sc.Tenants[name]; ok {
		return t, true
	}
	return sc.DefaultTenant, false
}

// TenantKey is what the named tenant's limits and counts are kept under:
// its name when the configuration names it; gate.OverflowTenant, which
// every other tenant shares, otherwise.
func (sc *Scope) TenantKey(name string) string {
	if _, ok := sc.Tenants[name]; ok {
		return name
	}
	return gate.OverflowTenant
}

// Priority is the priority a call of tenant ranks at when it asks for p:
// p, clamped to the tenant's MaxPriority.
func (sc *Scope) Priority(tenant string, p int32) int32 {
	t, _ := sc.Tenant(tenant)
	return min(p, t.MaxPriority)
}

// TenantWeight is a tenant's weight in the fair share.
func (sc *Scope) TenantWeight(tenant string) int {
	t, _ := sc.Tenant(tenant)
	return t.Weight
}

// Source is one interchangeable endpoint of a scope, validated, with its
// effective breaker (the scope's, overridden key by key).
type Source struct {
	Name           string
	Priority       int
	Weight         int
	MaxConcurrency int
	RPM            int64
	TPM            int64
	Timeout        time.Duration
	Attributes     map[string]string
	Breaker        gate.BreakerPolicy
	// ProbeTTLDerived: Breaker.ProbeTTL was derived, not configured.
	ProbeTTLDerived bool
}

// Lease is how long a permit of this source holds its slot without an outcome.
func (s *Source) Lease(grace time.Duration) time.Duration { return s.Timeout + grace }

// Gate returns what the backends need to know of the source.
func (sc *Scope) Gate(i int) gate.Source {
	s := &sc.Sources[i]
	return gate.Source{
		Name:    s.Name,
		Limits:  gate.Limits{MaxConcurrency: s.MaxConcurrency, RPM: s.RPM, TPM: s.TPM, Lease: s.Lease(sc.LeaseGrace)},
		Breaker: s.Breaker,
	}
}

// Source returns the named source, or nil.
func (sc *Scope) Source(name string) *Source {
	for i := range sc.Sources {
		if sc.Sources[i].Name == name {
			return &sc.Sources[i]
		}
	}
	return nil
}

// ShadowScopes names the scopes in shadow mode, sorted.
func ShadowScopes(c *Config) []string {
	var names []string
	for name, sc := range c.Scopes {
		if sc.Mode == Shadow {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
