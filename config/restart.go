package config

import (
	"fmt"
	"reflect"
	"unicode/utf8"
)

// restartKeys are the keys a reload cannot apply: the listeners, the backend,
// telemetry, the event buffers and the log format are built once at start.
// Each names the field that holds it; field returns a pointer into c.
var restartKeys = []struct {
	key    string
	field  func(c *Config) any
	secret bool
}{
	{key: "listen", field: func(c *Config) any { return &c.Listen }},
	{key: "listen_mode", field: func(c *Config) any { return &c.ListenMode }},
	{key: "tls.cert_file", field: func(c *Config) any { return &c.TLS.CertFile }},
	{key: "tls.key_file", field: func(c *Config) any { return &c.TLS.KeyFile }},
	{key: "tls.client_ca_file", field: func(c *Config) any { return &c.TLS.ClientCAFile }},
	{key: "limits.max_request_bytes", field: func(c *Config) any { return &c.Limits.MaxRequestBytes }},
	{key: "limits.max_streams_per_connection", field: func(c *Config) any { return &c.Limits.MaxStreamsPerConnection }},
	{key: "limits.keepalive_min_time", field: func(c *Config) any { return &c.Limits.KeepaliveMinTime }},
	{key: "limits.max_connection_idle", field: func(c *Config) any { return &c.Limits.MaxConnectionIdle }},
	{key: "limits.first_message_timeout", field: func(c *Config) any { return &c.Limits.FirstMessageTimeout }},
	{key: "metrics_listen", field: func(c *Config) any { return &c.MetricsListen }},
	{key: "backend.kind", field: func(c *Config) any { return &c.Backend.Kind }},
	{key: "backend.memory.state_path", field: func(c *Config) any { return &c.Backend.Memory.StatePath }},
	{key: "backend.redis.addrs", field: func(c *Config) any { return &c.Backend.Redis.Addrs }},
	{key: "backend.redis.cluster", field: func(c *Config) any { return &c.Backend.Redis.Cluster }},
	{key: "backend.redis.master_name", field: func(c *Config) any { return &c.Backend.Redis.MasterName }},
	{key: "backend.redis.username", field: func(c *Config) any { return &c.Backend.Redis.Username }},
	{key: "backend.redis.password", field: func(c *Config) any { return &c.Backend.Redis.Password }, secret: true},
	{key: "backend.redis.db", field: func(c *Config) any { return &c.Backend.Redis.DB }},
	{key: "backend.redis.key_prefix", field: func(c *Config) any { return &c.Backend.Redis.KeyPrefix }},
	{key: "backend.redis.timeout", field: func(c *Config) any { return &c.Backend.Redis.Timeout }},
	{key: "backend.redis.tls", field: func(c *Config) any { return &c.Backend.Redis.TLS }},
	{key: "backend.redis.tls_ca_file", field: func(c *Config) any { return &c.Backend.Redis.TLSCAFile }},
	{key: "backend.redis.tls_cert_file", field: func(c *Config) any { return &c.Backend.Redis.TLSCertFile }},
	{key: "backend.redis.tls_key_file", field: func(c *Config) any { return &c.Backend.Redis.TLSKeyFile }},
	{key: "backend.redis.tls_server_name", field: func(c *Config) any { return &c.Backend.Redis.TLSServerName }},
	{key: "backend.redis.on_unavailable", field: func(c *Config) any { return &c.Backend.Redis.OnUnavailable }},
	{key: "backend.redis.replicas", field: func(c *Config) any { return &c.Backend.Redis.Replicas }},
	{key: "backend.redis.pool_size", field: func(c *Config) any { return &c.Backend.Redis.PoolSize }},
	{key: "backend.redis.batch_linger", field: func(c *Config) any { return &c.Backend.Redis.BatchLinger }},
	{key: "telemetry.path", field: func(c *Config) any { return &c.Telemetry.Path }},
	{key: "telemetry.retention", field: func(c *Config) any { return &c.Telemetry.Retention }},
	{key: "telemetry.queue_size", field: func(c *Config) any { return &c.Telemetry.QueueSize }},
	{key: "events.watch_buffer", field: func(c *Config) any { return &c.Events.WatchBuffer }},
	{key: "events.max_watchers", field: func(c *Config) any { return &c.Events.MaxWatchers }},
	{key: "log.format", field: func(c *Config) any { return &c.Log.Format }},
}

// RestartKeys lists the keys whose change needs a restart; every other key
// applies on reload.
func RestartKeys() []string {
	keys := make([]string, len(restartKeys))
	for i, k := range restartKeys {
		keys[i] = k.key
	}
	return keys
}

// Change is a key whose value a reload would change, shown for a log.
type Change struct {
	Key      string
	Old, New string
}

// maxShown bounds a value shown in a Change.
const maxShown = 120

// KeepRestartKeys sets every key of next that needs a restart back to its
// value in running, and returns the changes it undid, in a fixed order.
// Secrets are shown as Redacted; long values are cut.
func (next *Config) KeepRestartKeys(running *Config) []Change {
	var out []Change
	for _, k := range restartKeys {
		was, now := reflect.ValueOf(k.field(running)).Elem(), reflect.ValueOf(k.field(next)).Elem()
		if equal(was, now) {
			continue
		}
		c := Change{Key: k.key, Old: shown(was.Interface()), New: shown(now.Interface())}
		if k.secret {
			c.Old, c.New = Redacted, Redacted
		}
		out = append(out, c)
		now.Set(was)
	}
	return out
}

// equal compares two values of a key; an absent list equals an empty one.
func equal(a, b reflect.Value) bool {
	if a.Kind() == reflect.Slice && a.Len() == 0 && b.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// shown is v for a log line, quoted and at most maxShown bytes long.
func shown(v any) string {
	s := show(v)
	if l, ok := v.([]string); ok {
		s = fmt.Sprintf("%q", l)
	}
	return cut(s, maxShown)
}

// maxLine bounds a line of an error that quotes a key or a decoder's
// message, which names keys and may quote a value.
const maxLine = 512

// cut is s cut to at most n bytes on a rune boundary, saying how long it was.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	l := len(s)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + fmt.Sprintf("… (%d bytes)", l)
}
