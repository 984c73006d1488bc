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
	polling  bool
	idle     chan struct{} // the last watcher left
}

func newWaiter(poll func() bool, every func() time.Duration) *waiter {
	w := &waiter{
		breakers: newSignal(), capacity: newSignal(), closing: make(chan struct{}),
		poll: poll, every: every, idle: make(chan struct{}, 1),
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
		defer w.watch()()
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
// while there is one. The returned function unregisters it.
func (w *waiter) watch() (unwatch func()) {
	w.mu.Lock()
	w.watchers++
	if !w.polling {
		w.polling = true
		go w.run()
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.watchers--
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
// ran out — and wakes the held callers when a source would admit.
func (w *waiter) run() {
	for w.nap(w.every()) {
		if w.poll() {
			w.found()
		}
	}
}

// nap waits d for the poller, and reports false (the poller stopped) when
// the last watcher left or the waiter closed. A stop meant for a watcher that
// a new one has since replaced does not cut the interval short.
func (w *waiter) nap(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		elapsed := false
		select {
		case <-timer.C:
			elapsed = true
		case <-w.idle:
		case <-w.closing:
		}
		w.mu.Lock()
		if w.watchers == 0 || isClosed(w.closing) {
			w.polling = false
			w.mu.Unlock()
			return false
		}
		w.mu.Unlock()
		if elapsed {
			return true
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
