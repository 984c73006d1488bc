package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/polygate/polygate/gate"
)

func or[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// resolve validates a file configuration and fills in defaults and derived values.
func resolve(f *fileConfig) (*Config, error) {
	c := &checker{}
	cfg := &Config{
		Listen:        or(f.Listen, DefaultListen),
		MetricsListen: or(f.MetricsListen, ""),
		Backend: Backend{
			Kind:   or(f.Backend.Kind, "memory"),
			Memory: Memory{StatePath: or(f.Backend.Memory.StatePath, "")},
			Redis: Redis{
				Addrs:         f.Backend.Redis.Addrs,
				Cluster:       or(f.Backend.Redis.Cluster, false),
				MasterName:    or(f.Backend.Redis.MasterName, ""),
				Username:      or(f.Backend.Redis.Username, ""),
				Password:      or(f.Backend.Redis.Password, ""),
				DB:            or(f.Backend.Redis.DB, 0),
				KeyPrefix:     or(f.Backend.Redis.KeyPrefix, "polygate:"),
				Timeout:       or(f.Backend.Redis.Timeout, DefaultRedisTimeout),
				TLS:           or(f.Backend.Redis.TLS, false),
				TLSCAFile:     or(f.Backend.Redis.TLSCAFile, ""),
				TLSCertFile:   or(f.Backend.Redis.TLSCertFile, ""),
				TLSKeyFile:    or(f.Backend.Redis.TLSKeyFile, ""),
				TLSServerName: or(f.Backend.Redis.TLSServerName, ""),
				OnUnavailable: or(f.Backend.Redis.OnUnavailable, "fail_closed"),
				Replicas:      or(f.Backend.Redis.Replicas, 1),
				PoolSize:      or(f.Backend.Redis.PoolSize, 0),
				BatchLinger:   or(f.Backend.Redis.BatchLinger, DefaultRedisBatchLinger),
			},
		},
		Telemetry: Telemetry{
			Path: or(f.Telemetry.Path, ""), Retention: or(f.Telemetry.Retention, DefaultRetention),
			QueueSize: or(f.Telemetry.QueueSize, DefaultTelemetryQueue),
		},
		TLS:  TLS{CertFile: or(f.TLS.CertFile, ""), KeyFile: or(f.TLS.KeyFile, ""), ClientCAFile: or(f.TLS.ClientCAFile, "")},
		Auth: Auth{TenantFrom: or(f.TLS.TenantFrom, "")},
		Limits: Limits{
			MaxRequestBytes:         or(f.Limits.MaxRequestBytes, DefaultMaxRequestBytes),
			MaxStreamsPerConnection: or(f.Limits.MaxStreamsPerConnection, DefaultMaxStreamsPerConn),
			KeepaliveMinTime:        or(f.Limits.KeepaliveMinTime, DefaultKeepaliveMinTime),
			MaxConnectionIdle:       or(f.Limits.MaxConnectionIdle, DefaultMaxConnectionIdle),
			FirstMessageTimeout:     or(f.Limits.FirstMessageTimeout, DefaultFirstMessageTimeout),
		},
		Events: Events{WatchBuffer: or(f.Events.WatchBuffer, DefaultWatchBuffer), MaxWatchers: or(f.Events.MaxWatchers, DefaultMaxWatchers)},
		Log:    Log{Format: or(f.Log.Format, "text"), Level: or(f.Log.Level, "info")},
		Calls:  Calls{MaxLive: or(f.Calls.MaxLive, DefaultMaxLiveCalls), IdleTimeout: or(f.Calls.IdleTimeout, DefaultCallIdle)},
		Scopes: make(map[string]*Scope, len(f.Scopes)),
	}
	c.address("listen", cfg.Listen, true)
	if cfg.MetricsListen != "" {
		c.address("metrics_listen", cfg.MetricsListen, false)
	}
	c.oneOf("backend.kind", cfg.Backend.Kind, "memory", "redis")
	switch p := cfg.Backend.Memory.StatePath; {
	case p == "":
	case strings.TrimSpace(p) == "":
		c.fail("backend.memory.state_path", "(blank)", "a path must not be blank; leave it empty to keep no state")
	case cfg.Backend.Kind != "memory":
		c.fail("backend.memory.state_path", p, "only the memory backend keeps a state file; remove it with backend.kind "+cfg.Backend.Kind)
	case strings.HasSuffix(p, "/"):
		c.fail("backend.memory.state_path", p, "a file path, not a directory")
	}
	if r := &cfg.Backend.Redis; cfg.Backend.Kind == "redis" {
		if len(r.Addrs) == 0 {
			c.fail("backend.redis.addrs", r.Addrs, "the redis backend needs at least one host:port")
		}
		for i, a := range r.Addrs {
			c.address(fmt.Sprintf("backend.redis.addrs[%d]", i), a, false)
		}
		c.atLeast("backend.redis.db", int64(r.DB), 0)
		c.duration("backend.redis.timeout", r.Timeout, time.Millisecond)
		c.oneOf("backend.redis.on_unavailable", r.OnUnavailable, "fail_closed", "local")
		c.atLeast("backend.redis.replicas", int64(r.Replicas), 1)
		c.between("backend.redis.pool_size", int64(r.PoolSize), 0, MaxRedisPoolSize)
		// (No bound by timeout: a linger is never longer than the call
		// before it, which timeout bounds.)
		if l := r.BatchLinger; l%time.Millisecond != 0 || l < 0 || l > MaxRedisBatchLinger {
			c.fail("backend.redis.batch_linger", l, "must be whole milliseconds from 0 (off) to "+formatDuration(MaxRedisBatchLinger))
		}
		if !r.TLS && (r.TLSCAFile != "" || r.TLSCertFile != "" || r.TLSKeyFile != "" || r.TLSServerName != "") {
			c.fail("backend.redis.tls", false, "must be true when backend.redis.tls_ca_file, tls_cert_file, tls_key_file or tls_server_name is set")
		}
		c.pair("backend.redis.tls_cert_file", r.TLSCertFile, "backend.redis.tls_key_file", r.TLSKeyFile)
		for key, path := range map[string]string{"backend.redis.tls_ca_file": r.TLSCAFile, "backend.redis.tls_cert_file": r.TLSCertFile, "backend.redis.tls_key_file": r.TLSKeyFile} {
			c.readable(key, path)
		}
	}
	cfg.ListenMode = c.fileMode("listen_mode", f.ListenMode)
	if cfg.ListenMode != 0 && !strings.HasPrefix(cfg.Listen, "unix://") {
		c.fail("listen_mode", fmt.Sprintf("%04o", cfg.ListenMode), "applies to a unix socket only; listen is "+cfg.Listen)
	}
	c.pair("tls.cert_file", cfg.TLS.CertFile, "tls.key_file", cfg.TLS.KeyFile)
	if cfg.TLS.ClientCAFile != "" && cfg.TLS.CertFile == "" {
		c.fail("tls.client_ca_file", cfg.TLS.ClientCAFile, "needs tls.cert_file and tls.key_file: client certificates are checked over TLS")
	}
	for key, path := range map[string]string{"tls.cert_file": cfg.TLS.CertFile, "tls.key_file": cfg.TLS.KeyFile, "tls.client_ca_file": cfg.TLS.ClientCAFile} {
		c.readable(key, path)
	}
	lim := cfg.Limits
	if lim.MaxRequestBytes < 1<<10 || lim.MaxRequestBytes > 4<<20 {
		c.fail("limits.max_request_bytes", lim.MaxRequestBytes, "must be 1024 to 4194304 (1 KiB to 4 MiB)")
	}
	if lim.MaxStreamsPerConnection < 1 || lim.MaxStreamsPerConnection > 1<<16 {
		c.fail("limits.max_streams_per_connection", lim.MaxStreamsPerConnection, "must be 1 to 65536")
	}
	c.duration("limits.keepalive_min_time", lim.KeepaliveMinTime, time.Second)
	c.duration("limits.max_connection_idle", lim.MaxConnectionIdle, 0)
	if lim.FirstMessageTimeout > MaxFirstMessageTimeout {
		c.fail("limits.first_message_timeout", lim.FirstMessageTimeout, "must be at most "+formatDuration(MaxFirstMessageTimeout))
	} else {
		c.duration("limits.first_message_timeout", lim.FirstMessageTimeout, 100*time.Millisecond)
	}
	c.atLeast("events.max_watchers", int64(cfg.Events.MaxWatchers), 1)
	cfg.Auth.Token = c.secret("auth.token", f.Auth.Token, f.Auth.TokenFile)
	cfg.Auth.OperatorToken = c.secret("auth.operator_token", f.Auth.OperatorToken, f.Auth.OperatorTokenFile)
	cfg.Auth.TokenFile, cfg.Auth.OperatorTokenFile = or(f.Auth.TokenFile, ""), or(f.Auth.OperatorTokenFile, "")
	if cfg.Backend.Redis.Password == Redacted {
		c.fail("backend.redis.password", Redacted, "--check prints this in place of a secret; write the password here, or set "+envName("backend.redis.password"))
	}
	if cfg.Auth.OperatorToken != "" && cfg.Auth.OperatorToken == cfg.Auth.Token {
		c.fail("auth.operator_token", "(same as auth.token)", "must differ from auth.token, or the application could act as the operator")
	}
	cfg.Auth.TenantTokens = resolveTenantTokens(c, f.Auth.TenantTokens, cfg.Auth.Token, cfg.Auth.OperatorToken)
	if from := cfg.Auth.TenantFrom; from != "" {
		c.oneOf("tls.tenant_from", from, TenantFromURISAN, TenantFromCommonName)
		if cfg.TLS.ClientCAFile == "" {
			c.fail("tls.tenant_from", from, "needs tls.client_ca_file: the tenant is read from a verified client certificate")
		}
	}
	c.duration("telemetry.retention", cfg.Telemetry.Retention, time.Minute)
	if cfg.Telemetry.Path != "" && strings.TrimSpace(cfg.Telemetry.Path) == "" {
		c.fail("telemetry.path", "(blank)", "a path must not be blank; leave it empty to turn telemetry off")
	}
	if strings.Contains(cfg.Telemetry.Path, "?") {
		c.fail("telemetry.path", cfg.Telemetry.Path, "a file path without '?'")
	}
	c.atLeast("telemetry.queue_size", int64(cfg.Telemetry.QueueSize), 1)
	c.atLeast("events.watch_buffer", int64(cfg.Events.WatchBuffer), 1)
	c.oneOf("log.format", cfg.Log.Format, "text", "json")
	c.oneOf("log.level", cfg.Log.Level, "debug", "info", "warn", "error")
	c.atLeast("calls.max_live", int64(cfg.Calls.MaxLive), 1)
	c.duration("calls.idle_timeout", cfg.Calls.IdleTimeout, time.Second)

	if len(f.Scopes) == 0 {
		c.fail("scopes", nil, "configure at least one scope")
	}
	for name, fs := range f.Scopes {
		if !nameRE.MatchString(name) {
			c.fail("scopes."+name, name, nameAllowed)
			continue
		}
		cfg.Scopes[name] = resolveScope(c, name, &fs)
	}
	// A call must outlive its longest attempt, or the sidecar would forget it
	// while the attempt runs and lose its outcome.
	var longest time.Duration
	longestKey := ""
	for _, name := range slices.Sorted(maps.Keys(cfg.Scopes)) {
		sc := cfg.Scopes[name]
		for i := range sc.Sources {
			if l := sc.Sources[i].Lease(sc.LeaseGrace); l > longest {
				longest, longestKey = l, "scopes."+name+".sources."+sc.Sources[i].Name
			}
		}
	}
	if longest > 0 && cfg.Calls.IdleTimeout <= longest {
		c.fail("calls.idle_timeout", cfg.Calls.IdleTimeout, fmt.Sprintf(
			"must be longer than the longest permit lease (%s: timeout + lease_grace = %s), or a call would be forgotten during its own attempt", longestKey, formatDuration(longest)))
	}
	if len(c.errs) > 0 {
		return nil, joinAtMost(c.errs)
	}
	return cfg, nil
}

func resolveScope(c *checker, name string, f *fileScope) *Scope {
	key := "scopes." + name
	s := &Scope{
		Name:          name,
		CircuitOpen:   OnRefusal(or(f.CircuitOpen, string(FailFast))),
		SourceDead:    OnRefusal(or(f.SourceDead, string(FailFast))),
		QuotaFull:     OnRefusal(or(f.QuotaFull, string(Wait))),
		MaxAttempts:   or(f.MaxAttempts, DefaultMaxAttempts),
		BackoffBase:   or(f.Backoff.Base, DefaultBackoffBase),
		BackoffMax:    or(f.Backoff.Max, DefaultBackoffMax),
		MaxRetryAfter: or(f.Backoff.MaxRetryAfter, DefaultMaxRetryAfter),
		StallWindow:   or(f.Backpressure.StallWindow, DefaultStallWindow),
		PollInterval:  or(f.Backpressure.PollInterval, DefaultPollInterval),
		LeaseGrace:    or(f.LeaseGrace, DefaultLeaseGrace),

		Mode:          Mode(or(f.Mode, string(Enforce))),
		MaxTenants:    or(f.MaxTenants, DefaultMaxTenants),
		PriorityAging: or(f.PriorityAging, 0),
	}
	s.Tenants, s.DefaultTenant = resolveTenants(c, key, f)
	c.oneOf(key+".mode", string(s.Mode), string(Enforce), string(Shadow))
	c.between(key+".max_tenants", int64(s.MaxTenants), 1, MaxTenants)
	if s.PriorityAging != 0 {
		c.duration(key+".priority_aging", s.PriorityAging, time.Millisecond)
	}
	c.oneOf(key+".circuit_open", string(s.CircuitOpen), string(FailFast), string(Wait))
	c.oneOf(key+".source_dead", string(s.SourceDead), string(FailFast), string(Wait))
	c.oneOf(key+".quota_full", string(s.QuotaFull), string(Wait), string(FailFast))
	c.atLeast(key+".max_attempts", int64(s.MaxAttempts), 1)
	c.duration(key+".backoff.base", s.BackoffBase, time.Millisecond)
	c.duration(key+".backoff.max", s.BackoffMax, time.Millisecond)
	if s.BackoffMax < s.BackoffBase {
		c.fail(key+".backoff.max", s.BackoffMax, "must be at least backoff.base ("+formatDuration(s.BackoffBase)+")")
	}
	c.duration(key+".backoff.max_retry_after", s.MaxRetryAfter, time.Millisecond)
	c.duration(key+".backpressure.stall_window", s.StallWindow, time.Millisecond)
	c.duration(key+".backpressure.poll_interval", s.PollInterval, time.Millisecond)
	if s.PollInterval > s.StallWindow {
		c.fail(key+".backpressure.poll_interval", s.PollInterval, "must be at most stall_window ("+formatDuration(s.StallWindow)+")")
	}
	c.duration(key+".lease_grace", s.LeaseGrace, 0)

	if len(f.Sources) == 0 {
		c.fail(key+".sources", nil, "a scope needs at least one source")
	}
	var slowest time.Duration
	for i := range f.Sources {
		slowest = max(slowest, or(f.Sources[i].Timeout, DefaultTimeout))
	}
	seen := map[string]bool{}
	for i := range f.Sources {
		fs := &f.Sources[i]
		src := Source{
			Name:           or(fs.Name, ""),
			Priority:       or(fs.Priority, 0),
			Weight:         or(fs.Weight, DefaultWeight),
			MaxConcurrency: or(fs.MaxConcurrency, DefaultMaxConcurrency),
			RPM:            or(fs.RPM, 0),
			TPM:            or(fs.TPM, 0),
			Timeout:        or(fs.Timeout, DefaultTimeout),
			Attributes:     fs.Attributes,
		}
		skey := fmt.Sprintf("%s.sources[%d]", key, i)
		switch {
		case !nameRE.MatchString(src.Name):
			c.fail(skey+".name", src.Name, nameAllowed)
		case seen[src.Name]:
			c.fail(skey+".name", src.Name, "source names are unique within a scope")
		default:
			skey = key + ".sources." + src.Name
		}
		seen[src.Name] = true
		c.atLeast(skey+".priority", int64(src.Priority), 0)
		c.atLeast(skey+".weight", int64(src.Weight), 1)
		c.between(skey+".max_concurrency", int64(src.MaxConcurrency), 1, MaxConcurrency)
		c.atLeast(skey+".rpm", src.RPM, 0)
		c.atLeast(skey+".tpm", src.TPM, 0)
		c.duration(skey+".timeout", src.Timeout, time.Millisecond)
		src.Breaker, src.ProbeTTLDerived = resolveBreaker(c, key, skey, or(f.Breaker, fileBreaker{}), &fs.Breaker, src.Timeout, slowest)
		s.Sources = append(s.Sources, src)
	}
	return s
}

// resolveBreaker merges a source's breaker keys over its scope's, key by key,
// and derives probe_ttl when neither sets it.
func resolveBreaker(c *checker, scopeKey, sourceKey string, scope fileBreaker, src *fileBreaker, timeout, slowest time.Duration) (p gate.BreakerPolicy, derived bool) {
	// Errors name the key that set the value: the source's, else the scope's.
	pick := func(bySource bool, name string) string {
		if bySource {
			return sourceKey + ".breaker." + name
		}
		return scopeKey + ".breaker." + name
	}
	p.FailThreshold = or(src.FailThreshold, or(scope.FailThreshold, DefaultFailThreshold))
	p.MinCalls = or(src.MinCalls, or(scope.MinCalls, DefaultMinCalls))
	p.FailRate = or(src.FailRate, or(scope.FailRate, DefaultFailRate))
	p.Window = or(src.Window, or(scope.Window, DefaultWindow))
	p.Cooldown = or(src.Cooldown, or(scope.Cooldown, DefaultCooldown))
	p.MaxCooldown = or(src.MaxCooldown, or(scope.MaxCooldown, DefaultMaxCooldown))
	c.atLeast(pick(src.FailThreshold != nil, "fail_threshold"), int64(p.FailThreshold), 1)
	c.atLeast(pick(src.MinCalls != nil, "min_calls"), int64(p.MinCalls), 1)
	if !(p.FailRate > 0 && p.FailRate <= 1) {
		c.fail(pick(src.FailRate != nil, "fail_rate"), p.FailRate, "must be in (0, 1]")
	}
	c.duration(pick(src.Window != nil, "window"), p.Window, gate.WindowBuckets*time.Millisecond)
	c.duration(pick(src.Cooldown != nil, "cooldown"), p.Cooldown, time.Millisecond)
	c.duration(pick(src.MaxCooldown != nil, "max_cooldown"), p.MaxCooldown, time.Millisecond)
	if p.MaxCooldown < p.Cooldown {
		allowed := "must be at least cooldown (" + formatDuration(p.Cooldown) + ")"
		if src.MaxCooldown == nil && scope.MaxCooldown == nil {
			allowed += "; it is the default " + formatDuration(DefaultMaxCooldown) + " here, so set breaker.max_cooldown too"
		}
		c.fail(pick(src.MaxCooldown != nil, "max_cooldown"), p.MaxCooldown, allowed)
	}
	if ttl := or(src.ProbeTTL, or(scope.ProbeTTL, 0)); src.ProbeTTL != nil || scope.ProbeTTL != nil {
		p.ProbeTTL = ttl
		c.duration(pick(src.ProbeTTL != nil, "probe_ttl"), ttl, time.Millisecond)
		return p, false
	}
	// docs/design.md, The breaker: probe_ttl = max(2 × slowest timeout, cooldown, timeout + 5 s).
	p.ProbeTTL = max(2*slowest, p.Cooldown, timeout+5*time.Second)
	return p, true
}
