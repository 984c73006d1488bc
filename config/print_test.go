package config_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
)

// full sets every kind of key: durations that print in several units,
// enums, a unix socket's mode, tenants, attributes, a scope's breaker with
// a source's over it, and a redis section beside the memory backend.
const full = `
listen: unix:///tmp/polygate-print.sock
listen_mode: "0660"
metrics_listen: 127.0.0.1:9090
limits: {keepalive_min_time: 1m30s, max_connection_idle: 0s}
backend:
  kind: memory
  redis: {addrs: ["a:1", "b:2"], key_prefix: "team:", timeout: 1500ms}
telemetry: {path: /var/lib/polygate/t.db, retention: 720h}
log: {format: json, level: debug}
calls: {idle_timeout: 2h0m30s}
scopes:
  chat:
    mode: shadow
    circuit_open: wait
    source_dead: wait
    quota_full: fail_fast
    backoff: {base: 250ms, max: 90s}
    tenants: {search: 3, batch: 1, team: {weight: 2, max_priority: 5, rpm: 60, tpm: 9000, max_concurrency: 4, max_live_calls: 20, token_budget: {tokens: 100000, per: 24h}}}
    default_tenant: {rpm: 10, max_live_calls: 50}
    priority_aging: 2s
    breaker: {fail_rate: 0.1, cooldown: 10m, max_cooldown: 1h}
    sources:
      - {name: primary, rpm: 600, tpm: 100000, timeout: 45s, attributes: {model: large, version: 2}}
      - {name: backup, priority: 1, breaker: {cooldown: 30s, probe_ttl: 2m}}
  other:
    sources: [{name: only}]
`

// reparse is what --check printed of cfg, read back as a configuration file.
func reparse(t *testing.T, cfg *config.Config, output string, environ []string) (*config.Config, []byte) {
	t.Helper()
	var out bytes.Buffer
	if err := config.Print(&out, cfg, output); err != nil {
		t.Fatal(err)
	}
	again, err := config.Parse(out.Bytes(), environ)
	if err != nil {
		t.Fatalf("what Print wrote does not parse: %v\n%s", err, out.String())
	}
	return again, out.Bytes()
}

// TestPrintGivesTheSameConfiguration: what Print writes, read back, is the
// same configuration (a derived probe_ttl comes back as set), and Print
// writes it again byte for byte.
func TestPrintGivesTheSameConfiguration(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml    string
		environ []string
	}{
		"demo":                         {yaml: string(config.Demo())},
		"defaults":                     {yaml: base},
		"every kind":                   {yaml: full},
		"environment":                  {yaml: base, environ: []string{"POLYGATE_SCOPES__CHAT__SOURCES__BACKUP__RPM=120", "POLYGATE_BACKEND__REDIS__ADDRS=a:1,b:2"}},
		"a token from the environment": {yaml: base, environ: []string{"POLYGATE_AUTH__TOKEN=s3cret"}},
	} {
		for _, output := range config.Outputs {
			t.Run(name+"/"+output, func(t *testing.T) {
				cfg, err := config.Parse([]byte(tc.yaml), tc.environ)
				if err != nil {
					t.Fatal(err)
				}
				again, printed := reparse(t, cfg, output, tc.environ)
				canonical(cfg)
				canonical(again)
				if !reflect.DeepEqual(cfg, again) {
					t.Fatalf("read back, the configuration differs:\n%+v\n%+v\nprinted:\n%s", cfg, again, printed)
				}
				if _, twice := reparse(t, again, output, tc.environ); !bytes.Equal(printed, twice) {
					t.Fatalf("printed again, the document differs:\n%s\n---\n%s", printed, twice)
				}
			})
		}
	}
}

// canonical makes what reads back differently but means the same equal: an
// absent list or map and an empty one, a derived probe_ttl and one set.
func canonical(c *config.Config) {
	if c.Backend.Redis.Addrs == nil {
		c.Backend.Redis.Addrs = []string{}
	}
	for _, sc := range c.Scopes {
		if sc.Tenants == nil {
			sc.Tenants = map[string]config.Tenant{}
		}
		for i := range sc.Sources {
			s := &sc.Sources[i]
			s.ProbeTTLDerived = false
			if s.Attributes == nil {
				s.Attributes = map[string]string{}
			}
		}
	}
}

// TestPrintSpeaksTheFilesWords: the keys are the file's, enums its lower-case
// words, durations as a file writes them; defaults and derived values are
// filled in (a source's inherited breaker keys, probe_ttl); no runtime state.
func TestPrintSpeaksTheFilesWords(t *testing.T) {
	cfg, err := config.Parse([]byte(full), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := config.Print(&out, cfg, "yaml"); err != nil {
		t.Fatal(err)
	}
	doc := out.String()
	for _, want := range []string{
		`listen_mode: "0660"`, "mode: shadow", "circuit_open: wait", "quota_full: fail_fast", "on_unavailable: fail_closed",
		"keepalive_min_time: 1m30s", "max_connection_idle: 0s", "timeout: 1.5s", "retention: 720h", "idle_timeout: 2h30s",
		"base: 250ms", "max: 1m30s", "key_prefix: 'team:'",
		// primary inherits the scope's breaker, with probe_ttl derived:
		// max(2 × 300s, 10m, 45s + 5s) = 10m.
		"fail_rate: 0.1\n          window: 1m\n          cooldown: 10m\n          max_cooldown: 1h\n          probe_ttl: 10m",
		// backup overrides two keys.
		"cooldown: 30s\n          max_cooldown: 1h\n          probe_ttl: 2m",
		"tenants:\n      batch:\n        weight: 1\n        max_priority: 2147483647", "search:\n        weight: 3",
		"default_tenant:\n      weight: 1\n      max_priority: 0", `version: "2"`, "max_concurrency: 8", "tpm: 0",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("--check lacks %q:\n%s", want, doc)
		}
	}
	for _, state := range []string{"state:", "epoch", "ON_REFUSAL", "derived", "0m0s"} {
		if strings.Contains(doc, state) {
			t.Errorf("--check shows %q:\n%s", state, doc)
		}
	}
}

// TestPrintRedactsSecrets: a secret given inline prints as config.Redacted,
// which the loader refuses, naming the key and what to write instead; a
// token read from a file prints as its file's path.
func TestPrintRedactsSecrets(t *testing.T) {
	file := filepath.Join(t.TempDir(), "operator")
	if err := os.WriteFile(file, []byte("operator-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := "auth: {token: app-s3cret, operator_token_file: " + file + "}\n" +
		"backend: {kind: redis, redis: {addrs: ['a:1'], password: redis-s3cret}}\n" + base
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := config.Print(&out, cfg, "yaml"); err != nil {
		t.Fatal(err)
	}
	doc := out.String()
	for _, want := range []string{"token: (redacted)\n  token_file: null", "operator_token: null\n  operator_token_file: " + file, "password: (redacted)"} {
		if !strings.Contains(doc, want) {
			t.Errorf("--check lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "s3cret") {
		t.Fatalf("--check shows a secret:\n%s", doc)
	}
	_, err = config.Parse(out.Bytes(), nil)
	for _, key := range []string{"auth.token", "backend.redis.password"} {
		var fe *config.FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), key+`: "(redacted)" is not allowed; --check prints this in place of a secret`) {
			t.Errorf("read back: %v; want %s refused as the placeholder", err, key)
		}
	}
	// The secrets given back (here by the environment) make it whole again.
	if _, err := config.Parse(out.Bytes(), []string{"POLYGATE_AUTH__TOKEN=x", "POLYGATE_BACKEND__REDIS__PASSWORD=y"}); err != nil {
		t.Errorf("with the secrets in the environment: %v", err)
	}
}

func TestFormatDuration(t *testing.T) {
	cfg, err := config.Parse([]byte(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	for d, want := range map[time.Duration]string{
		0: "0s", 200 * time.Millisecond: "200ms", 1500 * time.Millisecond: "1.5s", 90 * time.Second: "1m30s",
		10 * time.Minute: "10m", time.Hour: "1h", time.Hour + 30*time.Second: "1h30s", 720 * time.Hour: "720h",
		time.Hour + 5*time.Minute: "1h5m", 61*time.Minute + 500*time.Millisecond: "1h1m0.5s",
	} {
		cfg.Calls.IdleTimeout = d
		var out bytes.Buffer
		if err := config.Print(&out, cfg, "yaml"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "idle_timeout: "+want+"\n") {
			t.Errorf("%v printed as %s, want %s", d, out.String()[strings.Index(out.String(), "idle_timeout"):][:30], want)
		}
		if p, err := time.ParseDuration(want); err != nil || p != d {
			t.Errorf("%s reads back as %v (%v), want %v", want, p, err, d)
		}
	}
}
