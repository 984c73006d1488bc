package config

import (
	"fmt"
	"time"
)

// Config is the whole validated configuration of a sidecar.
type Config struct {
	// Listen is "host:port" or "unix:///path/to/socket".
	Listen string
	// MetricsListen is the Prometheus listener's "host:port"; empty turns it off.
	MetricsListen string
	Backend       Backend
	Telemetry     Telemetry
	Events        Events
	Log           Log
	Calls         Calls
	Auth          Auth
	// Scopes by name.
	Scopes map[string]*Scope
}

// Backend selects where breakers and quotas live.
type Backend struct {
	// Kind is "memory" or "redis".
	Kind   string
	Memory Memory
	Redis  Redis
}

// Memory configures the memory backend.
type Memory struct {
	// StatePath is the file that keeps overrides, breaker states and the
	// current minute's RPM and TPM use across restarts; empty (the default)
	// keeps nothing.
	StatePath string
}

// Redis configures the Redis backend.
type Redis struct {
	// Addrs: one address is a standalone server (or, with MasterName, a
	// sentinel); several are a cluster (or sentinels).
	Addrs []string
	// Cluster treats a single address as a cluster's seed (several addresses
	// always mean a cluster, unless MasterName names a sentinel master).
	Cluster    bool
	MasterName string
	Username   string
	Password   string
	DB         int
	// KeyPrefix starts every key the backend writes.
	KeyPrefix string
	// Timeout bounds every backend operation, dial included.
	Timeout time.Duration
	TLS     bool
	// OnUnavailable is "fail_closed" (answer UNAVAILABLE) or "local" (a memory
	// gate takes over with limits divided by Replicas).
	OnUnavailable string
	Replicas      int
}

// Telemetry configures the per-call record.
type Telemetry struct {
	// Path of the SQLite database; empty turns telemetry off.
	Path      string
	Retention time.Duration
	// QueueSize bounds the records waiting to be written; when it is full,
	// records are dropped (and counted), never decisions slowed.
	QueueSize int
}

// Events configures WatchEvents.
type Events struct {
	// WatchBuffer is how many events each watcher may have waiting; a
	// watcher that falls further behind loses events (and is told how many).
	WatchBuffer int
}

// Log configures log/slog.
type Log struct {
	// Format is "text" or "json"; Level is "debug", "info", "warn" or "error".
	Format string
	Level  string
}

// Auth guards the admission service.
type Auth struct {
	// Token, when set, must come with every call of the admission service as
	// "authorization: Bearer <token>" (health and reflection stay open).
	Token string
}

// Calls bounds the sidecar's memory of calls.
type Calls struct {
	// MaxLive caps the calls open at once; a Pick that would open one more is
	// refused with RESOURCE_EXHAUSTED.
	MaxLive int
	// IdleTimeout forgets a call that has not been touched for this long.
	IdleTimeout time.Duration
}

// FieldError is a configuration value that is not allowed.
type FieldError struct {
	// Key is the configuration key, dotted, e.g. "scopes.chat.breaker.fail_rate".
	Key     string
	Value   any
	Allowed string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s is not allowed; %s", e.Key, show(e.Value), e.Allowed)
}

func show(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case nil:
		return "nothing"
	}
	return fmt.Sprint(v)
}
