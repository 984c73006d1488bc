package config

import (
	"fmt"
	"os"
	"time"
)

// Config is the whole validated configuration of a sidecar.
type Config struct {
	// Listen is "host:port" or "unix:///path/to/socket".
	Listen string
	// ListenMode is the unix socket's permission bits (0: the process umask
	// decides).
	ListenMode os.FileMode
	// TLS serves the gRPC listener over TLS when CertFile is set.
	TLS TLS
	// Limits bound what one client may ask of the gRPC server.
	Limits Limits
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
	// TLSCAFile verifies the server (default: the system roots);
	// TLSCertFile and TLSKeyFile are a client certificate; TLSServerName
	// is the name the server's certificate must carry (default: the host
	// of the address). Any of them implies TLS.
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSServerName string
	// OnUnavailable is "fail_closed" (answer UNAVAILABLE) or "local" (a memory
	// gate takes over with limits divided by Replicas).
	OnUnavailable string
	Replicas      int
	// PoolSize is the most connections to each Redis node (0: go-redis's
	// default, 10 per CPU). A call waits up to Timeout for one when all are
	// busy, then answers UNAVAILABLE.
	PoolSize int
	// BatchLinger is the most a scope's next batch of Admits and Settles
	// waits for more after a call that carried two or more, never longer
	// than that call took (0: off; redisgate.Options.BatchLinger).
	BatchLinger time.Duration
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
	// MaxWatchers caps the WatchEvents streams open at once; one more is
	// refused with RESOURCE_EXHAUSTED.
	MaxWatchers int
}

// TLS configures the gRPC listener's TLS. Certificate files are re-read
// when they change, so a rotation needs no restart.
type TLS struct {
	// CertFile and KeyFile (PEM) serve TLS; empty: plaintext.
	CertFile string
	KeyFile  string
	// ClientCAFile (PEM), when set, requires every client to present a
	// certificate it signed (mutual TLS).
	ClientCAFile string
}

// Ways a client certificate names its caller's tenant (tls.tenant_from).
const (
	TenantFromURISAN     = "uri_san"
	TenantFromCommonName = "common_name"
)

// Limits bound what one client may ask of the gRPC server.
type Limits struct {
	// MaxRequestBytes is the largest request message the server decodes.
	MaxRequestBytes int
	// MaxStreamsPerConnection caps concurrent RPCs on one connection.
	MaxStreamsPerConnection int
	// KeepaliveMinTime is the shortest keepalive ping interval a client may
	// use; a client pinging more often is disconnected.
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes a connection without RPCs for this long
	// (0: never); clients reconnect transparently.
	MaxConnectionIdle time.Duration
	// FirstMessageTimeout closes a stream whose first request message has
	// not arrived this long after the stream opened.
	FirstMessageTimeout time.Duration
}

// Log configures log/slog.
type Log struct {
	// Format is "text" or "json"; Level is "debug", "info", "warn" or "error".
	Format string
	Level  string
}

// Redacted is what --check and the reload log show in place of a secret.
// A configuration that holds it as a secret is refused: it was printed,
// not written.
const Redacted = "(redacted)"

// Auth guards the admission service.
type Auth struct {
	// Token, when set, must come with every call of the admission service as
	// "authorization: Bearer <token>" (health and reflection stay open). It
	// is auth.token, or the content of auth.token_file.
	Token string
	// OperatorToken, when set, is required for OverrideBreaker and
	// WatchEvents (Token is then refused for them). It is
	// auth.operator_token, or the content of auth.operator_token_file.
	OperatorToken string
	// TokenFile and OperatorTokenFile are the files the tokens were read
	// from ("" when given inline or not at all).
	TokenFile, OperatorTokenFile string
	// TenantTokens are the application's tokens that name their caller's
	// tenant: a call authenticated with one is that tenant's.
	TenantTokens []TenantToken
	// TenantFrom, when set (TenantFromURISAN, TenantFromCommonName), names
	// a caller's tenant by its client certificate (tls.tenant_from).
	TenantFrom string
}

// TenantToken is a token of one tenant, given inline or read from
// TokenFile.
type TenantToken struct {
	Tenant    string
	Token     string
	TokenFile string
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

// Error names the key and shows the value, cut to maxShown bytes (a hostile
// value is not echoed whole into the log of a rejected reload).
func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s is not allowed; %s", cut(e.Key, maxLine), shown(e.Value), e.Allowed)
}

func show(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case time.Duration:
		return formatDuration(v)
	case nil:
		return "nothing"
	}
	return fmt.Sprint(v)
}
