package gate

import (
	"math"
	"time"
)

// A tenant's limits hold per scope, across all its sources: the backend
// keeps one Tenant per tenant of a scope that has limits, beside the
// sources, and Admit asks it before the walk, Settle settles it with the
// source's permit, Peek reads it. Tenants not named in the configuration
// share one Tenant, OverflowTenant's, so a caller cannot escape a limit by
// naming a new tenant and the backend's memory stays bounded.

// TenantLimits are one tenant's limits in a scope; a zero field is no
// limit.
type TenantLimits struct {
	// MaxConcurrency is the tenant's attempts out at once, over all sources.
	MaxConcurrency int
	// RPM and TPM limit requests and tokens over a sliding minute.
	RPM int64
	TPM int64
	// Budget is the tokens the tenant may spend over BudgetWindow, counted
	// in BudgetBuckets slices of it (see Budget).
	Budget       int64
	BudgetWindow time.Duration
}

// Limited reports whether l limits anything (else the backend keeps no
// state for the tenant).
func (l TenantLimits) Limited() bool {
	return l.MaxConcurrency > 0 || l.RPM > 0 || l.TPM > 0 || l.Budget > 0
}

// unlimited stands for "no concurrency limit" in the quota's rule: 2^53,
// exact in Lua's doubles.
const unlimited = 1 << 53

// quota is l as a quota's limits, with the lease of the permit at hand.
func (l TenantLimits) quota(lease time.Duration) Limits {
	c := l.MaxConcurrency
	if c <= 0 {
		c = unlimited
	}
	return Limits{MaxConcurrency: c, RPM: l.RPM, TPM: l.TPM, Lease: lease}
}

// TenantCall is a call's tenant and its limits, as Admit, Settle and Peek
// take it.
type TenantCall struct {
	// Name keys the tenant's state in the scope: a configured tenant's name,
	// or OverflowTenant for every tenant the configuration does not name.
	Name   string
	Limits TenantLimits
}

// Tenant is one tenant's use of a scope. Its Quota holds the tenant's
// permits (each under its source's lease) and the sliding minute of its
// admissions, with the same rules as a source's; its Budget the tokens of
// the budget's window. The zero value is an idle tenant.
type Tenant struct {
	Quota  Quota
	Budget Budget
}

// Verdict is why an attempt of tokens by the tenant cannot start now
// (ReasonNone if it can), with the time until the earliest certain retry
// (ms): a spent budget first (ReasonTenantBudget), then the quota
// (ReasonTenantLimit; 0 when a slot may free at any moment).
func (t *Tenant) Verdict(l TenantLimits, tokens, now int64) (Reason, int64) {
	if wait, ok := t.Budget.check(l, tokens, now); !ok {
		return ReasonTenantBudget, wait
	}
	q := l.quota(0)
	if reason, wait := t.Quota.check(q, q.MaxConcurrency, tokens, now); reason != ReasonNone {
		return ReasonTenantLimit, wait
	}
	return ReasonNone, 0
}

// Take counts a granted permit of tokens, holding its slot for lease.
func (t *Tenant) Take(l TenantLimits, permit string, tokens int64, lease time.Duration, now int64) {
	t.Quota.take(l.quota(lease), permit, tokens, now)
	t.Budget.take(l, permit, tokens, now+lease.Milliseconds(), now)
}

// Release frees the permit's slot and settles its tokens to actual
// (actual < 0 keeps the estimate), in the minute and in the budget.
func (t *Tenant) Release(permit string, actual, now int64) {
	t.Quota.release(permit, actual, now)
	t.Budget.release(permit, actual, now)
}

// Idle reports whether the tenant holds nothing at now: no permit, no
// admission in the minute, nothing spent in the budget's window. An idle
// tenant's state can be dropped.
func (t *Tenant) Idle(l TenantLimits, now int64) bool {
	v := t.Quota.view(now)
	return v.InFlight == 0 && v.Requests == 0 && t.Budget.used(l, now) == 0
}

// View reads the tenant at now.
func (t *Tenant) View(tc TenantCall, tokens, now int64) TenantView {
	reason, wait := t.Verdict(tc.Limits, tokens, now)
	return TenantView{
		Tenant: tc.Name, Quota: t.Quota.view(now), BudgetUsed: t.Budget.used(tc.Limits, now),
		Verdict: Rejection{Reason: reason, RetryAfter: Millis(wait)},
	}
}

// TenantView is a read of one tenant of a scope.
type TenantView struct {
	Tenant string
	// Quota is the tenant's permits out now and its admissions and tokens
	// over the sliding minute (counted when it has an rpm or tpm).
	Quota QuotaView
	// BudgetUsed is the tokens spent in the budget's window (0 without a
	// budget).
	BudgetUsed int64
	// Verdict is what Admit would answer the tenant now for an attempt of
	// the Peek's tokens: ReasonNone, ReasonTenantLimit or ReasonTenantBudget
	// (Source is empty).
	Verdict Rejection
}

// BudgetBuckets is the number of slices a token budget's window is counted
// in: a spend counts for between 59/60 and 60/60 of the window, and the
// memory of a budget is these buckets whatever the traffic.
const BudgetBuckets = 60

// Spend is one slice of a budget's window.
type Spend struct {
	Index  int64 // now / width of the slice it counts
	Tokens int64
}

// Budget is the state of one tenant's token budget: the tokens spent in
// each slice of the window, and the permits out with the slice their
// estimate was charged to, so that their actual tokens settle it. The zero
// value is an unspent budget.
type Budget struct {
	// Width is the slice width (ms) the buckets were counted with.
	Width   int64
	Buckets [BudgetBuckets]Spend
	held    map[string]budgetHold
	soonest int64 // at most the earliest until in held
}

// budgetHold is a permit's charge, settled by its outcome until its lease
// ends (after that its estimate stays charged).
type budgetHold struct {
	index, tokens, until int64
}

func budgetWidth(l TenantLimits) int64 {
	return max(l.BudgetWindow.Milliseconds()/BudgetBuckets, 1)
}

// current makes the buckets count slices of l's width, starting over when
// the window was reconfigured, and returns the width.
func (b *Budget) current(l TenantLimits) int64 {
	w := budgetWidth(l)
	if b.Width != w {
		b.Buckets = [BudgetBuckets]Spend{}
		clear(b.held)
		b.Width = w
	}
	return w
}

// used is the tokens spent in the window at now.
func (b *Budget) used(l TenantLimits, now int64) int64 {
	if l.Budget <= 0 || b.Width != budgetWidth(l) {
		return 0
	}
	idx := now / b.Width
	var sum int64
	for _, s := range b.Buckets {
		if s.Index > idx-BudgetBuckets && s.Index <= idx {
			sum = addTokens(sum, s.Tokens)
		}
	}
	return sum
}

// check reports whether an attempt of tokens fits the budget at now, and
// when it does not, the time (ms) until enough of the window's oldest
// slices leave it: a slice of index k counts until (k + BudgetBuckets) ×
// width. An attempt larger than the whole budget never fits (wait 0).
func (b *Budget) check(l TenantLimits, tokens, now int64) (wait int64, ok bool) {
	if l.Budget <= 0 {
		return 0, true
	}
	used := b.used(l, now) // 0 while the buckets count another width
	if addTokens(used, tokens) <= l.Budget {
		return 0, true
	}
	if tokens > l.Budget {
		return 0, false
	}
	excess := addTokens(used, tokens) - l.Budget
	w := b.Width
	idx := now / w
	for k := idx - BudgetBuckets + 1; k <= idx; k++ {
		if s := b.Buckets[slot(k)]; s.Index == k {
			if excess -= s.Tokens; excess <= 0 {
				return (k+BudgetBuckets)*w - now, false
			}
		}
	}
	return 0, false
}

// take charges tokens to the slice of now, for permit until its lease ends.
func (b *Budget) take(l TenantLimits, permit string, tokens, until, now int64) {
	if l.Budget <= 0 {
		return
	}
	b.expire(now)
	w := b.current(l)
	idx := now / w
	s := &b.Buckets[slot(idx)]
	if s.Index != idx {
		*s = Spend{Index: idx}
	}
	tokens = addTokens(0, tokens)
	s.Tokens = addTokens(s.Tokens, tokens)
	if b.held == nil {
		b.held = make(map[string]budgetHold)
	}
	if len(b.held) == 0 || until < b.soonest {
		b.soonest = until
	}
	b.held[permit] = budgetHold{index: idx, tokens: tokens, until: until}
}

// release settles the permit's charge to actual tokens (actual < 0 keeps
// the estimate), while its slice is still counted.
func (b *Budget) release(permit string, actual, now int64) {
	b.expire(now)
	h, ok := b.held[permit]
	if !ok {
		return
	}
	delete(b.held, permit)
	if actual < 0 {
		return
	}
	if s := &b.Buckets[slot(h.index)]; s.Index == h.index {
		s.Tokens = addTokens(s.Tokens, addTokens(0, actual)-h.tokens)
	}
}

// slot is the bucket that slice k is counted in.
func slot(k int64) int64 { return (k%BudgetBuckets + BudgetBuckets) % BudgetBuckets }

// expire forgets the charges of permits whose lease ended.
func (b *Budget) expire(now int64) {
	if len(b.held) == 0 || now < b.soonest {
		return
	}
	b.soonest = math.MaxInt64
	for id, h := range b.held {
		if now >= h.until {
			delete(b.held, id)
		} else {
			b.soonest = min(b.soonest, h.until)
		}
	}
}
