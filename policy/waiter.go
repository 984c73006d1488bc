package policy

import (
	"context"
	"sync"
	"time"
)

// waiter holds callers between a refused Pick and their next try: the
// signals that end a hold early, the poller that reads the backend while
// callers are held without a certain time, and the hold itself.
//
// A hold listens to a ticket taken before the caller's read of the backend,
// so that no change between that read and the hold is missed:
//   - breakers fires when a breaker changes in a way a waiting caller cares
//     about, or when the poller finds a source the backend would admit;
//   - capacity fires when a permit is released (not listened to by a caller
//     that every breaker refuses);
//   - closing ends every hold, now and later.
//
// Its lock (mu) and the signals' are leaves: nothing else is locked under
// them, and no backend call is made under them.
type waiter struct {
	breakers *signal
	capacity *signal
	closing  chan struct{}
	once     sync.Once

	// poll reads the backend once and reports whether some source would
	// admit an attempt now; every is the (jittered) interval between reads.
	poll  func() bool
	every func() time.Duration
	// found is told that the poller found a source that would admit; it
	// fires breakers unless the scope hands the slot to its line.
	found func()

	mu       sync.Mutex
	watchers int
	// forCapacity counts the watchers that a released permit would help
	// (not refused by every breaker); quiet counts the poller's reads in a
	// row that found nothing while there were none (see interval).
	forCapacity int
	quiet       int
	polling     bool
	idle        chan struct{} // the last watcher left
	kick        chan struct{} // a watcher for capacity came while the poller was backed off
}

// quietCeiling bounds the poller's backed-off interval (see interval).
const quietCeiling = time.Second

func newWaiter(poll func() bool, every func() time.Duration) *waiter {
	w := &waiter{
		breakers: newSignal(), capacity: newSignal(), closing: make(chan struct{}),
		poll: poll, every: every, idle: make(chan struct{}, 1), kick: make(chan struct{}, 1),
	}
	w.found = w.breakers.fire
	return w
}

// close ends every hold, now and later.
func (w *waiter) close() { w.once.Do(func() { close(w.closing) }) }

// ticket is what one hold listens to.
type ticket struct{ changed, freed <-chan struct{} }

// ticket takes the wake-ups; take it before reading the backend.
func (w *waiter) ticket() ticket {
	return ticket{changed: w.breakers.wait(), freed: w.capacity.wait()}
}

// hold holds a caller for at most nap, and reports whether a change ended
// the hold early. circuit: the caller is refused by every breaker, so a
// released permit does not help it. uncertain: the caller has no certain time
// to wait for, so the poller runs while it is held. A hold ended by close or
// by nap elapsing is not woken; one ended by ctx returns ctx's error.
func (w *waiter) hold(ctx context.Context, t ticket, nap time.Duration, circuit, uncertain bool) (woken bool, err error) {
	if circuit {
		t.freed = nil
	}
	if uncertain {
		defer w.watch(!circuit)()
	}
	timer := time.NewTimer(nap)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-t.changed:
		return true, nil
	case <-t.freed:
		return true, nil
	case <-w.closing:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return false, nil
}

// watch registers a caller held without a certain time; the poller runs
// while there is one. forCapacity: a released permit would help the caller
// (it is not refused by every breaker), so the poller keeps poll_interval.
// The returned function unregisters it.
func (w *waiter) watch(forCapacity bool) (unwatch func()) {
	w.mu.Lock()
	w.watchers++
	if forCapacity {
		w.forCapacity++
		if w.quiet > 0 {
			w.quiet = 0
			select {
			case w.kick <- struct{}{}: // the poller naps poll_interval from now, not its backed-off interval
			default:
			}
		}
	}
	if !w.polling {
		w.polling = true
		go w.run()
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.watchers--
		if forCapacity {
			w.forCapacity--
		}
		if w.watchers == 0 {
			select {
			case w.idle <- struct{}{}: // the poller stops now, not at its next tick
			default:
			}
		}
		w.mu.Unlock()
	}
}

// run is the poller: one backend read per interval for the whole scope
// while callers are held, which notices what no local signal reports — a
// permit released or a lease expired on another replica, a probe lease that
// ran out, a breaker change whose announcement was lost — and wakes the held
// callers when a source would admit.
func (w *waiter) run() {
	for {
		changed := w.breakers.wait()
		poll, ok := w.nap(w.interval())
		if !ok {
			return
		}
		if !poll {
			continue // kicked: nap again, poll_interval this time
		}
		found := w.poll()
		if found {
			w.found()
		}
		w.mu.Lock()
		if found || isClosed(changed) || w.forCapacity > 0 {
			w.quiet = 0
		} else {
			w.quiet++
		}
		w.mu.Unlock()
	}
}

// interval is the poller's next nap. While a held caller waits for capacity
// it is every() (poll_interval, jittered): a permit released on another
// replica is announced by nothing. While every held caller is refused by
// every breaker, what the callers wait for is a breaker change, which this
// replica's own decisions signal and the Redis backend's announcements
// report; the poll only catches what those miss (a lost announcement, a
// probe lease that ran out). So after each read in a row that found nothing,
// with no breaker change meanwhile, the interval doubles, up to quietCeiling
// (or every(), if that is longer).
func (w *waiter) interval() time.Duration {
	d := w.every()
	w.mu.Lock()
	quiet := w.quiet
	w.mu.Unlock()
	for range min(quiet, 32) {
		if 2*d > quietCeiling {
			break
		}
		d *= 2
	}
	return d
}

// nap waits d for the poller. It reports ok false (the poller stopped) when
// the last watcher left or the waiter closed, and poll false when a watcher
// for capacity cut a backed-off interval short. A stop meant for a watcher
// that a new one has since replaced does not cut the interval short.
func (w *waiter) nap(d time.Duration) (poll, ok bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		elapsed, kicked := false, false
		select {
		case <-timer.C:
			elapsed = true
		case <-w.kick:
			kicked = true
		case <-w.idle:
		case <-w.closing:
		}
		w.mu.Lock()
		if w.watchers == 0 || isClosed(w.closing) {
			w.polling, w.quiet = false, 0
			w.mu.Unlock()
			return false, false
		}
		w.mu.Unlock()
		if elapsed || kicked {
			return elapsed, true
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
