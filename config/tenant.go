package config

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// MinBudgetPer is the shortest token budget window: the window is counted
// in gate.BudgetBuckets slices, whole seconds each when it is whole minutes.
const MinBudgetPer = time.Minute

// resolveTenants validates a scope's tenants and default_tenant. A tenant
// the configuration names has no priority ceiling unless it sets one; the
// default tenant's is 0, so that a caller the configuration does not know
// cannot rank itself above others.
func resolveTenants(c *checker, key string, f *fileScope) (map[string]Tenant, Tenant) {
	if len(f.Tenants) > MaxTenants {
		c.fail(key+".tenants", len(f.Tenants), fmt.Sprintf("at most %d tenants", MaxTenants))
	}
	tenants := make(map[string]Tenant, len(f.Tenants))
	for _, name := range slices.Sorted(maps.Keys(f.Tenants)) {
		tkey := key + ".tenants." + name
		if !nameRE.MatchString(name) {
			c.fail(tkey, name, "a tenant "+nameAllowed[len("a "):])
			continue
		}
		ft := f.Tenants[name]
		tenants[name] = resolveTenant(c, tkey, &ft, math.MaxInt32)
	}
	def := fileTenant{}
	if f.DefaultTenant != nil {
		def = *f.DefaultTenant
	}
	switch {
	case f.DefaultTenantWeight != nil && def.Weight != nil:
		c.fail(key+".default_tenant_weight", *f.DefaultTenantWeight, "set default_tenant.weight or default_tenant_weight (its shorthand), not both")
	case f.DefaultTenantWeight != nil:
		// Checked under the key written; the entry then takes it in range,
		// so that it is reported once.
		w := *f.DefaultTenantWeight
		c.between(key+".default_tenant_weight", int64(w), 1, MaxTenantWeight)
		def.Weight = new(min(max(w, 1), MaxTenantWeight))
	}
	return tenants, resolveTenant(c, key+".default_tenant", &def, 0)
}

// resolveTenant validates one tenant's entry; maxPriority is its ceiling
// when the entry sets none.
func resolveTenant(c *checker, key string, f *fileTenant, maxPriority int64) Tenant {
	t := Tenant{
		Weight: or(f.Weight, DefaultTenantWeight), RPM: or(f.RPM, 0), TPM: or(f.TPM, 0),
		MaxConcurrency: or(f.MaxConcurrency, 0), MaxLiveCalls: or(f.MaxLiveCalls, 0),
	}
	c.between(key+".weight", int64(t.Weight), 1, MaxTenantWeight)
	p := or(f.MaxPriority, maxPriority)
	c.between(key+".max_priority", p, math.MinInt32, math.MaxInt32)
	t.MaxPriority = int32(min(max(p, math.MinInt32), math.MaxInt32))
	c.atLeast(key+".rpm", t.RPM, 0)
	c.atLeast(key+".tpm", t.TPM, 0)
	c.between(key+".max_concurrency", int64(t.MaxConcurrency), 0, MaxConcurrency)
	c.atLeast(key+".max_live_calls", int64(t.MaxLiveCalls), 0)
	if b := f.TokenBudget; b != nil {
		switch {
		case b.Tokens == nil:
			c.fail(key+".token_budget.tokens", nil, "a token budget needs tokens (at least 1) and per (a window of whole minutes)")
		case *b.Tokens < 1:
			c.fail(key+".token_budget.tokens", *b.Tokens, "must be at least 1; remove token_budget for no budget")
		default:
			t.Budget = *b.Tokens
		}
		switch {
		case b.Per == nil:
			c.fail(key+".token_budget.per", nil, "a token budget needs per, a window of whole minutes, e.g. 1h or 720h")
		case *b.Per%time.Minute != 0 || *b.Per < MinBudgetPer || *b.Per > MaxDuration:
			c.fail(key+".token_budget.per", *b.Per, "must be whole minutes from "+formatDuration(MinBudgetPer)+" to "+formatDuration(MaxDuration))
		default:
			t.BudgetPer = *b.Per
		}
	}
	return t
}

// resolveTenantTokens validates auth.tenant_tokens: each names a valid
// tenant and one token, inline or in a file; no token serves twice, nor as
// another role's.
func resolveTenantTokens(c *checker, fs []fileTenantToken, roles ...string) []TenantToken {
	var out []TenantToken
	seen := map[string]bool{}
	for _, role := range roles {
		if role != "" {
			seen[role] = true
		}
	}
	for i, f := range fs {
		key := fmt.Sprintf("auth.tenant_tokens[%d]", i)
		tt := TenantToken{Tenant: or(f.Tenant, ""), TokenFile: or(f.TokenFile, "")}
		if !nameRE.MatchString(tt.Tenant) {
			c.fail(key+".tenant", tt.Tenant, "a tenant "+nameAllowed[len("a "):])
		}
		switch {
		case f.Token == nil && f.TokenFile == nil:
			c.fail(key+".token", nil, "set token or token_file")
			continue
		case f.Token != nil && *f.Token == Redacted:
			c.fail(key+".token", Redacted, "--check prints this in place of a secret; write the secret here, or set token_file")
			continue
		}
		tt.Token = c.secret(key+".token", f.Token, f.TokenFile)
		if tt.Token == "" {
			continue
		}
		if seen[tt.Token] {
			c.fail(key+".token", "(same as another token)", "each tenant token must differ from auth.token, auth.operator_token and every other tenant token, or it could not name its tenant")
			continue
		}
		seen[tt.Token] = true
		out = append(out, tt)
	}
	return out
}

// effectiveTenant is t as a file writes it.
func effectiveTenant(t Tenant) fileTenant {
	p := int64(t.MaxPriority)
	f := fileTenant{Weight: &t.Weight, MaxPriority: &p, RPM: &t.RPM, TPM: &t.TPM, MaxConcurrency: &t.MaxConcurrency, MaxLiveCalls: &t.MaxLiveCalls}
	if t.Budget > 0 {
		f.TokenBudget = &fileTokenBudget{Tokens: &t.Budget, Per: &t.BudgetPer}
	}
	return f
}

// effectiveTenantTokens are the tenant tokens as a file writes them: each
// token read from a file as its path, one given inline Redacted.
func effectiveTenantTokens(ts []TenantToken) []fileTenantToken {
	out := []fileTenantToken{}
	for _, tt := range ts {
		f := fileTenantToken{Tenant: &tt.Tenant}
		f.Token, f.TokenFile = secretKeys(tt.Token, tt.TokenFile)
		out = append(out, f)
	}
	return out
}
