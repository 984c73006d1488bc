package policy_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// deepPeek is a backend whose Peek runs deep in the stack, as go-redis's
// does (a Redis read grew an RPC's stack to 16 KB).
type deepPeek struct{ gate.Backend }

func (d deepPeek) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	var snap gate.Snapshot
	var err error
	descend(64, func() { snap, err = d.Backend.Peek(ctx, req) })
	return snap, err
}

// descend calls f under n frames of about 1 KB each.
//
//go:noinline
func descend(n int, f func()) byte {
	var pad [1024]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		f()
	} else {
		pad[0] = descend(n-1, f)
	}
	return pad[n%len(pad)]
}

// A caller held in OnNoRunnable does not keep the stack its backend read
// needed: the read runs apart from the caller's goroutine, which then parks
// for as long as the wait lasts (a held call's memory, docs/performance.md).
func TestHeldCallersDoNotKeepTheBackendReadsStack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := config.Parse([]byte("scopes:\n  s:\n"+indent(`
circuit_open: wait
backpressure: {stall_window: 600s}
sources: [{name: only}]
`)), nil)
		if err != nil {
			t.Fatal(err)
		}
		s := policy.NewScope(cfg.Scopes["s"], deepPeek{inmem.New(time.Now)}, policy.Options{Rand: half})
		defer s.Close()
		if _, err := s.Override(ctx(t), "only", gate.ActionForceOpen, "op", "held"); err != nil {
			t.Fatal(err)
		}
		const held = 100
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var wg sync.WaitGroup
		for range held {
			c := newCall(s)
			if p := pick(t, s, c); p.NoRunnable == nil {
				t.Fatalf("Pick on a forced-open source: %+v", p)
			}
			wg.Go(func() {
				if _, err := s.OnNoRunnable(context.Background(), c); err != nil {
					t.Error(err)
				}
			})
			synctest.Wait() // each caller alone: every one starts a read of its own
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perCall := (int64(after.StackInuse) - int64(before.StackInuse)) / held
		s.Close()
		wg.Wait()
		// A read run on the caller's goroutine leaves it 64 KB (32 KB if a GC
		// halves it); apart, a held caller keeps about 4 KB.
		if perCall > 16<<10 {
			t.Fatalf("%d held callers hold %d B of stack each; the 64 KB read stayed with them", held, perCall)
		}
	})
}
