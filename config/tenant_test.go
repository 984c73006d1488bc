package config_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// TestTenantEntries: a tenant is its weight (the shorthand) or a mapping of
// its keys; a named tenant has no priority ceiling unless it sets one, the
// default tenant's is 0; default_tenant_weight is default_tenant.weight.
func TestTenantEntries(t *testing.T) {
	cfg, err := config.Parse([]byte(`
scopes:
  chat:
    tenants:
      gold: 4
      team: {rpm: 3, tpm: 9000, max_concurrency: 2, max_live_calls: 20, max_priority: 5, token_budget: {tokens: 1000, per: 1h}}
    default_tenant_weight: 2
    default_tenant: {max_live_calls: 7}
    sources: [{name: a}]
`), []string{"POLYGATE_SCOPES__CHAT__TENANTS__GOLD=6"})
	if err != nil {
		t.Fatal(err)
	}
	sc := cfg.Scopes["chat"]
	want := map[string]config.Tenant{
		"gold": {Weight: 6, MaxPriority: math.MaxInt32},
		"team": {Weight: 1, MaxPriority: 5, RPM: 3, TPM: 9000, MaxConcurrency: 2, MaxLiveCalls: 20, Budget: 1000, BudgetPer: time.Hour},
	}
	for name, w := range want {
		if got, named := sc.Tenant(name); got != w || !named {
			t.Errorf("tenant %s = %+v (named %v), want %+v", name, got, named, w)
		}
	}
	if got, named := sc.Tenant("anyone"); got != (config.Tenant{Weight: 2, MaxLiveCalls: 7}) || named {
		t.Errorf("a tenant not named = %+v (named %v), want the default tenant", got, named)
	}
	if sc.TenantKey("team") != "team" || sc.TenantKey("anyone") != gate.OverflowTenant || sc.TenantKey("") != gate.OverflowTenant {
		t.Errorf("keys: %q %q %q", sc.TenantKey("team"), sc.TenantKey("anyone"), sc.TenantKey(""))
	}
	if l := want["team"].Limits(); l != (gate.TenantLimits{MaxConcurrency: 2, RPM: 3, TPM: 9000, Budget: 1000, BudgetWindow: time.Hour}) {
		t.Errorf("team's limits %+v", l)
	}
}

// TestTenantTokens: a tenant token is given inline or in a file; --check
// prints the inline one redacted and the file's as its path, and nothing
// of either token.
func TestTenantTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "team-b")
	if err := os.WriteFile(file, []byte("b-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(`
auth:
  token: app-s3cret
  tenant_tokens:
    - {tenant: team-a, token: a-s3cret}
    - {tenant: team-b, token_file: `+file+`}
`+base), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.TenantToken{{Tenant: "team-a", Token: "a-s3cret"}, {Tenant: "team-b", Token: "b-s3cret", TokenFile: file}}
	if got := cfg.Auth.TenantTokens; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("tenant tokens %+v, want %+v", got, want)
	}
	var out bytes.Buffer
	if err := config.Print(&out, cfg, "yaml"); err != nil {
		t.Fatal(err)
	}
	doc := out.String()
	if strings.Contains(doc, "s3cret") {
		t.Fatalf("--check shows a secret:\n%s", doc)
	}
	for _, w := range []string{"- tenant: team-a\n      token: (redacted)\n      token_file: null", "- tenant: team-b\n      token: null\n      token_file: " + file} {
		if !strings.Contains(doc, w) {
			t.Errorf("--check lacks %q:\n%s", w, doc)
		}
	}
}
