package sidecar

import (
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/redisgate"
)

// backend.redis.batch_linger's default and bound are redisgate's.
func TestBatchLingerBounds(t *testing.T) {
	if config.DefaultRedisBatchLinger != redisgate.DefaultBatchLinger || config.MaxRedisBatchLinger != redisgate.MaxBatchLinger {
		t.Errorf("config's batch_linger default %v, most %v; redisgate's %v, %v", config.DefaultRedisBatchLinger,
			config.MaxRedisBatchLinger, redisgate.DefaultBatchLinger, redisgate.MaxBatchLinger)
	}
}

// batch_linger: 0s is no linger in redisgate (whose zero is its default);
// any other value passes as it is.
func TestBatchLingerOffIsOff(t *testing.T) {
	for configured, want := range map[time.Duration]time.Duration{0: -1, time.Millisecond: time.Millisecond, config.DefaultRedisBatchLinger: config.DefaultRedisBatchLinger} {
		if got := batchLinger(configured); got != want {
			t.Errorf("batch_linger %v: Options.BatchLinger %v, want %v", configured, got, want)
		}
	}
}
