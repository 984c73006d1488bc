package inmem_test

import (
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
)

func TestContract(t *testing.T) {
	gatetest.Run(t, func(t *testing.T, clock *gatetest.Clock) gate.Backend {
		return inmem.New(clock.Now)
	})
}
