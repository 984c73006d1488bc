package fallback_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
)

// healthy is a shared backend that always answers: a memory backend.
type healthy struct{ *inmem.Backend }

func (healthy) Ping(context.Context) error { return nil }

// BenchmarkHealthyAdmitSettle is what the fallback costs a decision while
// the shared backend answers, per mode: under Local it keeps the shared
// backend's permits out (one lock per grant and per settle).
func BenchmarkHealthyAdmitSettle(b *testing.B) {
	for _, mode := range []fallback.Mode{fallback.FailClosed, fallback.Local} {
		b.Run(mode.String(), func(b *testing.B) {
			ctx := context.Background()
			fb := fallback.New(healthy{inmem.New(nil)}, fallback.Options{Mode: mode, Replicas: 2})
			src := gatetest.Src("s")
			cands := []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = "p" + strconv.Itoa(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				id := ids[i%len(ids)]
				a, err := fb.Admit(ctx, gate.AdmitRequest{Scope: "s", PermitID: id, Candidates: cands})
				if err != nil || !a.Granted {
					b.Fatal(a, err)
				}
				if _, err := fb.Settle(ctx, gate.SettleRequest{Scope: "s", Source: src, PermitID: id, Epoch: a.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
