package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/boundedfile"
)

// backend is the configured gate.Backend with what Run needs around it.
type backend struct {
	gate.Backend
	// describe names it for DescribeScope, saying when it is degraded.
	describe func() string
	// stateLoss, for a shared backend, is what it saw of losing a scope's
	// state, for DescribeScope.
	stateLoss func(scope string) gate.StateLoss
	// subscribe, for a shared backend, delivers other replicas' breaker
	// announcements until ctx ends.
	subscribe func(ctx context.Context, handle func(scope string, e gate.Event)) error
	// check, for a shared backend, asks whether it answers; the answer is
	// reported through the health callback like any call's.
	check func(ctx context.Context) error
	// giveBacks, for a shared backend, settles what it owes (permits whose
	// replies were lost, settles that failed) until ctx ends.
	giveBacks func(ctx context.Context)
	// collectors export the backend's own counters on /metrics.
	collectors []prometheus.Collector
	close      func() error
}

// openBackend builds the configured backend. onChange is told, once per
// change, when a shared backend becomes unavailable or comes back; onLoss,
// when a shared backend lost a scope's state (and how many breakers the
// sidecar re-asserted).
func openBackend(cfg *config.Config, log *slog.Logger, onChange func(degraded bool, cause error), onLoss func(scope string, restored int)) (*backend, error) {
	switch cfg.Backend.Kind {
	case "memory":
		mem, err := inmem.Open(inmem.Options{StatePath: cfg.Backend.Memory.StatePath, MaxOpen: maxCooldowns(cfg), Log: log})
		if err != nil {
			return nil, fmt.Errorf("backend.memory.state_path: %w", err)
		}
		return &backend{Backend: mem, describe: func() string { return "memory" }, close: mem.Close}, nil
	case "redis":
		return openRedis(cfg.Backend.Redis, retryEvery(cfg), log, onChange, onLoss)
	}
	return nil, fmt.Errorf("backend.kind %q is not supported", cfg.Backend.Kind)
}

// maxCooldowns bounds the OPEN a state file may hold for a source: its
// breaker.max_cooldown, or, for a source the configuration does not have
// (its scope may come back by a reload), the longest one configured.
func maxCooldowns(cfg *config.Config) func(scope, source string) time.Duration {
	type key struct{ scope, source string }
	by := make(map[key]time.Duration)
	var longest time.Duration
	for name, sc := range cfg.Scopes {
		for _, src := range sc.Sources {
			by[key{name, src.Name}] = src.Breaker.MaxCooldown
			longest = max(longest, src.Breaker.MaxCooldown)
		}
	}
	return func(scope, source string) time.Duration {
		if d, ok := by[key{scope, source}]; ok {
			return d
		}
		return longest
	}
}

// batchLinger is redisgate's Options.BatchLinger for backend.redis.batch_linger:
// the same, but 0 (off) is negative there (a zero Options.BatchLinger is
// its default).
func batchLinger(configured time.Duration) time.Duration {
	if configured == 0 {
		return -1
	}
	return configured
}

// retryEvery is how often owed settles are retried while Redis does not
// answer: the shortest poll_interval of the scopes at start, so a slot comes
// back within one poll interval plus the Redis timeout of Redis's return.
func retryEvery(cfg *config.Config) time.Duration {
	every := config.DefaultPollInterval
	for _, sc := range cfg.Scopes {
		every = min(every, sc.PollInterval)
	}
	return max(every, time.Millisecond)
}

func openRedis(r config.Redis, every time.Duration, log *slog.Logger, onChange func(bool, error), onLoss func(string, int)) (*backend, error) {
	opts := &redis.UniversalOptions{
		Addrs: r.Addrs, IsClusterMode: r.Cluster, MasterName: r.MasterName,
		Username: r.Username, Password: r.Password, DB: r.DB,
		// Every operation is bounded by the configured timeout, never retried
		// behind the sidecar's back: an unavailable Redis answers UNAVAILABLE
		// (or falls back) within one timeout, not seconds later — a dial, a
		// read, a write and a wait for a pooled connection each, and
		// redisgate puts a deadline of the same timeout around every call.
		DialTimeout: r.Timeout, ReadTimeout: r.Timeout, WriteTimeout: r.Timeout, PoolTimeout: r.Timeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		PoolSize: r.PoolSize,
	}
	tc, err := redisTLS(r)
	if err != nil {
		return nil, err
	}
	opts.TLSConfig = tc
	client := redis.NewUniversalClient(opts)
	shared, err := redisgate.New(client, redisgate.Options{Prefix: r.KeyPrefix, Timeout: r.Timeout, BatchLinger: batchLinger(r.BatchLinger), Log: log, OnStateLoss: onLoss})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("backend.redis.key_prefix: %w", err)
	}
	mode := fallback.FailClosed
	if r.OnUnavailable == "local" {
		mode = fallback.Local
	}
	var fb *fallback.Backend
	fb = fallback.New(shared, fallback.Options{
		Mode: mode, Replicas: r.Replicas,
		OnChange: func(degraded bool, cause error) {
			switch {
			case degraded && mode == fallback.Local:
				log.Error("redis backend unavailable", "on_unavailable", r.OnUnavailable, "replicas", r.Replicas, "err", cause,
					"local_breakers_kept", fb.Kept()) // OPEN, HALF_OPEN or overridden, as last seen on Redis
			case degraded:
				log.Error("redis backend unavailable", "on_unavailable", r.OnUnavailable, "replicas", r.Replicas, "err", cause)
			default:
				log.Info("redis backend available again", "on_unavailable", r.OnUnavailable)
			}
			onChange(degraded, cause)
		},
	})
	return &backend{
		Backend: fb,
		describe: func() string {
			switch {
			case !fb.Degraded():
				return "redis"
			case mode == fallback.Local:
				return "redis (unavailable: local fallback)"
			}
			return "redis (unavailable: fail_closed)"
		},
		stateLoss:  shared.StateLoss,
		subscribe:  shared.Subscribe,
		check:      fb.Check,
		giveBacks:  func(ctx context.Context) { shared.RunGiveBacks(ctx, every) },
		collectors: append(redisMetrics(shared), poolMetrics(client, r.PoolSize)...),
		close:      client.Close,
	}, nil
}

// redisTLS is the Redis client's TLS configuration, or nil when
// backend.redis.tls is false: the system roots or backend.redis.tls_ca_file,
// a client certificate when tls_cert_file and tls_key_file are set, and
// tls_server_name when the certificate's name differs from the address.
func redisTLS(r config.Redis) (*tls.Config, error) {
	if !r.TLS {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.TLSServerName}
	if r.TLSCAFile != "" {
		pool, err := boundedfile.CertPool(r.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("backend.redis.tls_ca_file %s: %w", r.TLSCAFile, err)
		}
		c.RootCAs = pool
	}
	if r.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(r.TLSCertFile, r.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("backend.redis.tls_cert_file %s, tls_key_file %s: %w", r.TLSCertFile, r.TLSKeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// announcements delivers other replicas' breaker announcements to the
// server's scopes until ctx ends.
// It also runs the backend's give-backs for as long.
func announcements(ctx context.Context, b *backend, announce func(scope string, e gate.Event), log *slog.Logger) {
	if b.giveBacks != nil {
		go b.giveBacks(ctx)
	}
	if b.subscribe == nil {
		return
	}
	for ctx.Err() == nil {
		err := b.subscribe(ctx, announce)
		if ctx.Err() != nil {
			return
		}
		log.Warn("redis announcements interrupted; cooldown memos may lag until resubscribed", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// redisMetrics export the Redis backend's give-back queue and state checks,
// read at scrape time.
// poolMetrics shows the Redis connection pool against its limit
// (backend.redis.pool_size): a pool that runs out makes calls wait, then
// answer UNAVAILABLE.
func poolMetrics(c redis.UniversalClient, size int) []prometheus.Collector {
	if size == 0 {
		size = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "polygate_redis_pool_connections", Help: "Connections in the Redis client's pool (all nodes)."},
			func() float64 { return float64(c.PoolStats().TotalConns) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "polygate_redis_pool_size", Help: "backend.redis.pool_size: the most connections to each Redis node."},
			func() float64 { return float64(size) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_pool_timeouts_total", Help: "Calls that waited backend.redis.timeout for a pooled connection and got none (raise backend.redis.pool_size)."},
			func() float64 { return float64(c.PoolStats().Timeouts) }),
	}
}

func redisMetrics(b *redisgate.Backend) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "polygate_redis_give_backs_queued", Help: "Settles Redis owes now: permits whose Admit reply was lost, settles that failed."},
			func() float64 { return float64(b.GiveBacks().Queued) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_give_backs_released_total", Help: "Give-backs and repeated settles that freed a slot nobody else would have freed before its lease ended."},
			func() float64 { return float64(b.GiveBacks().Released) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_give_backs_overflowed_total", Help: "Settles lost to a full give-back queue (their slots end with their leases)."},
			func() float64 { return float64(b.GiveBacks().Overflowed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_op_calls_total", Help: "Script calls that carried Admits and Settles: a batch, or one alone (polygate_redis_ops_total / this is the mean batch)."},
			func() float64 { return float64(b.BatchStats().Calls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_ops_total", Help: "Admits and Settles sent to Redis, in batches or alone."},
			func() float64 { return float64(b.BatchStats().Ops) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_batch_linger_seconds_total", Help: "Time the scopes' next batches waited for more ops (backend.redis.batch_linger)."},
			func() float64 { return b.BatchStats().Lingered.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "polygate_redis_state_losses_total", Help: "Scopes found lost by Redis (restart without persistence, failover to an empty replica) and re-asserted."},
			func() float64 { return float64(b.StateLosses()) }),
	}
}
