package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// lingerHook makes each call take flight of bubble time before it is sent,
// and records when it was sent and how many ops it carried.
type lingerHook struct {
	redistest.PassThrough
	flight time.Duration
	mu     sync.Mutex
	start  time.Time
	calls  []string // "at ms: ops"
}

func (h *lingerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) >= 3 && strings.EqualFold(toString(a[0]), "fcall") && toString(a[1]) == redisgate.Function {
			nkeys, _ := a[2].(int)
			n := countOps(a[3+nkeys:])
			h.mu.Lock()
			record := !h.start.IsZero()
			if record {
				h.calls = append(h.calls, fmt.Sprintf("%v: %d", time.Since(h.start), n))
			}
			h.mu.Unlock()
			if record {
				time.Sleep(h.flight)
			}
		}
		return next(ctx, cmd)
	}
}

// lingerBubble runs f in a synctest bubble with a Backend of linger on a
// fresh server, its scope "s" warmed up, and the hook recording from f's
// start, each call taking 4ms.
func lingerBubble(t *testing.T, linger time.Duration, f func(b *redisgate.Backend, src *gate.Source, at func(d time.Duration, op func()))) (calls []string, stats redisgate.BatchStats) {
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer c.Close()
		h := &lingerHook{flight: 4 * time.Millisecond}
		c.AddHook(h)
		b := newBackend(t, c, redisgate.Options{BatchLinger: linger})
		src := gatetest.Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1000 })
		ctx := context.Background()
		settle(t, ctx, b, "s", src, admit(t, ctx, b, "s", "warm", src).Permit, gate.VerdictSuccess)
		before := b.BatchStats()
		h.mu.Lock()
		h.start = time.Now()
		h.mu.Unlock()
		var wg sync.WaitGroup
		f(b, src, func(d time.Duration, op func()) {
			wg.Go(func() {
				time.Sleep(d)
				op()
			})
		})
		wg.Wait()
		h.mu.Lock()
		calls = slices.Clone(h.calls)
		h.mu.Unlock()
		after := b.BatchStats()
		stats = redisgate.BatchStats{Calls: after.Calls - before.Calls, Ops: after.Ops - before.Ops, Lingered: after.Lingered - before.Lingered}
	})
	return calls, stats
}

// admitAt admits permit id at d (after f's start).
func admitAt(t *testing.T, b *redisgate.Backend, src *gate.Source, at func(time.Duration, func()), d time.Duration, id string) {
	at(d, func() {
		if _, err := b.Admit(context.Background(), admitReq("s", id, src)); err != nil {
			t.Errorf("admit %s: %v", id, err)
		}
	})
}

// firstBatch starts every scenario: A admitted at 0 goes alone (back at
// 4ms), B and C admitted at 1ms go together at 4ms (back at 8ms), and the
// drain lingers after them.
func firstBatch(t *testing.T, b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
	admitAt(t, b, src, at, 0, "A")
	admitAt(t, b, src, at, time.Millisecond, "B")
	admitAt(t, b, src, at, time.Millisecond, "C")
}

// After a call of two ops or more, the next batch waits as long as that
// call took (4ms), at most the linger, for the ops that arrive meanwhile;
// after an op alone, or with the linger off, it goes at once. A sent at 0
// alone (back at 4ms), B and C queued at 1ms go together at 4ms (back at
// 8ms), D queued at 5ms waits, and E queued at 9ms joins it.
func TestBatchLingers(t *testing.T) {
	ops := func(b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
		firstBatch(t, b, src, at)
		admitAt(t, b, src, at, 5*time.Millisecond, "D")
		admitAt(t, b, src, at, 9*time.Millisecond, "E")
	}
	for _, tc := range []struct {
		name    string
		linger  time.Duration
		calls   []string
		stats   redisgate.BatchStats
		explain string
	}{
		{"as long as the call took", 10 * time.Millisecond, []string{"0s: 1", "4ms: 2", "12ms: 2"},
			redisgate.BatchStats{Calls: 3, Ops: 5, Lingered: 4 * time.Millisecond}, "D waits from 8ms for 4ms, E joins it"},
		{"at most the linger", 2 * time.Millisecond, []string{"0s: 1", "4ms: 2", "10ms: 2"},
			redisgate.BatchStats{Calls: 3, Ops: 5, Lingered: 2 * time.Millisecond}, "D waits from 8ms for 2ms, E joins it"},
		{"off", -1, []string{"0s: 1", "4ms: 2", "8ms: 1", "12ms: 1"},
			redisgate.BatchStats{Calls: 4, Ops: 5}, "D goes alone at 8ms, E alone after it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls, stats := lingerBubble(t, tc.linger, ops)
			if !slices.Equal(calls, tc.calls) || stats != tc.stats {
				t.Errorf("calls %q, %+v; want %q, %+v (%s)", calls, stats, tc.calls, tc.stats, tc.explain)
			}
		})
	}
}

// A linger ends once a full batch (64 ops) waits: 63 queued at 5ms, while
// B and C's batch is in flight, and the 64th at 9ms, a millisecond into the
// linger, go at 9ms.
func TestBatchLingerEndsFull(t *testing.T) {
	calls, stats := lingerBubble(t, 10*time.Millisecond, func(b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
		firstBatch(t, b, src, at)
		for i := range 63 {
			admitAt(t, b, src, at, 5*time.Millisecond, fmt.Sprint("D", i))
		}
		admitAt(t, b, src, at, 9*time.Millisecond, "E")
	})
	want := []string{"0s: 1", "4ms: 2", "9ms: 64"}
	if !slices.Equal(calls, want) || stats.Lingered != time.Millisecond {
		t.Errorf("calls %q, lingered %v; want %q, 1ms", calls, stats.Lingered, want)
	}
}

// A caller whose context ends while its op lingers stops waiting then, not
// at the linger's end, and its admit is never sent: D, queued at 5ms with a
// deadline at 10ms, answers its deadline at 10ms; E goes alone at 12ms.
func TestBatchLingerCallerGivesUp(t *testing.T) {
	var gaveUp time.Duration
	var gaveErr error
	calls, stats := lingerBubble(t, 10*time.Millisecond, func(b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
		start := time.Now()
		firstBatch(t, b, src, at)
		at(5*time.Millisecond, func() {
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(10*time.Millisecond))
			defer cancel()
			_, gaveErr = b.Admit(ctx, admitReq("s", "D", src))
			gaveUp = time.Since(start)
		})
		admitAt(t, b, src, at, 9*time.Millisecond, "E")
	})
	want := []string{"0s: 1", "4ms: 2", "12ms: 1"}
	if !slices.Equal(calls, want) || stats.Ops != 4 {
		t.Errorf("calls %q, %d ops; want %q, 4 (D never sent)", calls, stats.Ops, want)
	}
	if !errors.Is(gaveErr, context.DeadlineExceeded) || gaveUp != 10*time.Millisecond {
		t.Errorf("D answered %v at %v; want its deadline at 10ms", gaveErr, gaveUp)
	}
}

// A full batch waiting when the call before returns goes at once: 70 ops
// queued at 5ms, while B and C's batch is in flight, go as 64 at 8ms, no
// linger; the 6 left linger after them (from 12ms).
func TestBatchNoLingerWhenFull(t *testing.T) {
	calls, stats := lingerBubble(t, 10*time.Millisecond, func(b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
		firstBatch(t, b, src, at)
		for i := range 70 {
			admitAt(t, b, src, at, 5*time.Millisecond, fmt.Sprint("D", i))
		}
	})
	want := []string{"0s: 1", "4ms: 2", "8ms: 64", "16ms: 6"}
	if !slices.Equal(calls, want) || stats.Lingered != 4*time.Millisecond {
		t.Errorf("calls %q, lingered %v; want %q, 4ms (the last only)", calls, stats.Lingered, want)
	}
}

// More ops than a batch arriving during a linger end it and wait for the
// next (none blocks): D waits from 8ms, 70 more come at 9ms, 64 go then
// and the other 7 linger after them (from 13ms).
func TestBatchLingerMoreThanFull(t *testing.T) {
	calls, _ := lingerBubble(t, 10*time.Millisecond, func(b *redisgate.Backend, src *gate.Source, at func(time.Duration, func())) {
		firstBatch(t, b, src, at)
		admitAt(t, b, src, at, 5*time.Millisecond, "D")
		for i := range 70 {
			admitAt(t, b, src, at, 9*time.Millisecond, fmt.Sprint("E", i))
		}
	})
	want := []string{"0s: 1", "4ms: 2", "9ms: 64", "17ms: 7"}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %q; want %q", calls, want)
	}
}
