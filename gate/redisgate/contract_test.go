package redisgate_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// factory makes Backends over client whose time is the contract suite's clock.
func factory(client redis.UniversalClient) gatetest.Factory {
	return func(t *testing.T, clock *gatetest.Clock) gate.Backend {
		t.Helper()
		b, err := redisgate.New(client, redisgate.Options{Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestContract(t *testing.T) {
	gatetest.Run(t, factory(redistest.Start(t).Client(t)))
}

func TestContractCluster(t *testing.T) {
	gatetest.Run(t, factory(redistest.StartCluster(t).Client(t)))
}
