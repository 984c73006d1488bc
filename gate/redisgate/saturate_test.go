package redisgate_test

import (
	"math"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestTokenSumSaturates: a report of math.MaxInt64 tokens pins the minute's
// sum at gate.MaxTokenSum on both backends; it never wraps below the TPM
// limit (it read -2 and admitted everything before), and settling back to a
// small count brings the sum down exactly.
func TestTokenSumSaturates(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	for name, b := range map[string]gate.Backend{
		"memory": inmem.New(clock.Now),
		"redis":  newBackend(t, redistest.Start(t).Client(t), redisgate.Options{Clock: clock.Now}),
	} {
		t.Run(name, func(t *testing.T) {
			src := gatetest.Src("s", func(s *gate.Source) { s.Limits.TPM = 1000; s.Limits.Lease = 10 * time.Second })
			settleTokens := func(p gate.Permit, n int64) {
				t.Helper()
				must(b.Settle(ctx, gate.SettleRequest{Scope: "sat", Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: n}))(t)
			}
			p1 := admit(t, ctx, b, "sat", "p1", src).Permit
			settleTokens(p1, math.MaxInt64)
			if got := peek(t, ctx, b, "sat", src).Quota.Tokens; got != gate.MaxTokenSum {
				t.Fatalf("tokens after MaxInt64: %d, want %d", got, int64(gate.MaxTokenSum))
			}
			if adm := admit(t, ctx, b, "sat", "p2", src); adm.Granted {
				t.Fatal("admitted over a saturated TPM")
			}
			p1again := admit(t, ctx, b, "sat", "p3", src) // refused: the sum stays
			if p1again.Granted {
				t.Fatal("admitted over a saturated TPM")
			}
			clock.Advance(time.Duration(gate.Minute+1) * time.Millisecond)
			if got := peek(t, ctx, b, "sat", src).Quota.Tokens; got != 0 {
				t.Fatalf("tokens after the minute: %d, want 0", got)
			}
			p4 := admit(t, ctx, b, "sat", "p4", src).Permit
			settleTokens(p4, 7)
			if got := peek(t, ctx, b, "sat", src).Quota.Tokens; got != 7 {
				t.Fatalf("tokens: %d, want 7", got)
			}
		})
	}
}
