package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
)

const base = `
scopes:
  chat:
    sources:
      - name: primary
      - name: backup
        priority: 1
`

func TestDemoIsValid(t *testing.T) {
	cfg, err := config.Load(config.Options{}, nil)
	if err != nil {
		t.Fatalf("embedded demo: %v", err)
	}
	if cfg.Listen != config.DefaultListen || cfg.Backend.Kind != "memory" || cfg.Scopes["demo"] == nil {
		t.Fatalf("demo config %+v", cfg)
	}
}

func TestDefaultsAndDerivedValues(t *testing.T) {
	cfg, err := config.Parse([]byte(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.FirstMessageTimeout != 10*time.Second {
		t.Fatalf("limits.first_message_timeout %v, want 10s", cfg.Limits.FirstMessageTimeout)
	}
	s := cfg.Scopes["chat"]
	if s.CircuitOpen != config.FailFast || s.QuotaFull != config.Wait || s.MaxAttempts != 3 ||
		s.StallWindow != 300*time.Second || s.PollInterval != 50*time.Millisecond {
		t.Fatalf("scope defaults %+v", s)
	}
	if s.Mode != config.Enforce || s.DefaultTenant != (config.Tenant{Weight: 1}) || s.MaxTenants != 64 || s.PriorityAging != 0 || s.TenantWeight("x") != 1 {
		t.Fatalf("admission defaults %+v", s)
	}
	p := s.Sources[0]
	if p.Weight != 1 || p.MaxConcurrency != 8 || p.Timeout != 300*time.Second || p.Breaker.FailThreshold != 5 ||
		p.Breaker.MinCalls != 10 || p.Breaker.FailRate != 0.5 || p.Breaker.Cooldown != 60*time.Second {
		t.Fatalf("source defaults %+v", p)
	}
	// probe_ttl = max(2 × slowest timeout, cooldown, timeout + 5s) = 600s.
	if p.Breaker.ProbeTTL != 600*time.Second || !p.ProbeTTLDerived {
		t.Fatalf("derived probe_ttl %v (derived %v)", p.Breaker.ProbeTTL, p.ProbeTTLDerived)
	}
}

// backend.redis.batch_linger is 2ms unless set; 0 turns it off.
func TestRedisBatchLinger(t *testing.T) {
	for yaml, want := range map[string]time.Duration{
		"backend: {kind: redis, redis: {addrs: ['a:1']}}":                    2 * time.Millisecond,
		"backend: {kind: redis, redis: {addrs: ['a:1'], batch_linger: 0s}}":  0,
		"backend: {kind: redis, redis: {addrs: ['a:1'], batch_linger: 5ms}}": 5 * time.Millisecond,
		"backend: {kind: redis, redis: {addrs: ['a:1'], timeout: 1ms}}":      2 * time.Millisecond, // (never longer than a call: no bound by timeout)
	} {
		cfg, err := config.Parse([]byte(base+yaml), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Backend.Redis.BatchLinger; got != want {
			t.Errorf("%s: batch_linger %v, want %v", yaml, got, want)
		}
	}
}

func TestMemoryStatePath(t *testing.T) {
	cfg, err := config.Parse([]byte(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Backend.Memory.StatePath != "" {
		t.Fatalf("state_path defaults to %q, want empty (off)", cfg.Backend.Memory.StatePath)
	}
	cfg, err = config.Parse([]byte(base), []string{"POLYGATE_BACKEND__MEMORY__STATE_PATH=/var/lib/polygate/state.json"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Backend.Memory.StatePath != "/var/lib/polygate/state.json" {
		t.Fatalf("state_path from the environment = %q", cfg.Backend.Memory.StatePath)
	}
}

func TestSourceBreakerOverridesKeyByKey(t *testing.T) {
	cfg, err := config.Parse([]byte(`
scopes:
  chat:
    breaker: {fail_threshold: 7, cooldown: 30s}
    sources:
      - {name: a, breaker: {cooldown: 5s, probe_ttl: 20s}}
      - {name: b}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Scopes["chat"].Sources[0].Breaker, cfg.Scopes["chat"].Sources[1].Breaker
	if a.FailThreshold != 7 || a.Cooldown != 5*time.Second || a.ProbeTTL != 20*time.Second {
		t.Fatalf("a %+v", a)
	}
	if b.FailThreshold != 7 || b.Cooldown != 30*time.Second || b.ProbeTTL != 600*time.Second {
		t.Fatalf("b %+v", b)
	}
}

// Every bad value of every key is refused with an error naming the key, the
// value and what is allowed.
func TestBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, key, allowed string
	}{
		{"listen", "listen: nowhere", "listen", "host:port"},
		{"listen unix without path", "listen: 'unix://'", "listen", "unix socket needs a path"},
		{"metrics_listen", "metrics_listen: x", "metrics_listen", "host:port"},
		{"backend.kind", "backend: {kind: etcd}", "backend.kind", "memory, redis"},
		{"redis addrs", "backend: {kind: redis}", "backend.redis.addrs", "at least one"},
		{"redis addr", "backend: {kind: redis, redis: {addrs: [nohost]}}", "backend.redis.addrs[0]", "host:port"},
		{"redis timeout", "backend: {kind: redis, redis: {addrs: ['a:1'], timeout: 0s}}", "backend.redis.timeout", "at least 1ms"},
		{"redis on_unavailable", "backend: {kind: redis, redis: {addrs: ['a:1'], on_unavailable: open}}", "backend.redis.on_unavailable", "fail_closed, local"},
		{"redis replicas", "backend: {kind: redis, redis: {addrs: ['a:1'], replicas: 0}}", "backend.redis.replicas", "at least 1"},
		{"redis pool size", "backend: {kind: redis, redis: {addrs: ['a:1'], pool_size: 10001}}", "backend.redis.pool_size", "must be from 0 to 10000"},
		{"redis db", "backend: {kind: redis, redis: {addrs: ['a:1'], db: -1}}", "backend.redis.db", "at least 0"},
		{"redis batch_linger", "backend: {kind: redis, redis: {addrs: ['a:1'], batch_linger: 101ms}}", "backend.redis.batch_linger", "must be whole milliseconds from 0 (off) to 100ms"},
		{"redis batch_linger negative", "backend: {kind: redis, redis: {addrs: ['a:1'], batch_linger: -1ms}}", "backend.redis.batch_linger", "must be whole milliseconds from 0 (off) to 100ms"},
		{"redis batch_linger not whole ms", "backend: {kind: redis, redis: {addrs: ['a:1'], batch_linger: 1500us}}", "backend.redis.batch_linger", "must be whole milliseconds from 0 (off) to 100ms"},
		{"log.format", "log: {format: xml}", "log.format", "text, json"},
		{"log.level", "log: {level: loud}", "log.level", "debug, info, warn, error"},
		{"calls.max_live", "calls: {max_live: 0}", "calls.max_live", "at least 1"},
		{"calls.idle_timeout", "calls: {idle_timeout: 10ms}", "calls.idle_timeout", "at least 1s"},
		{"calls.idle_timeout below a lease", "calls: {idle_timeout: 1m}\nscopes: {chat: {sources: [{name: a, timeout: 5m}]}}", "calls.idle_timeout", "longer than the longest permit lease (scopes.chat.sources.a: timeout + lease_grace = 5m5s)"},
		{"telemetry.retention", "telemetry: {retention: 1s}", "telemetry.retention", "at least 1m"},
		{"first_message_timeout too short", "limits: {first_message_timeout: 10ms}", "limits.first_message_timeout", "at least 100ms"},
		{"first_message_timeout too long", "limits: {first_message_timeout: 11m}", "limits.first_message_timeout", "at most 10m"},
		{"state_path blank", "backend: {memory: {state_path: '  '}}", "backend.memory.state_path", "must not be blank"},
		{"state_path directory", "backend: {memory: {state_path: /var/lib/polygate/}}", "backend.memory.state_path", "not a directory"},
		{"state_path with redis", "backend: {kind: redis, redis: {addrs: ['127.0.0.1:6379']}, memory: {state_path: /x.json}}", "backend.memory.state_path", "only the memory backend"},
		{"telemetry.path blank", "telemetry: {path: '  '}", "telemetry.path", "must not be blank"},
		{"telemetry.path query", "telemetry: {path: '/var/x.db?mode=ro'}", "telemetry.path", "without '?'"},
		{"telemetry.queue_size", "telemetry: {queue_size: 0}", "telemetry.queue_size", "at least 1"},
		{"events.watch_buffer", "events: {watch_buffer: 0}", "events.watch_buffer", "at least 1"},
		{"scope name", "scopes: {Chat: {sources: [{name: a}]}}", "scopes.Chat", "lowercase"},
		{"circuit_open", "scopes: {chat: {circuit_open: maybe, sources: [{name: a}]}}", "scopes.chat.circuit_open", "fail_fast, wait"},
		{"source_dead", "scopes: {chat: {source_dead: later, sources: [{name: a}]}}", "scopes.chat.source_dead", "fail_fast, wait"},
		{"quota_full", "scopes: {chat: {quota_full: never, sources: [{name: a}]}}", "scopes.chat.quota_full", "wait, fail_fast"},
		{"max_attempts", "scopes: {chat: {max_attempts: 0, sources: [{name: a}]}}", "scopes.chat.max_attempts", "at least 1"},
		{"backoff.base", "scopes: {chat: {backoff: {base: 0s}, sources: [{name: a}]}}", "scopes.chat.backoff.base", "at least 1ms"},
		{"backoff.max below base", "scopes: {chat: {backoff: {base: 2s, max: 1s}, sources: [{name: a}]}}", "scopes.chat.backoff.max", "at least backoff.base"},
		{"stall_window", "scopes: {chat: {backpressure: {stall_window: 0s}, sources: [{name: a}]}}", "scopes.chat.backpressure.stall_window", "at least 1ms"},
		{"poll_interval", "scopes: {chat: {backpressure: {poll_interval: 1500us}, sources: [{name: a}]}}", "scopes.chat.backpressure.poll_interval", "whole milliseconds"},
		{"poll above stall", "scopes: {chat: {backpressure: {stall_window: 1s, poll_interval: 2s}, sources: [{name: a}]}}", "scopes.chat.backpressure.poll_interval", "at most stall_window"},
		{"mode", "scopes: {chat: {mode: dry, sources: [{name: a}]}}", "scopes.chat.mode", "enforce, shadow"},
		{"tenant weight", "scopes: {chat: {tenants: {search: 0}, sources: [{name: a}]}}", "scopes.chat.tenants.search.weight", "from 1 to 1000"},
		{"tenant name", "scopes: {chat: {tenants: {Search: 2}, sources: [{name: a}]}}", "scopes.chat.tenants.Search", "lowercase"},
		{"default_tenant_weight", "scopes: {chat: {default_tenant_weight: 0, sources: [{name: a}]}}", "scopes.chat.default_tenant_weight", "from 1 to 1000"},
		{"max_tenants", "scopes: {chat: {max_tenants: 5000, sources: [{name: a}]}}", "scopes.chat.max_tenants", "from 1 to 1024"},
		{"both default weights", "scopes: {chat: {default_tenant_weight: 2, default_tenant: {weight: 3}, sources: [{name: a}]}}", "scopes.chat.default_tenant_weight", "not both"},
		{"max_priority", "scopes: {chat: {tenants: {gold: {max_priority: 3000000000}}, sources: [{name: a}]}}", "scopes.chat.tenants.gold.max_priority", "from -2147483648 to 2147483647"},
		{"tenant rpm", "scopes: {chat: {tenants: {gold: {rpm: -1}}, sources: [{name: a}]}}", "scopes.chat.tenants.gold.rpm", "at least 0"},
		{"default tenant live calls", "scopes: {chat: {default_tenant: {max_live_calls: -1}, sources: [{name: a}]}}", "scopes.chat.default_tenant.max_live_calls", "at least 0"},
		{"budget without per", "scopes: {chat: {tenants: {gold: {token_budget: {tokens: 5}}}, sources: [{name: a}]}}", "scopes.chat.tenants.gold.token_budget.per", "whole minutes"},
		{"budget per", "scopes: {chat: {tenants: {gold: {token_budget: {tokens: 5, per: 90s}}}, sources: [{name: a}]}}", "scopes.chat.tenants.gold.token_budget.per", "whole minutes from 1m"},
		{"budget tokens", "scopes: {chat: {tenants: {gold: {token_budget: {tokens: 0, per: 1h}}}, sources: [{name: a}]}}", "scopes.chat.tenants.gold.token_budget.tokens", "at least 1"},
		{"tenant token tenant", "auth: {tenant_tokens: [{tenant: 'Team A', token: x}]}", "auth.tenant_tokens[0].tenant", "lowercase"},
		{"tenant token missing", "auth: {tenant_tokens: [{tenant: a}]}", "auth.tenant_tokens[0].token", "token or token_file"},
		{"tenant token twice", "auth: {token: same, tenant_tokens: [{tenant: a, token: same}]}", "auth.tenant_tokens[0].token", "must differ"},
		{"tenant token redacted", "auth: {tenant_tokens: [{tenant: a, token: '(redacted)'}]}", "auth.tenant_tokens[0].token", "set token_file"},
		{"tenant_from", "tls: {tenant_from: san}", "tls.tenant_from", "uri_san, common_name"},
		{"tenant_from without mTLS", "tls: {tenant_from: common_name}", "tls.tenant_from", "needs tls.client_ca_file"},
		{"priority_aging", "scopes: {chat: {priority_aging: -1s, sources: [{name: a}]}}", "scopes.chat.priority_aging", "at least 1ms"},
		{"lease_grace", "scopes: {chat: {lease_grace: -1s, sources: [{name: a}]}}", "scopes.chat.lease_grace", "at least 0s"},
		{"fail_threshold", "scopes: {chat: {breaker: {fail_threshold: 0}, sources: [{name: a}]}}", "scopes.chat.breaker.fail_threshold", "at least 1"},
		{"min_calls", "scopes: {chat: {breaker: {min_calls: 0}, sources: [{name: a}]}}", "scopes.chat.breaker.min_calls", "at least 1"},
		{"fail_rate zero", "scopes: {chat: {breaker: {fail_rate: 0}, sources: [{name: a}]}}", "scopes.chat.breaker.fail_rate", "(0, 1]"},
		{"fail_rate above one", "scopes: {chat: {breaker: {fail_rate: 1.5}, sources: [{name: a}]}}", "scopes.chat.breaker.fail_rate", "(0, 1]"},
		{"window", "scopes: {chat: {breaker: {window: 5ms}, sources: [{name: a}]}}", "scopes.chat.breaker.window", "at least 10ms"},
		{"cooldown", "scopes: {chat: {breaker: {cooldown: 0s}, sources: [{name: a}]}}", "scopes.chat.breaker.cooldown", "at least 1ms"},
		{"max_cooldown", "scopes: {chat: {breaker: {cooldown: 60s, max_cooldown: 30s}, sources: [{name: a}]}}", "scopes.chat.breaker.max_cooldown", "at least cooldown"},
		{"probe_ttl", "scopes: {chat: {breaker: {probe_ttl: 0s}, sources: [{name: a}]}}", "scopes.chat.breaker.probe_ttl", "at least 1ms"},
		{"source breaker key named", "scopes: {chat: {sources: [{name: a, breaker: {fail_rate: 2}}]}}", "scopes.chat.sources.a.breaker.fail_rate", "(0, 1]"},
		{"no sources", "scopes: {chat: {}}", "scopes.chat.sources", "at least one source"},
		{"source name", "scopes: {chat: {sources: [{name: 'A b'}]}}", "scopes.chat.sources[0].name", "lowercase"},
		{"duplicate source", "scopes: {chat: {sources: [{name: a}, {name: a}]}}", "scopes.chat.sources[1].name", "unique"},
		{"priority", "scopes: {chat: {sources: [{name: a, priority: -1}]}}", "scopes.chat.sources.a.priority", "at least 0"},
		{"weight", "scopes: {chat: {sources: [{name: a, weight: 0}]}}", "scopes.chat.sources.a.weight", "at least 1"},
		{"max_concurrency", "scopes: {chat: {sources: [{name: a, max_concurrency: 0}]}}", "scopes.chat.sources.a.max_concurrency", "from 1 to 9007199254740992"},
		{"rpm", "scopes: {chat: {sources: [{name: a, rpm: -5}]}}", "scopes.chat.sources.a.rpm", "at least 0"},
		{"tpm", "scopes: {chat: {sources: [{name: a, tpm: -5}]}}", "scopes.chat.sources.a.tpm", "at least 0"},
		{"timeout", "scopes: {chat: {sources: [{name: a, timeout: 0s}]}}", "scopes.chat.sources.a.timeout", "at least 1ms"},
		// A lease is timeout + lease_grace: unbounded, the two overflowed into
		// a negative lease that freed every slot at once.
		{"timeout above a year", "scopes: {chat: {sources: [{name: a, timeout: 2000000h}]}}", "scopes.chat.sources.a.timeout", "at most 8760h (365 days)"},
		{"lease_grace above a year", "scopes: {chat: {lease_grace: 2000000h, sources: [{name: a}]}}", "scopes.chat.lease_grace", "at most 8760h (365 days)"},
		{"cooldown above a year", "scopes: {chat: {breaker: {cooldown: 8761h, max_cooldown: 9000h}, sources: [{name: a}]}}", "scopes.chat.breaker.cooldown", "at most 8760h (365 days)"},
		{"idle_timeout above a year", "calls: {idle_timeout: 8761h}", "calls.idle_timeout", "at most 8760h (365 days)"},
		{"no scopes", "scopes: {}", "scopes", "at least one scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := tc.yaml
			if !strings.Contains(y, "scopes") {
				y += "\n" + base
			}
			_, err := config.Parse([]byte(y), nil)
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v, want a FieldError", err)
			}
			if fe.Key != tc.key || !strings.Contains(fe.Allowed, tc.allowed) {
				t.Fatalf("error %q names key %q allowing %q; want key %q allowing %q", err, fe.Key, fe.Allowed, tc.key, tc.allowed)
			}
			if !strings.Contains(err.Error(), tc.key+": ") || !strings.Contains(err.Error(), "is not allowed") {
				t.Fatalf("message %q does not name the key and value", err)
			}
		})
	}
}

func TestDecodeErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "scopes: {chat: {breaker: {fail_treshold: 3}, sources: [{name: a}]}}", "fail_treshold"},
		{"duration without unit", "scopes: {chat: {breaker: {cooldown: 60}, sources: [{name: a}]}}", "cooldown"},
		{"not a duration", "scopes: {chat: {breaker: {cooldown: soon}, sources: [{name: a}]}}", "soon"},
		{"not a number", "scopes: {chat: {max_attempts: many, sources: [{name: a}]}}", "max_attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestManyErrorsAtOnce(t *testing.T) {
	_, err := config.Parse([]byte("scopes: {chat: {max_attempts: 0, sources: [{name: a, weight: 0}]}}"), nil)
	if err == nil || !strings.Contains(err.Error(), "max_attempts") || !strings.Contains(err.Error(), "weight") {
		t.Fatalf("error %v, want both problems reported", err)
	}
}

func TestEnvironmentOverridesFileAndFlagsOverrideEnvironment(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "polygate.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:7000\n"+base), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{
		"POLYGATE_CONFIG=" + file,
		"POLYGATE_LISTEN=127.0.0.1:7001",
		"POLYGATE_SCOPES__CHAT__CIRCUIT_OPEN=wait",
		"POLYGATE_SCOPES__CHAT__BREAKER__COOLDOWN=5s",
		"POLYGATE_SCOPES__CHAT__SOURCES__BACKUP__RPM=120",
		"POLYGATE_SCOPES__CHAT__SOURCES__BACKUP__BREAKER__FAIL_RATE=0.9",
		"POLYGATE_BACKEND__REDIS__ADDRS=a:1,b:2",
		"OTHER_VAR=ignored",
		// The application's own variables, in an environment it shares
		// with its sidecar.
		"POLYGATE_ADDR=127.0.0.1:50051",
		"POLYGATE_TOKEN=s3cret",
		"POLYGATE_ON_SIDECAR_UNAVAILABLE=allow",
	}
	o, err := config.ParseFlags([]string{"--metrics-listen", "127.0.0.1:9090"}, environ, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.File != file {
		t.Fatalf("POLYGATE_CONFIG not used: %q", o.File)
	}
	cfg, err := config.Load(o, environ)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Scopes["chat"]
	if cfg.Listen != "127.0.0.1:7001" || cfg.MetricsListen != "127.0.0.1:9090" || s.CircuitOpen != config.Wait ||
		s.Sources[0].Breaker.Cooldown != 5*time.Second || s.Sources[1].RPM != 120 || s.Sources[1].Breaker.FailRate != 0.9 ||
		s.Sources[0].RPM != 0 || len(cfg.Backend.Redis.Addrs) != 2 {
		t.Fatalf("overrides not applied: listen %s metrics %s scope %+v redis %v", cfg.Listen, cfg.MetricsListen, s, cfg.Backend.Redis.Addrs)
	}
	o, _ = config.ParseFlags([]string{"--listen", "unix:///tmp/pg.sock"}, environ, os.Stderr)
	if cfg, err = config.Load(o, environ); err != nil || cfg.Listen != "unix:///tmp/pg.sock" {
		t.Fatalf("flag over env: %v %v", cfg, err)
	}
}

func TestEnvironmentErrors(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"POLYGATE_SCOPES__DEMO__SOURCES__NOPE__RPM=1", `POLYGATE_SCOPES__DEMO__SOURCES__NOPE__RPM: scope "demo" has no source named "nope"`},
		{"POLYGATE_SCOPES__DEMO__MAX_ATTEMPTS=0", "scopes.demo.max_attempts: 0 is not allowed"},
		{"POLYGATE_LOG__LEVEL=chatty", `log.level: "chatty" is not allowed`},
	} {
		_, err := config.Load(config.Options{}, []string{tc.env})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.env, err, tc.want)
		}
	}
}

func TestOperationsKeys(t *testing.T) {
	cfg, err := config.Parse([]byte(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Telemetry.Path != "" || cfg.Telemetry.Retention != config.DefaultRetention ||
		cfg.Telemetry.QueueSize != config.DefaultTelemetryQueue || cfg.Events.WatchBuffer != config.DefaultWatchBuffer {
		t.Fatalf("defaults: telemetry %+v events %+v", cfg.Telemetry, cfg.Events)
	}
	cfg, err = config.Parse([]byte("telemetry: {path: /var/lib/polygate/t.db, retention: 24h, queue_size: 100}\nevents: {watch_buffer: 16}\n"+base),
		[]string{"POLYGATE_TELEMETRY__QUEUE_SIZE=200"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Telemetry.Path != "/var/lib/polygate/t.db" || cfg.Telemetry.Retention != 24*time.Hour ||
		cfg.Telemetry.QueueSize != 200 || cfg.Events.WatchBuffer != 16 {
		t.Fatalf("set: telemetry %+v events %+v", cfg.Telemetry, cfg.Events)
	}
}

// problems are the problems err reports, one per line.
func problems(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// TestUnknownKeysAreNamedByTheirPath: an unknown key is named by its path,
// with the known key it is likely a typo of, or the keys allowed there.
func TestUnknownKeysAreNamedByTheirPath(t *testing.T) {
	for _, tc := range []struct{ name, yaml, key, suggest, message string }{
		{"scope", "scopes: {chat: {max_atempts: 3, sources: [{name: a}]}}", "scopes.chat.max_atempts", "max_attempts",
			"scopes.chat.max_atempts: unknown key; did you mean max_attempts?"},
		{"source, by its name", "scopes: {chat: {sources: [{name: a, rpn: 5}]}}", "scopes.chat.sources.a.rpn", "rpm", ""},
		{"source without a valid name, by its index", "scopes: {chat: {sources: [{name: A, rpn: 5}]}}", "scopes.chat.sources[0].rpn", "rpm", ""},
		{"breaker", "scopes: {chat: {breaker: {fail_treshold: 3}, sources: [{name: a}]}}", "scopes.chat.breaker.fail_treshold", "fail_threshold", ""},
		{"top level", "lisen: 127.0.0.1:1\n" + base, "lisen", "listen", ""},
		{"no close key", "scopes: {chat: {colour: red, sources: [{name: a}]}}", "scopes.chat.colour", "",
			"scopes.chat.colour: unknown key; allowed here: mode, circuit_open, source_dead, quota_full, max_attempts, backoff, backpressure, lease_grace, tenants, default_tenant, default_tenant_weight, max_tenants, priority_aging, breaker, sources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml), nil)
			var ke *config.KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || ke.Suggest != tc.suggest {
				t.Fatalf("error %v, want unknown key %s (did you mean %q)", err, tc.key, tc.suggest)
			}
			if tc.message != "" && err.Error() != tc.message {
				t.Fatalf("message %q, want %q", err, tc.message)
			}
		})
	}
}

// TestWrongTypesAreNamed: a value of the wrong type is refused with its key,
// the value and what is allowed, in the configuration's words.
func TestWrongTypesAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, key string
		value           any
		allowed         string
	}{
		{"not a number", "scopes: {chat: {max_attempts: many, sources: [{name: a}]}}", "scopes.chat.max_attempts", "many", "a whole number"},
		{"not a whole number", "scopes: {chat: {sources: [{name: a, rpm: 1.5}]}}", "scopes.chat.sources.a.rpm", 1.5, "a whole number"},
		{"duration without a unit", "scopes: {chat: {breaker: {cooldown: 60}, sources: [{name: a}]}}", "scopes.chat.breaker.cooldown", 60, "a duration needs a unit"},
		{"not a duration", "scopes: {chat: {backoff: {base: soon}, sources: [{name: a}]}}", "scopes.chat.backoff.base", "soon", "a duration with a unit"},
		{"not a boolean", "backend: {redis: {cluster: maybe}}\n" + base, "backend.redis.cluster", "maybe", "true or false"},
		{"not a mapping", "scopes: {chat: {tenants: [a], sources: [{name: a}]}}", "scopes.chat.tenants", []any{"a"}, "a mapping"},
		{"a tenant neither a weight nor a mapping", "scopes: {chat: {tenants: {gold: lots}, sources: [{name: a}]}}", "scopes.chat.tenants.gold", "lots", "a weight (a whole number) or a mapping of keys: weight, max_priority"},
		{"not a list", "scopes: {chat: {sources: primary}}", "scopes.chat.sources", "primary", "a list"},
		{"a section that is not a mapping", "log: loud\n" + base, "log", "loud", "a mapping of keys: format, level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml), nil)
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Key != tc.key || !reflect.DeepEqual(fe.Value, tc.value) || !strings.Contains(fe.Allowed, tc.allowed) {
				t.Fatalf("error %v, want %s: %v refused allowing %q", err, tc.key, tc.value, tc.allowed)
			}
		})
	}
}

// TestEnumsListTheirWords: a value outside an enum is refused with the
// allowed words, and the one it is likely a typo of.
func TestEnumsListTheirWords(t *testing.T) {
	_, err := config.Parse([]byte("scopes: {chat: {circuit_open: fail-fast, sources: [{name: a}]}}"), nil)
	if want := `scopes.chat.circuit_open: "fail-fast" is not allowed; allowed: fail_fast, wait; did you mean fail_fast?`; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	_, err = config.Parse([]byte("log: {level: loud}\n"+base), nil)
	if want := `log.level: "loud" is not allowed; allowed: debug, info, warn, error`; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
}

// TestAProblemIsReportedOnceWhereItIsWritten: a scope's value that its
// sources inherit is one problem, under the scope's key, not one per source.
func TestAProblemIsReportedOnceWhereItIsWritten(t *testing.T) {
	_, err := config.Parse([]byte(`
scopes:
  chat:
    breaker: {fail_rate: 1.5, cooldown: 10m}
    sources: [{name: a}, {name: b}, {name: c, breaker: {fail_rate: 2}}]
`), nil)
	var got []string
	for _, p := range problems(err) {
		got = append(got, p.Error())
	}
	want := []string{
		"scopes.chat.breaker.fail_rate: 1.5 is not allowed; must be in (0, 1]",
		"scopes.chat.breaker.max_cooldown: 5m is not allowed; must be at least cooldown (10m); it is the default 5m here, so set breaker.max_cooldown too",
		"scopes.chat.sources.c.breaker.fail_rate: 2 is not allowed; must be in (0, 1]",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
