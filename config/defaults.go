package config

import "time"

// Defaults, as documented in docs/configuration.md.
const (
	DefaultListen         = "127.0.0.1:50051"
	DefaultMaxAttempts    = 3
	DefaultBackoffBase    = time.Second
	DefaultBackoffMax     = 60 * time.Second
	DefaultStallWindow    = 300 * time.Second
	DefaultPollInterval   = 50 * time.Millisecond
	DefaultLeaseGrace     = 5 * time.Second
	DefaultFailThreshold  = 5
	DefaultMinCalls       = 10
	DefaultFailRate       = 0.5
	DefaultWindow         = 60 * time.Second
	DefaultCooldown       = 60 * time.Second
	DefaultMaxCooldown    = 300 * time.Second
	DefaultWeight         = 1
	DefaultMaxConcurrency = 8
	DefaultTimeout        = 300 * time.Second
	DefaultMaxLiveCalls   = 10000
	DefaultCallIdle       = 10 * time.Minute
	DefaultRedisTimeout   = 500 * time.Millisecond
	// MaxRedisPoolSize bounds backend.redis.pool_size.
	MaxRedisPoolSize = 10000
	// DefaultRedisBatchLinger and MaxRedisBatchLinger are
	// backend.redis.batch_linger's default and bound (redisgate's
	// DefaultBatchLinger and MaxBatchLinger: TestBatchLingerBounds).
	DefaultRedisBatchLinger = 2 * time.Millisecond
	MaxRedisBatchLinger     = 100 * time.Millisecond
	DefaultRetention        = 30 * 24 * time.Hour
	DefaultTelemetryQueue   = 8192
	DefaultWatchBuffer      = 1024
	DefaultMaxWatchers      = 64
	DefaultMaxRetryAfter    = 10 * time.Minute
	DefaultTenantWeight     = 1
	DefaultMaxTenants       = 64
	// DefaultMaxRequestBytes is far above the largest valid request (a few
	// KiB) and far below gRPC's 4 MiB.
	DefaultMaxRequestBytes   = 64 << 10
	DefaultMaxStreamsPerConn = 256
	DefaultKeepaliveMinTime  = 10 * time.Second
	DefaultMaxConnectionIdle = 30 * time.Minute
	// DefaultFirstMessageTimeout is far longer than a client takes to send
	// a request after its headers (the same write, as a rule) and short
	// enough that streams that never send one cost nothing lasting.
	DefaultFirstMessageTimeout = 10 * time.Second
	// MaxFirstMessageTimeout bounds limits.first_message_timeout.
	MaxFirstMessageTimeout = 10 * time.Minute
)
