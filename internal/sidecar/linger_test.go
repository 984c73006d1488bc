package sidecar

import (
	"testing"

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
