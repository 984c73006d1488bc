package policy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

func benchScope(b *testing.B, sources int) *policy.Scope {
	b.Helper()
	var list []string
	for i := range sources {
		list = append(list, fmt.Sprintf("{name: s%d, max_concurrency: 1000000, rpm: 100000000}", i))
	}
	cfg, err := config.Parse([]byte("scopes:\n  s:\n    sources: ["+strings.Join(list, ", ")+"]\n"), nil)
	if err != nil {
		b.Fatal(err)
	}
	return policy.NewScope(cfg.Scopes["s"], inmem.New(nil), policy.Options{})
}

// cycle is one attempt: open a call, Pick, RecordOutcome(SUCCESS).
func cycle(b *testing.B, ctx context.Context, s *policy.Scope) {
	c := policy.NewCall("c", "s", 10, time.Time{}, time.Now())
	p, err := s.Pick(ctx, c)
	if err != nil || p.Grant == nil {
		b.Fatalf("Pick: %v %+v", err, p)
	}
	if _, err := s.RecordOutcome(ctx, c, policy.Attempt{PermitID: p.Grant.Permit.ID, Outcome: policy.Success, ActualTokens: 12}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAttemptCycle measures one Pick walk plus one outcome on the memory
// backend: go test -run '^$' -bench AttemptCycle -benchmem ./policy/
func BenchmarkAttemptCycle(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("sources=%d", n), func(b *testing.B) {
			s, ctx := benchScope(b, n), context.Background()
			for b.Loop() {
				cycle(b, ctx, s)
			}
		})
		b.Run(fmt.Sprintf("sources=%d/parallel", n), func(b *testing.B) {
			s, ctx := benchScope(b, n), context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					cycle(b, ctx, s)
				}
			})
		})
	}
}
