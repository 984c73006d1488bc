package sidecar

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/server"
)

// redacted stands for a secret that is set; an unset secret shows as "".
const redacted = "(redacted)"

// printConfig writes the effective configuration, defaults and derived values
// included, as one JSON document, for --check. Its keys are the YAML keys;
// durations are Go durations ("1m30s"); scopes are as DescribeScope shows
// their configuration (proto field names, zero values shown). Secrets
// (auth.token, auth.operator_token, backend.redis.password) are "(redacted)"
// when set.
func printConfig(w io.Writer, cfg *config.Config) error {
	scopes, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(server.DescribeConfig(cfg))
	if err != nil {
		return err
	}
	var list struct {
		Scopes json.RawMessage `json:"scopes"`
	}
	if err := json.Unmarshal(scopes, &list); err != nil {
		return err
	}
	r := cfg.Backend.Redis
	doc := map[string]any{
		"listen":         cfg.Listen,
		"listen_mode":    fmt.Sprintf("%#o", uint32(cfg.ListenMode.Perm())),
		"metrics_listen": cfg.MetricsListen,
		"tls":            map[string]any{"cert_file": cfg.TLS.CertFile, "key_file": cfg.TLS.KeyFile, "client_ca_file": cfg.TLS.ClientCAFile},
		"limits": map[string]any{
			"max_request_bytes": cfg.Limits.MaxRequestBytes, "max_streams_per_connection": cfg.Limits.MaxStreamsPerConnection,
			"keepalive_min_time": dur(cfg.Limits.KeepaliveMinTime), "max_connection_idle": dur(cfg.Limits.MaxConnectionIdle),
		},
		"backend": map[string]any{
			"kind":   cfg.Backend.Kind,
			"memory": map[string]any{"state_path": cfg.Backend.Memory.StatePath},
			"redis": map[string]any{
				"addrs": nonNil(r.Addrs), "cluster": r.Cluster, "master_name": r.MasterName, "username": r.Username,
				"password": secret(r.Password), "db": r.DB, "key_prefix": r.KeyPrefix, "timeout": dur(r.Timeout),
				"tls": r.TLS, "tls_ca_file": r.TLSCAFile, "tls_cert_file": r.TLSCertFile, "tls_key_file": r.TLSKeyFile,
				"tls_server_name": r.TLSServerName, "on_unavailable": r.OnUnavailable, "replicas": r.Replicas,
				"pool_size": r.PoolSize, "batch_linger": dur(r.BatchLinger),
			},
		},
		"telemetry": map[string]any{"path": cfg.Telemetry.Path, "retention": dur(cfg.Telemetry.Retention), "queue_size": cfg.Telemetry.QueueSize},
		"events":    map[string]any{"watch_buffer": cfg.Events.WatchBuffer, "max_watchers": cfg.Events.MaxWatchers},
		"log":       map[string]any{"format": cfg.Log.Format, "level": cfg.Log.Level},
		"auth":      map[string]any{"token": secret(cfg.Auth.Token), "operator_token": secret(cfg.Auth.OperatorToken)},
		"calls":     map[string]any{"max_live": cfg.Calls.MaxLive, "idle_timeout": dur(cfg.Calls.IdleTimeout)},
		"scopes":    list.Scopes,
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func secret(s string) string {
	if s == "" {
		return ""
	}
	return redacted
}

func dur(d time.Duration) string { return d.String() }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
