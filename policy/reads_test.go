package policy

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/gate"
)

// fakeReads is a reads over a backend read that takes a second and records
// when each read started, per token count.
type fakeReads struct {
	*reads
	mu     sync.Mutex
	starts map[int64][]time.Duration
	err    error
}

func newFakeReads(t0 time.Time) *fakeReads {
	f := &fakeReads{starts: make(map[int64][]time.Duration)}
	f.reads = newReads(func(_ context.Context, tokens int64) ([]*source, gate.Snapshot, error) {
		f.mu.Lock()
		f.starts[tokens] = append(f.starts[tokens], time.Since(t0))
		n, err := len(f.starts[tokens]), f.err
		f.mu.Unlock()
		time.Sleep(time.Second)
		return nil, gate.Snapshot{ProgressAge: time.Duration(n)}, err // ProgressAge numbers the read
	})
	return f
}

// Callers asking while a read is in flight share the next read, which starts
// after every one of them asked (never a read that started before); other
// token counts read on their own; and every caller is answered when its read
// ends, so the caller that ran a read on its goroutine did not go on to serve
// the reads gathered behind it.
func TestReadsCoalesceWithoutStaleness(t *testing.T) {
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "Inline", true: "Apart"}[apart], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testCoalesce(t, apart) })
		})
	}
}

func testCoalesce(t *testing.T, apart bool) {
	t0 := time.Now()
	f := newFakeReads(t0)
	type answer struct {
		asked, readStart, answered time.Duration
		read                       int
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	ask := func(tokens int64, at time.Duration) {
		wg.Go(func() {
			time.Sleep(at)
			_, snap, err := f.peek(context.Background(), tokens, apart)
			if err != nil {
				t.Error(err)
				return
			}
			n := int(snap.ProgressAge)
			f.mu.Lock()
			start := f.starts[tokens][n-1]
			f.mu.Unlock()
			mu.Lock()
			answers = append(answers, answer{asked: at, readStart: start, answered: time.Since(t0), read: n})
			mu.Unlock()
		})
	}
	ask(0, 0)
	for i := range 10 {
		ask(0, 100*time.Millisecond+time.Duration(i)*50*time.Millisecond) // during read 1
	}
	ask(0, 1500*time.Millisecond) // during read 2
	ask(7, 100*time.Millisecond)  // another token count
	wg.Wait()
	if got := f.starts[0]; len(got) != 3 || got[0] != 0 || got[1] != time.Second || got[2] != 2*time.Second {
		t.Fatalf("reads for 0 tokens started at %v, want 0s 1s 2s (12 callers, 3 reads)", got)
	}
	if got := f.starts[7]; len(got) != 1 || got[0] != 100*time.Millisecond {
		t.Fatalf("reads for 7 tokens started at %v, want one at 100ms", got)
	}
	for _, a := range answers {
		if a.readStart < a.asked || a.answered != a.readStart+time.Second {
			t.Errorf("a caller that asked at %v was answered at %v by read %d, which started at %v", a.asked, a.answered, a.read, a.readStart)
		}
	}
	if len(answers) != 13 {
		t.Fatalf("%d answers for 13 callers", len(answers))
	}
	synctest.Wait()
	if len(f.keys) != 0 {
		t.Fatalf("%d token counts kept after every read ended", len(f.keys))
	}
}

// A caller that gives up waiting for a read gets its context's error at once;
// the read goes on for the others, who get its result, and an error of the
// read reaches every caller that shared it.
func TestReadsCallerGoneAndErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeReads(time.Now())
		gone, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, _, err := f.peek(context.Background(), 0, false); err != nil {
				t.Errorf("the staying caller: %v", err)
			}
		})
		synctest.Wait() // the staying caller's read is in flight
		start := time.Now()
		if _, _, err := f.peek(gone, 0, false); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("the caller gone after 100ms: %v after %v", err, time.Since(start))
		}
		wg.Wait()

		down := errors.New("backend down")
		f.mu.Lock()
		f.err = down
		f.mu.Unlock()
		for range 3 {
			wg.Go(func() {
				if _, _, err := f.peek(context.Background(), 0, true); !errors.Is(err, down) {
					t.Errorf("a caller sharing a failed read: %v", err)
				}
			})
		}
		wg.Wait()
	})
}

// A caller that asks while a read is in flight gets that read's error when
// it fails, and no read of its own after it: the backend did not answer a
// read that was out all the while the caller asked, and a second one would
// make it wait a second timeout. The next caller reads anew.
func TestReadsShareAFailureWithThoseGatheredBehind(t *testing.T) {
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "Inline", true: "Apart"}[apart], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				f := newFakeReads(t0)
				down := errors.New("backend down")
				f.err = down
				var wg sync.WaitGroup
				for _, at := range []time.Duration{0, 100 * time.Millisecond, 900 * time.Millisecond} {
					wg.Go(func() {
						time.Sleep(at)
						_, _, err := f.peek(context.Background(), 0, apart)
						if !errors.Is(err, down) || time.Since(t0) != time.Second {
							t.Errorf("a caller that asked at %v: %v at %v; want the failed read's error at 1s", at, err, time.Since(t0))
						}
					})
				}
				wg.Wait()
				if got := f.starts[0]; len(got) != 1 {
					t.Fatalf("reads started at %v; want one: the callers behind the failed read share its failure", got)
				}
				f.mu.Lock()
				f.err = nil
				f.mu.Unlock()
				if _, _, err := f.peek(context.Background(), 0, apart); err != nil || len(f.starts[0]) != 2 {
					t.Fatalf("the next caller: %v after %d reads; want a read of its own", err, len(f.starts[0]))
				}
			})
		})
	}
}

// A read run inline runs without its caller's cancellation: a caller that
// gives up during its own read is still answered by it when it ends (as
// main's reads were: a read cut short would cost a Redis connection), and
// the callers gathered behind it get the read after it. A backend that
// panics in an inline read ends that read: the next caller reads anew.
// A read that runs on a goroutine of its own (OnNoRunnable's, and those
// gathered behind another) fails when the backend panics, and the callers
// sharing it get the error: no caller's recovery covers that goroutine, and a
// panic there ended the process.
func TestReadsApartSurviveABackendPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := strings.Repeat("x", 10_000)
		r := newReads(func(context.Context, int64) ([]*source, gate.Snapshot, error) {
			time.Sleep(time.Second) // so that a second caller gathers behind
			panic(long)
		})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				_, _, err := r.peek(context.Background(), 0, true)
				if err == nil || !strings.Contains(err.Error(), "panicked") || len(err.Error()) > 2*maxPanicText {
					t.Errorf("a read whose backend panicked: %.300v, want an error naming the panic, bounded", err)
				}
			})
		}
		wg.Wait()
	})
}

func TestReadsInlineRunsWithoutTheCallersCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		var reads int
		panics := false
		r := newReads(func(ctx context.Context, _ int64) ([]*source, gate.Snapshot, error) {
			reads++
			if panics {
				panic("backend")
			}
			select {
			case <-time.After(time.Second):
				return nil, gate.Snapshot{ProgressAge: time.Duration(reads)}, nil
			case <-ctx.Done():
				return nil, gate.Snapshot{}, fmt.Errorf("backend: %w", ctx.Err())
			}
		})
		gone, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(50 * time.Millisecond) // during the first caller's read
			_, snap, err := r.peek(context.Background(), 0, false)
			if err != nil || snap.ProgressAge != 2 || time.Since(t0) != 2*time.Second {
				t.Errorf("the caller gathered behind: read %d, %v at %v, want read 2 at 2s", snap.ProgressAge, err, time.Since(t0))
			}
		})
		if _, snap, err := r.peek(gone, 0, false); err != nil || snap.ProgressAge != 1 || time.Since(t0) != time.Second {
			t.Fatalf("the caller gone during its own read: read %d, %v at %v, want read 1 at 1s", snap.ProgressAge, err, time.Since(t0))
		}
		wg.Wait()

		panics = true
		func() {
			defer func() { _ = recover() }()
			_, _, _ = r.peek(context.Background(), 0, false)
			t.Fatal("the backend's panic did not reach its caller")
		}()
		panics = false
		if _, snap, err := r.peek(context.Background(), 0, false); err != nil || snap.ProgressAge != 4 {
			t.Fatalf("the read after a panicking one: read %d, %v, want a read of its own (4)", snap.ProgressAge, err)
		}
	})
}

// Callers that ask while a caller leading a read yields, before the read
// starts, share that read: it was sent after they asked. One read answers
// them all, and a caller asking once it is in flight gathers behind it.
func TestReadsLeaderYieldsToCallersAlreadyRunnable(t *testing.T) {
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "Inline", true: "Apart"}[apart], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				f := newFakeReads(t0)
				var wg sync.WaitGroup
				ask := func(want time.Duration) {
					wg.Go(func() {
						_, snap, err := f.peek(context.Background(), 0, apart)
						n := int(snap.ProgressAge)
						f.mu.Lock()
						defer f.mu.Unlock()
						if err != nil || n < 1 || f.starts[0][n-1] != want || time.Since(t0) != want+time.Second {
							t.Errorf("a caller was answered at %v by read %d, %v; want the read started at %v", time.Since(t0), n, err, want)
						}
					})
				}
				yields, joined := 0, make(chan struct{})
				f.yield = func() {
					if yields++; yields == 1 {
						for range 5 {
							ask(0) // runnable while the leader yields
						}
						synctest.Wait() // every one of them waits for the leader's read
						close(joined)
					}
				}
				ask(0)
				<-joined
				time.Sleep(500 * time.Millisecond)
				ask(time.Second) // during the leader's read: the next one
				wg.Wait()
				if got := f.starts[0]; len(got) != 2 {
					t.Fatalf("reads started at %v for 7 callers, want 2 (0s and 1s)", got)
				}
			})
		})
	}
}

// A read that callers joined while its leader yielded runs in the leader's
// context (its values, without its cancellation), not in a joiner's.
func TestReadsSharedReadRunsInItsLeadersContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		var got []any
		r := newReads(func(ctx context.Context, _ int64) ([]*source, gate.Snapshot, error) {
			got = append(got, ctx.Value(key{}))
			return nil, gate.Snapshot{}, ctx.Err()
		})
		var wg sync.WaitGroup
		r.yield = func() {
			wg.Go(func() {
				if _, _, err := r.peek(context.WithValue(context.Background(), key{}, "joiner"), 0, false); err != nil {
					t.Error(err)
				}
			})
			synctest.Wait()
		}
		leader, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "leader"))
		cancel()
		if _, _, err := r.peek(leader, 0, false); err != nil {
			t.Fatalf("the leader, cancelled before its read: %v, want the read's answer", err)
		}
		wg.Wait()
		if len(got) != 1 || got[0] != "leader" {
			t.Fatalf("reads ran in the contexts of %v, want one, the leader's", got)
		}
	})
}

// A caller that leads a shared read inline, whose backend panics, answers
// the callers that joined it with the panic's error and re-panics for its
// own recovery; the next caller reads anew.
func TestReadsInlineSharedReadPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		reads := 0
		r := newReads(func(context.Context, int64) ([]*source, gate.Snapshot, error) {
			mu.Lock()
			reads++
			n := reads
			mu.Unlock()
			time.Sleep(time.Second)
			if n == 1 {
				panic("backend")
			}
			return nil, gate.Snapshot{ProgressAge: time.Duration(n)}, nil
		})
		var wg sync.WaitGroup
		r.yield = func() {
			r.yield = func() {}
			for range 3 {
				wg.Go(func() {
					if _, _, err := r.peek(context.Background(), 0, false); err == nil || !strings.Contains(err.Error(), "panicked") {
						t.Errorf("a caller that joined a read whose backend panicked: %v, want the panic's error", err)
					}
				})
			}
			synctest.Wait() // they joined
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the backend's panic did not reach the leader")
				}
			}()
			_, _, _ = r.peek(context.Background(), 0, false)
		}()
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, snap, err := r.peek(ctx, 0, false); err != nil || snap.ProgressAge != 2 {
			t.Fatalf("the caller after: read %d, %v, want a read of its own (2)", snap.ProgressAge, err)
		}
	})
}

// A leader whose read runs apart and that gives up during it stops waiting;
// the callers that joined it get the read, and nothing is kept after it.
func TestReadsApartLeaderGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeReads(time.Now())
		var wg sync.WaitGroup
		f.yield = func() {
			f.yield = func() {}
			for range 3 {
				wg.Go(func() {
					if _, snap, err := f.peek(context.Background(), 0, true); err != nil || snap.ProgressAge != 1 {
						t.Errorf("a caller that joined: read %d, %v, want read 1", snap.ProgressAge, err)
					}
				})
			}
			synctest.Wait()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, _, err := f.peek(ctx, 0, true); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 100*time.Millisecond {
			t.Errorf("the leader that gave up at 100ms: %v after %v", err, time.Since(start))
		}
		wg.Wait()
		synctest.Wait()
		if len(f.keys) != 0 {
			t.Fatalf("%d token counts kept after every read ended", len(f.keys))
		}
	})
}

// A backend read that ends its goroutine without returning or panicking
// (runtime.Goexit: t.FailNow in a test's fake backend) while its caller
// leads a shared read inline fails that read for the callers that joined
// it, and the next caller reads anew: the token count is not left "running"
// for ever behind a read that never ends.
func TestReadsSharedReadGoexitStrandsNoOne(t *testing.T) {
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "Inline", true: "Apart"}[apart], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testGoexit(t, apart) })
		})
	}
}

func testGoexit(t *testing.T, apart bool) {
	var mu sync.Mutex
	reads := 0
	r := newReads(func(context.Context, int64) ([]*source, gate.Snapshot, error) {
		mu.Lock()
		reads++
		n := reads
		mu.Unlock()
		if n == 1 {
			runtime.Goexit()
		}
		return nil, gate.Snapshot{ProgressAge: time.Duration(n)}, nil
	})
	var wg sync.WaitGroup
	r.yield = func() {
		r.yield = func() {}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, _, err := r.peek(ctx, 0, apart); err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the caller that joined the read: %v, want the read's failure at once", err)
			}
		})
		synctest.Wait()
	}
	wg.Go(func() { _, _, _ = r.peek(context.Background(), 0, apart) }) // leads, then Goexit
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, snap, err := r.peek(ctx, 0, apart); err != nil || snap.ProgressAge != 2 {
		t.Fatalf("the caller after: read %d, %v, want a read of its own (2)", snap.ProgressAge, err)
	}
}
