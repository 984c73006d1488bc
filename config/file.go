package config

import "time"

// The file shape: what YAML, environment and flags may say. Pointers tell an
// absent key (the default applies) from an explicit value (used as given,
// or rejected).

type fileConfig struct {
	Listen        *string              `koanf:"listen"`
	MetricsListen *string              `koanf:"metrics_listen"`
	ListenMode    any                  `koanf:"listen_mode"`
	TLS           fileTLS              `koanf:"tls"`
	Limits        fileLimits           `koanf:"limits"`
	Backend       fileBackend          `koanf:"backend"`
	Telemetry     fileTelemetry        `koanf:"telemetry"`
	Events        fileEvents           `koanf:"events"`
	Log           fileLog              `koanf:"log"`
	Calls         fileCalls            `koanf:"calls"`
	Auth          fileAuth             `koanf:"auth"`
	Scopes        map[string]fileScope `koanf:"scopes"`
}

type fileBackend struct {
	Kind   *string    `koanf:"kind"`
	Memory fileMemory `koanf:"memory"`
	Redis  fileRedis  `koanf:"redis"`
}

type fileMemory struct {
	StatePath *string `koanf:"state_path"`
}

type fileRedis struct {
	Addrs         []string       `koanf:"addrs"`
	Cluster       *bool          `koanf:"cluster"`
	MasterName    *string        `koanf:"master_name"`
	Username      *string        `koanf:"username"`
	Password      *string        `koanf:"password"`
	DB            *int           `koanf:"db"`
	KeyPrefix     *string        `koanf:"key_prefix"`
	Timeout       *time.Duration `koanf:"timeout"`
	TLS           *bool          `koanf:"tls"`
	TLSCAFile     *string        `koanf:"tls_ca_file"`
	TLSCertFile   *string        `koanf:"tls_cert_file"`
	TLSKeyFile    *string        `koanf:"tls_key_file"`
	TLSServerName *string        `koanf:"tls_server_name"`
	OnUnavailable *string        `koanf:"on_unavailable"`
	Replicas      *int           `koanf:"replicas"`
	PoolSize      *int           `koanf:"pool_size"`
	BatchLinger   *time.Duration `koanf:"batch_linger"`
}

type fileTelemetry struct {
	Path      *string        `koanf:"path"`
	Retention *time.Duration `koanf:"retention"`
	QueueSize *int           `koanf:"queue_size"`
}

type fileEvents struct {
	WatchBuffer *int `koanf:"watch_buffer"`
	MaxWatchers *int `koanf:"max_watchers"`
}

type fileTLS struct {
	CertFile     *string `koanf:"cert_file"`
	KeyFile      *string `koanf:"key_file"`
	ClientCAFile *string `koanf:"client_ca_file"`
	TenantFrom   *string `koanf:"tenant_from"`
}

type fileLimits struct {
	MaxRequestBytes         *int           `koanf:"max_request_bytes"`
	MaxStreamsPerConnection *int           `koanf:"max_streams_per_connection"`
	KeepaliveMinTime        *time.Duration `koanf:"keepalive_min_time"`
	MaxConnectionIdle       *time.Duration `koanf:"max_connection_idle"`
	FirstMessageTimeout     *time.Duration `koanf:"first_message_timeout"`
}

type fileLog struct {
	Format *string `koanf:"format"`
	Level  *string `koanf:"level"`
}

type fileAuth struct {
	Token             *string           `koanf:"token"`
	TokenFile         *string           `koanf:"token_file"`
	OperatorToken     *string           `koanf:"operator_token"`
	OperatorTokenFile *string           `koanf:"operator_token_file"`
	TenantTokens      []fileTenantToken `koanf:"tenant_tokens"`
}

type fileTenantToken struct {
	Tenant    *string `koanf:"tenant"`
	Token     *string `koanf:"token"`
	TokenFile *string `koanf:"token_file"`
}

type fileCalls struct {
	MaxLive     *int           `koanf:"max_live"`
	IdleTimeout *time.Duration `koanf:"idle_timeout"`
}

type fileScope struct {
	Mode                *string               `koanf:"mode"`
	CircuitOpen         *string               `koanf:"circuit_open"`
	SourceDead          *string               `koanf:"source_dead"`
	QuotaFull           *string               `koanf:"quota_full"`
	MaxAttempts         *int                  `koanf:"max_attempts"`
	Backoff             fileBackoff           `koanf:"backoff"`
	Backpressure        fileBackpressure      `koanf:"backpressure"`
	LeaseGrace          *time.Duration        `koanf:"lease_grace"`
	Tenants             map[string]fileTenant `koanf:"tenants"`
	DefaultTenant       *fileTenant           `koanf:"default_tenant"`
	DefaultTenantWeight *int                  `koanf:"default_tenant_weight"`
	MaxTenants          *int                  `koanf:"max_tenants"`
	PriorityAging       *time.Duration        `koanf:"priority_aging"`
	// Breaker is nil when the file sets none; --check shows a scope's
	// breaker keys on each of its sources, where they apply.
	Breaker *fileBreaker `koanf:"breaker"`
	Sources []fileSource `koanf:"sources"`
}

// fileTenant is a tenant's entry: a mapping of its keys, or a whole number,
// its weight (the shorthand "gold: 4"; decode reads it).
type fileTenant struct {
	Weight         *int             `koanf:"weight"`
	MaxPriority    *int64           `koanf:"max_priority"`
	RPM            *int64           `koanf:"rpm"`
	TPM            *int64           `koanf:"tpm"`
	MaxConcurrency *int             `koanf:"max_concurrency"`
	MaxLiveCalls   *int             `koanf:"max_live_calls"`
	TokenBudget    *fileTokenBudget `koanf:"token_budget"`
}

type fileTokenBudget struct {
	Tokens *int64         `koanf:"tokens"`
	Per    *time.Duration `koanf:"per"`
}

type fileBackoff struct {
	Base          *time.Duration `koanf:"base"`
	Max           *time.Duration `koanf:"max"`
	MaxRetryAfter *time.Duration `koanf:"max_retry_after"`
}

type fileBackpressure struct {
	StallWindow  *time.Duration `koanf:"stall_window"`
	PollInterval *time.Duration `koanf:"poll_interval"`
}

type fileBreaker struct {
	FailThreshold *int           `koanf:"fail_threshold"`
	MinCalls      *int           `koanf:"min_calls"`
	FailRate      *float64       `koanf:"fail_rate"`
	Window        *time.Duration `koanf:"window"`
	Cooldown      *time.Duration `koanf:"cooldown"`
	MaxCooldown   *time.Duration `koanf:"max_cooldown"`
	ProbeTTL      *time.Duration `koanf:"probe_ttl"`
}

type fileSource struct {
	Name           *string           `koanf:"name"`
	Priority       *int              `koanf:"priority"`
	Weight         *int              `koanf:"weight"`
	MaxConcurrency *int              `koanf:"max_concurrency"`
	RPM            *int64            `koanf:"rpm"`
	TPM            *int64            `koanf:"tpm"`
	Timeout        *time.Duration    `koanf:"timeout"`
	Attributes     map[string]string `koanf:"attributes"`
	Breaker        fileBreaker       `koanf:"breaker"`
}
