package redisgate_test

import (
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/redistest"
)

// TestDifferential replays random traces on the memory backend and on Redis
// and compares every answer (M3: one trace of operations, one trace of
// decisions).
func TestDifferential(t *testing.T) {
	memory := func(t *testing.T, clock *gatetest.Clock) gate.Backend { return inmem.New(clock.Now) }
	gatetest.Differential(t, 60, 400, memory, factory(redistest.Start(t).Client(t)))
}
