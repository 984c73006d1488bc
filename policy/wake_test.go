package policy

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// many holds with random naps, tickets taken before a
// random read, callers that leave, and releases and breaker changes rung at
// random moments. Every hold ends by its nap at the latest; one not woken and
// not gone ends exactly at its nap; one woken was rung by something rung after
// its ticket (a release only for a hold a release helps); and nothing is left
// in the registry or the naps.
func TestWaiterStress(t *testing.T) {
	for seed := range uint64(20) {
		synctest.Test(t, func(t *testing.T) {
			w, _ := testWaiter(t, never)
			r := rand.New(rand.NewPCG(seed, 1))
			var changedStarted, changedDone, freedStarted, freedDone atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			driver := rand.New(rand.NewPCG(seed, 2))
			var dwg sync.WaitGroup
			dwg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(driver.IntN(50)) * time.Millisecond):
					}
					if driver.IntN(10) == 0 {
						changedStarted.Add(1)
						w.changed()
						changedDone.Add(1)
					} else {
						freedStarted.Add(1)
						w.freed()
						freedDone.Add(1)
					}
				}
			})
			for range 300 {
				before := time.Duration(r.IntN(2000)) * time.Millisecond
				read := time.Duration(r.IntN(3)) * time.Millisecond
				nap := time.Duration(r.IntN(3000)) * time.Millisecond
				circuit := r.IntN(2) == 0
				leave := time.Duration(-1)
				if r.IntN(5) == 0 {
					leave = time.Duration(r.IntN(3000)) * time.Millisecond
				}
				wg.Go(func() {
					time.Sleep(before)
					cd0, fd0 := changedDone.Load(), freedDone.Load()
					tk := w.ticket()
					time.Sleep(read)
					ctx := context.Background()
					if leave >= 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, leave)
						defer cancel()
					}
					start := time.Now()
					woken, err := w.hold(ctx, tk, nap, circuit, false)
					slept := time.Since(start)
					cs1, fs1 := changedStarted.Load(), freedStarted.Load()
					switch {
					case slept > nap:
						t.Errorf("hold of %v (circuit %v) ended after %v", nap, circuit, slept)
					case err != nil:
						if leave < 0 || slept != leave {
							t.Errorf("hold of %v: error %v after %v, caller leaves at %v", nap, err, slept, leave)
						}
					case woken:
						byChange := cs1 > cd0
						byRelease := !circuit && fs1 > fd0
						if !byChange && !byRelease {
							t.Errorf("hold of %v (circuit %v) woken after %v with nothing rung since its ticket", nap, circuit, slept)
						}
					default:
						if slept != nap {
							t.Errorf("hold of %v (circuit %v) not woken, ended after %v", nap, circuit, slept)
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			dwg.Wait()
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.holders) != 0 || len(w.naps) != 0 {
				t.Fatalf("%d holders, %d naps left", len(w.holders), len(w.naps))
			}
		})
	}
}

// a slot the line hands a call is never lost, whatever the
// moment it is handed (before the ticket, between attach and the hold, during
// the hold, after the hold ended, after detach): once its hold is detached,
// either that hold was woken, or the slot is kept for the next hold, which
// then ends at once.
func TestLineHandedSlotNeverLost(t *testing.T) {
	for seed := range uint64(50) {
		synctest.Test(t, func(t *testing.T) {
			w, _ := testWaiter(t, never)
			l := newLine()
			c := &Call{ID: "c-1"}
			l.held[c.ID] = &held{}
			r := rand.New(rand.NewPCG(seed, 3))
			stop := make(chan struct{})
			var dwg sync.WaitGroup
			dr := rand.New(rand.NewPCG(seed, 4))
			dwg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(dr.IntN(30)) * time.Millisecond):
					}
					l.wake(c.ID)
				}
			})
			for range 200 {
				tk := w.ticket()
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
				l.attach(c, tk)
				woken, err := w.hold(context.Background(), tk, time.Duration(r.IntN(40))*time.Millisecond, false, false)
				if err != nil {
					t.Fatal(err)
				}
				if r.IntN(2) == 0 {
					time.Sleep(time.Millisecond)
				}
				l.detach(c, tk, 0)
				w.release(tk)
				l.mu.Lock()
				h := l.held[c.ID]
				if h.woken && !woken && !h.handed {
					l.mu.Unlock()
					t.Fatal("a slot handed to the call was lost: not woken, not kept")
				}
				if woken {
					h.woken, h.handed = false, false // its Pick spends the slot (placed)
				}
				l.mu.Unlock()
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
			}
			close(stop)
			dwg.Wait()
		})
	}
}
