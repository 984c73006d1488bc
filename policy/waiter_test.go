package policy

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func testWaiter(t *testing.T, poll func() bool) (*waiter, *atomic.Int64) {
	var polls atomic.Int64
	w := newWaiter(func() bool { polls.Add(1); return poll() }, func() time.Duration { return time.Second })
	t.Cleanup(w.close)
	return w, &polls
}

func never() bool { return false }

func TestWaiterHold(t *testing.T) {
	type step struct {
		name      string
		circuit   bool
		act       func(w *waiter, cancel context.CancelFunc)
		wantWoken bool
		wantErr   bool
		wantSlept time.Duration
	}
	for _, st := range []step{
		{name: "NapElapses", wantSlept: 10 * time.Second},
		{name: "BreakerChanged", act: func(w *waiter, _ context.CancelFunc) { w.changed() }, wantWoken: true, wantSlept: time.Second},
		{name: "PermitReleased", act: func(w *waiter, _ context.CancelFunc) { w.freed() }, wantWoken: true, wantSlept: time.Second},
		{name: "ReleaseDoesNotHelpACircuitWait", circuit: true, act: func(w *waiter, _ context.CancelFunc) { w.freed() }, wantSlept: 10 * time.Second},
		{name: "Closed", act: func(w *waiter, _ context.CancelFunc) { w.close() }, wantSlept: time.Second},
		{name: "CallerGone", act: func(_ *waiter, cancel context.CancelFunc) { cancel() }, wantErr: true, wantSlept: time.Second},
	} {
		t.Run(st.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, _ := testWaiter(t, never)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if st.act != nil {
					go func() { time.Sleep(time.Second); st.act(w, cancel) }()
				}
				start := time.Now()
				woken, err := w.hold(ctx, w.ticket(), 10*time.Second, st.circuit, false)
				if woken != st.wantWoken || (err != nil) != st.wantErr || time.Since(start) != st.wantSlept {
					t.Fatalf("hold: woken %v err %v after %v, want woken %v err %v after %v", woken, err, time.Since(start), st.wantWoken, st.wantErr, st.wantSlept)
				}
			})
		})
	}
}

// A change between the ticket and the hold (the caller's read of the
// backend) is not missed.
func TestWaiterTicketBeforeTheRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		tk := w.ticket()
		w.changed()
		if woken, err := w.hold(context.Background(), tk, time.Hour, false, false); !woken || err != nil {
			t.Fatalf("hold after a change since the ticket: woken %v err %v", woken, err)
		}
	})
}

// The poller reads the backend once per interval only while an uncertain
// hold is on, wakes the held callers when a read says a source would admit,
// and stops when the last of them leaves.
func TestWaiterPoller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var admits atomic.Bool
		w, polls := testWaiter(t, admits.Load)
		ctx := context.Background()
		if _, err := w.hold(ctx, w.ticket(), 5*time.Second, false, false); err != nil {
			t.Fatal(err)
		}
		if n := polls.Load(); n != 0 {
			t.Fatalf("a certain hold polled %d times", n)
		}
		start := time.Now()
		woken, _ := w.hold(ctx, w.ticket(), 5*time.Second+time.Millisecond, false, true)
		if woken || polls.Load() != 5 || time.Since(start) != 5*time.Second+time.Millisecond {
			t.Fatalf("uncertain hold: woken %v after %v with %d polls, want 5 polls and not woken", woken, time.Since(start), polls.Load())
		}
		synctest.Wait()
		time.Sleep(time.Hour)
		if n := polls.Load(); n != 5 {
			t.Fatalf("the poller went on without a watcher: %d polls", n)
		}
		admits.Store(true)
		start = time.Now()
		if woken, _ := w.hold(ctx, w.ticket(), time.Hour, false, true); !woken || time.Since(start) != time.Second {
			t.Fatalf("hold with an admitting read: woken %v after %v, want woken after one interval", woken, time.Since(start))
		}
	})
}

// Two holds in a row, the first one's stop meeting the second one's start,
// keep the poller's interval: no read at once.
func TestWaiterPollerKeepsItsIntervalAcrossWatchers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var admits atomic.Bool
		admits.Store(true)
		w, polls := testWaiter(t, admits.Load)
		ctx := context.Background()
		for i := range 3 {
			start := time.Now()
			if woken, _ := w.hold(ctx, w.ticket(), time.Hour, false, true); !woken || time.Since(start) != time.Second {
				t.Fatalf("hold %d: woken %v after %v, want woken after one interval", i, woken, time.Since(start))
			}
		}
		if n := polls.Load(); n != 3 {
			t.Fatalf("%d polls for three intervals", n)
		}
	})
}

// While every held caller is refused by every breaker, the poller's interval
// doubles after each read that finds nothing, up to quietCeiling; a caller
// waiting for capacity brings it back to poll_interval at once, and a read
// that finds a source admissible starts the doubling over.
func TestWaiterPollerBacksOffWhileOnlyBreakersAreAwaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			admits atomic.Bool
			mu     sync.Mutex
			polls  []time.Duration
			start  = time.Now()
		)
		w := newWaiter(func() bool {
			mu.Lock()
			defer mu.Unlock()
			polls = append(polls, time.Since(start))
			return admits.Load()
		}, func() time.Duration { return 100 * time.Millisecond })
		t.Cleanup(w.close)
		expect := func(what string, ms ...int) {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			want := make([]time.Duration, len(ms))
			for i, v := range ms {
				want[i] = time.Duration(v) * time.Millisecond
			}
			if !slices.Equal(polls, want) {
				t.Fatalf("%s: polls at %v, want %v", what, polls, want)
			}
		}
		ctx := context.Background()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := w.hold(ctx, w.ticket(), 4*time.Second, true, true); err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(2550 * time.Millisecond)
		// 100, 200, 400, then 800 ms (1.6 s would pass the ceiling).
		expect("circuit-only", 100, 300, 700, 1500, 2300)
		// A caller for capacity arrives: poll_interval from now on.
		if _, err := w.hold(ctx, w.ticket(), 350*time.Millisecond, false, true); err != nil {
			t.Fatal(err)
		}
		expect("with a caller for capacity", 100, 300, 700, 1500, 2300, 2650, 2750, 2850)
		<-done
		synctest.Wait() // the poller stops with its last watcher

		// A new poller starts at poll_interval; a read that finds a source
		// admissible wakes the callers and starts the doubling over.
		mu.Lock()
		polls, start = nil, time.Now()
		mu.Unlock()
		admits.Store(true)
		if woken, _ := w.hold(ctx, w.ticket(), time.Hour, true, true); !woken {
			t.Fatal("an admitting read did not wake the circuit-only caller")
		}
		admits.Store(false)
		if _, err := w.hold(ctx, w.ticket(), 650*time.Millisecond, true, true); err != nil {
			t.Fatal(err)
		}
		expect("after an admitting read", 100, 200, 400)
	})
}

// Holds with different naps share the waiter's one timer: each ends at its
// own nap, in any order of arrival, and one that leaves early (its caller
// gone) neither ends the others nor is rung later.
func TestWaiterNapsShareOneTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		gone, cancel := context.WithCancel(context.Background())
		start := time.Now()
		var wg sync.WaitGroup
		for _, tc := range []struct {
			nap  time.Duration
			ctx  context.Context
			want time.Duration
			err  bool
		}{
			{nap: 3 * time.Second, ctx: context.Background(), want: 3 * time.Second},
			{nap: 1 * time.Second, ctx: gone, want: 500 * time.Millisecond, err: true},
			{nap: 2 * time.Second, ctx: context.Background(), want: 2 * time.Second},
			{nap: 2 * time.Second, ctx: context.Background(), want: 2 * time.Second},
			{nap: 0, ctx: context.Background(), want: 0},
		} {
			wg.Go(func() {
				woken, err := w.hold(tc.ctx, w.ticket(), tc.nap, false, false)
				if woken || (err != nil) != tc.err || time.Since(start) != tc.want {
					t.Errorf("hold of %v: woken %v err %v after %v, want not woken, error %v, after %v", tc.nap, woken, err, time.Since(start), tc.err, tc.want)
				}
			})
		}
		time.Sleep(500 * time.Millisecond)
		cancel()
		wg.Wait()
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.holders) != 0 || len(w.listeners) != 0 || len(w.naps) != 0 {
			t.Fatalf("after every hold ended: %d holders, %d listeners and %d naps left", len(w.holders), len(w.listeners), len(w.naps))
		}
	})
}

// A ticket released without a hold (the read failed, or answered at once)
// leaves nothing behind; a ticket taken after close ends its hold at once.
func TestWaiterTicketReleaseAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		tk := w.ticket()
		w.release(tk)
		w.release(tk)
		w.changed()
		if n, l := len(w.holders), len(w.listeners); n != 0 || l != 0 {
			t.Fatalf("%d holders and %d listeners after release", n, l)
		}
		w.close()
		start := time.Now()
		if woken, err := w.hold(context.Background(), w.ticket(), time.Hour, false, false); woken || err != nil || time.Since(start) != 0 {
			t.Fatalf("hold after close: woken %v err %v after %v, want an answer at once, not woken", woken, err, time.Since(start))
		}
	})
}

// A slot the line hands a call in line ends its hold; one handed while the
// call is not held (between its Pick and its hold, or just after a hold
// that ended otherwise) ends the next hold at once, until a Pick spends it.
// A release elsewhere does not wake a call in line.
func TestLineHandsASlotToTheHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		l := newLine()
		c := &Call{ID: "c-1"}
		l.held[c.ID] = &held{}
		hold := func(nap time.Duration, act func()) (bool, time.Duration) {
			t.Helper()
			tk := w.ticket()
			if !l.attach(c, tk) {
				t.Fatal("attach: the call is in line, reported not")
			}
			defer l.detach(c, tk, 0)
			if act != nil {
				go func() { time.Sleep(time.Second); act() }()
			}
			start := time.Now()
			woken, err := w.hold(context.Background(), tk, nap, false, false)
			if err != nil {
				t.Fatal(err)
			}
			return woken, time.Since(start)
		}
		if woken, slept := hold(5*time.Second, w.freed); woken || slept != 5*time.Second {
			t.Fatalf("a release woke a call in line: woken %v after %v", woken, slept)
		}
		if woken, slept := hold(5*time.Second, func() { l.wake(c.ID) }); !woken || slept != time.Second {
			t.Fatalf("handed slot: woken %v after %v, want woken after 1s", woken, slept)
		}
		l.held[c.ID].woken = false // a Pick spent it (placed)
		l.wake(c.ID)               // handed between the Pick and the hold
		if woken, slept := hold(5*time.Second, nil); !woken || slept != 0 {
			t.Fatalf("slot handed before the hold: woken %v after %v, want woken at once", woken, slept)
		}
		if l.held[c.ID].handed {
			t.Fatal("the hold took the handed slot; it is still marked handed")
		}
		// Handed after a hold ended otherwise, before it detached: kept.
		l.held[c.ID].woken = false
		tk := w.ticket()
		l.attach(c, tk)
		l.wake(c.ID)
		w.release(tk)
		l.detach(c, tk, 0)
		if !l.held[c.ID].handed {
			t.Fatal("a slot handed to a hold that did not take it was lost")
		}
	})
}

// A held caller that a release does not help (refused by every breaker) is
// not rung by releases at all: with many such callers held, a busy scope's
// releases must not wake each of them only to park it again.
func TestWaiterReleasesDoNotRingACircuitHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		tk := w.ticket()
		done := make(chan bool)
		go func() {
			woken, _ := w.hold(context.Background(), tk, time.Hour, true, false)
			done <- woken
		}()
		synctest.Wait() // held
		for range 100 {
			w.freed()
		}
		if n, why := len(tk.bell), tk.why.Load(); n != 0 || why != 0 {
			t.Fatalf("releases rang a circuit hold: bell %d, reasons %b", n, why)
		}
		w.changed()
		if !<-done {
			t.Fatal("a breaker change did not wake the circuit hold")
		}
	})
}

// A breaker change ends every hold and empties the registry and the naps
// at once; a ticket taken before it (a caller still reading) ends its hold
// at once too.
func TestWaiterChangeEndsEveryHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := testWaiter(t, never)
		var wg sync.WaitGroup
		for _, circuit := range []bool{true, false, false} {
			wg.Go(func() {
				if woken, err := w.hold(context.Background(), w.ticket(), time.Hour, circuit, false); !woken || err != nil {
					t.Errorf("hold (circuit %v): woken %v err %v, want woken by the change", circuit, woken, err)
				}
			})
		}
		reading := w.ticket()
		synctest.Wait()
		w.changed()
		w.mu.Lock()
		holders, naps := len(w.holders)+len(w.listeners), len(w.naps)
		w.mu.Unlock()
		if holders != 0 || naps != 0 {
			t.Fatalf("after a change: %d holders, %d naps left", holders, naps)
		}
		wg.Wait()
		start := time.Now()
		if woken, _ := w.hold(context.Background(), reading, time.Hour, false, false); !woken || time.Since(start) != 0 {
			t.Fatalf("hold after a change since its ticket: woken %v after %v, want woken at once", woken, time.Since(start))
		}
	})
}

// BenchmarkWaiterFreedWithDeafHolders: a release with n callers held deaf
// to releases (refused by every breaker, or in line) rings none of them and
// walks none of them.
//
//	go test -run '^$' -bench WaiterFreed -benchmem ./policy/
func BenchmarkWaiterFreedWithDeafHolders(b *testing.B) {
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			w := newWaiter(never, func() time.Duration { return time.Second })
			defer w.close()
			for range n {
				h := w.ticket()
				w.sleep(h, time.Hour, wakeFreed)
			}
			b.ResetTimer()
			for range b.N {
				w.freed()
			}
		})
	}
}
