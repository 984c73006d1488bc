package config

import (
	"fmt"
	"maps"
)

// effective is cfg in the file's shape with every key set: the defaults and
// derived values it was resolved with, as a file would write them. Secrets
// given inline are Redacted (the file keys auth.*_file are paths and are
// kept). A scope's breaker keys are on each of its sources.
func effective(cfg *Config) *fileConfig {
	r := &cfg.Backend.Redis
	f := &fileConfig{
		Listen:        &cfg.Listen,
		MetricsListen: &cfg.MetricsListen,
		ListenMode:    "",
		TLS:           fileTLS{CertFile: &cfg.TLS.CertFile, KeyFile: &cfg.TLS.KeyFile, ClientCAFile: &cfg.TLS.ClientCAFile, TenantFrom: &cfg.Auth.TenantFrom},
		Limits: fileLimits{
			MaxRequestBytes: &cfg.Limits.MaxRequestBytes, MaxStreamsPerConnection: &cfg.Limits.MaxStreamsPerConnection,
			KeepaliveMinTime: &cfg.Limits.KeepaliveMinTime, MaxConnectionIdle: &cfg.Limits.MaxConnectionIdle,
			FirstMessageTimeout: &cfg.Limits.FirstMessageTimeout,
		},
		Backend: fileBackend{
			Kind:   &cfg.Backend.Kind,
			Memory: fileMemory{StatePath: &cfg.Backend.Memory.StatePath},
			Redis: fileRedis{
				Addrs: nonNil(r.Addrs), Cluster: &r.Cluster, MasterName: &r.MasterName, Username: &r.Username,
				Password: redact(r.Password), DB: &r.DB, KeyPrefix: &r.KeyPrefix, Timeout: &r.Timeout,
				TLS: &r.TLS, TLSCAFile: &r.TLSCAFile, TLSCertFile: &r.TLSCertFile, TLSKeyFile: &r.TLSKeyFile,
				TLSServerName: &r.TLSServerName, OnUnavailable: &r.OnUnavailable, Replicas: &r.Replicas,
				PoolSize: &r.PoolSize, BatchLinger: &r.BatchLinger,
			},
		},
		Telemetry: fileTelemetry{Path: &cfg.Telemetry.Path, Retention: &cfg.Telemetry.Retention, QueueSize: &cfg.Telemetry.QueueSize},
		Events:    fileEvents{WatchBuffer: &cfg.Events.WatchBuffer, MaxWatchers: &cfg.Events.MaxWatchers},
		Log:       fileLog{Format: &cfg.Log.Format, Level: &cfg.Log.Level},
		Calls:     fileCalls{MaxLive: &cfg.Calls.MaxLive, IdleTimeout: &cfg.Calls.IdleTimeout},
		Auth:      fileAuth{},
		Scopes:    make(map[string]fileScope, len(cfg.Scopes)),
	}
	if cfg.ListenMode != 0 {
		f.ListenMode = fmt.Sprintf("%04o", uint32(cfg.ListenMode.Perm()))
	}
	f.Auth.Token, f.Auth.TokenFile = secretKeys(cfg.Auth.Token, cfg.Auth.TokenFile)
	f.Auth.OperatorToken, f.Auth.OperatorTokenFile = secretKeys(cfg.Auth.OperatorToken, cfg.Auth.OperatorTokenFile)
	f.Auth.TenantTokens = effectiveTenantTokens(cfg.Auth.TenantTokens)
	for name, sc := range cfg.Scopes {
		f.Scopes[name] = effectiveScope(sc)
	}
	return f
}

func effectiveScope(sc *Scope) fileScope {
	circuitOpen, sourceDead, quotaFull, mode := string(sc.CircuitOpen), string(sc.SourceDead), string(sc.QuotaFull), string(sc.Mode)
	f := fileScope{
		CircuitOpen: &circuitOpen, SourceDead: &sourceDead, QuotaFull: &quotaFull,
		MaxAttempts:   &sc.MaxAttempts,
		Backoff:       fileBackoff{Base: &sc.BackoffBase, Max: &sc.BackoffMax, MaxRetryAfter: &sc.MaxRetryAfter},
		Backpressure:  fileBackpressure{StallWindow: &sc.StallWindow, PollInterval: &sc.PollInterval},
		LeaseGrace:    &sc.LeaseGrace,
		Mode:          &mode,
		Tenants:       make(map[string]fileTenant, len(sc.Tenants)),
		MaxTenants:    &sc.MaxTenants,
		PriorityAging: &sc.PriorityAging,
	}
	for name, t := range sc.Tenants {
		f.Tenants[name] = effectiveTenant(t)
	}
	def := effectiveTenant(sc.DefaultTenant)
	f.DefaultTenant = &def // default_tenant_weight, its shorthand, stays null
	// Breaker stays nil: every source carries the breaker it was resolved
	// with.
	for i := range sc.Sources {
		s := &sc.Sources[i]
		b := &s.Breaker
		f.Sources = append(f.Sources, fileSource{
			Name: &s.Name, Priority: &s.Priority, Weight: &s.Weight, MaxConcurrency: &s.MaxConcurrency,
			RPM: &s.RPM, TPM: &s.TPM, Timeout: &s.Timeout, Attributes: nonNilMap(s.Attributes),
			Breaker: fileBreaker{
				FailThreshold: &b.FailThreshold, MinCalls: &b.MinCalls, FailRate: &b.FailRate, Window: &b.Window,
				Cooldown: &b.Cooldown, MaxCooldown: &b.MaxCooldown, ProbeTTL: &b.ProbeTTL,
			},
		})
	}
	return f
}

// secretKeys are a token's two keys: the file it was read from, or the
// token given inline, Redacted; null (nil) for the other.
func secretKeys(token, file string) (inline, path *string) {
	switch {
	case file != "":
		return nil, &file
	case token != "":
		return redact(token), nil
	}
	return nil, nil
}

// redact is a pointer to Redacted for a secret that is set, to "" for one
// that is not.
func redact(secret string) *string {
	s := ""
	if secret != "" {
		s = Redacted
	}
	return &s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilMap[V any](m map[string]V) map[string]V {
	if m == nil {
		return map[string]V{}
	}
	return maps.Clone(m)
}
