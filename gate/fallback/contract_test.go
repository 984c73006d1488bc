package fallback_test

import (
	"context"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
)

// answering is a memory backend as the shared one, always answering.
type answering struct{ *inmem.Backend }

func (answering) Ping(context.Context) error { return nil }

// TestContract runs the backend contract on a fallback Backend over a
// shared backend that answers, in both modes: what it adds on the way (the
// room left for permits of the other side, in Local mode) must change no
// decision while the shared backend is there.
func TestContract(t *testing.T) {
	for _, mode := range []fallback.Mode{fallback.FailClosed, fallback.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			gatetest.Run(t, func(t *testing.T, clock *gatetest.Clock) gate.Backend {
				return fallback.New(answering{inmem.New(clock.Now)}, fallback.Options{Mode: mode, Now: clock.Now})
			})
		})
	}
}
