package policy

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// waiter holds callers between a refused Pick and their next try: the
// wake-ups that end a hold early, the poller that reads the backend while
// callers are held without a certain time, and the hold itself.
//
// A caller takes a ticket (a holder) before its read of the backend, so that
// no change between that read and the hold is missed; every wake-up rings
// the holders registered at that moment:
//   - changed: a breaker changed in a way a waiting caller cares about, or
//     the poller found a source the backend would admit;
//   - freed: a permit was released (ignored by a caller that every breaker
//     refuses, and by one in line, which its line wakes instead);
//   - close ends every hold, now and later.
//
// Each held caller parks on two channels, its holder's and its RPC's
// context; the naps end through one timer per waiter (the earliest end of a
// nap), not a timer per caller. Its lock (mu) is a leaf: nothing else is
// locked under it, and no backend call is made under it.
type waiter struct {
	closing chan struct{} // closed by close; the poller listens to it
	once    sync.Once

	// poll reads the backend once and reports whether some source would
	// admit an attempt now; every is the (jittered) interval between reads.
	poll  func() bool
	every func() time.Duration
	// found is told that the poller found a source that would admit; it
	// rings changed unless the scope hands the slot to its line.
	found func()

	mu      sync.Mutex
	holders []*holder // every caller between its ticket and the end of its hold
	// listeners are the holders a release may help: all but those held
	// deaf to releases (see sleep), so that a release rings them without
	// walking 10 000 callers held by their breakers.
	listeners []*holder
	closed    bool
	changes   uint64 // breaker changes rung so far (the poller's backoff)
	naps      naps   // the holds' ends, earliest first
	timer     *time.Timer
	// watchers count the callers held without a certain time (the poller
	// runs while there is one); forCapacity those of them that a released
	// permit would help (not refused by every breaker); quiet counts the
	// poller's reads in a row that found nothing while there were none (see
	// interval).
	watchers    int
	forCapacity int
	quiet       int
	polling     bool
	idle        chan struct{} // the last watcher left
	kick        chan struct{} // a watcher for capacity came while the poller was backed off
}

// wake is why a holder was rung.
type wake uint32

const (
	wakeChanged wake = 1 << iota // a breaker changed, or a source would admit
	wakeFreed                    // a permit was released
	wakeHanded                   // its line handed the caller a slot
	wakeElapsed                  // its nap is over
	wakeClosed                   // the waiter closed
)

// holder is one caller from its ticket to the end of its hold: every wake-up
// rings its one channel and says why.
type holder struct {
	bell chan struct{} // one slot: rung since the hold last looked
	why  atomic.Uint32 // the wakes rung since the hold last looked
	gone atomic.Bool   // released (by release, or by a wake that ends every hold)
	// inLine: the caller is in a line, which wakes it with a handed slot;
	// a release elsewhere does not help it. Set before the hold, on its
	// goroutine (line.attach).
	inLine bool

	// Guarded by waiter.mu.
	end   time.Time // the nap's end
	slot  int       // index in waiter.holders (-1: released)
	heard int       // index in waiter.listeners (-1: deaf to releases, or released)
	nap   int       // index in waiter.naps (-1: none)
}

func (h *holder) ring(why wake) {
	h.why.Or(uint32(why))
	select {
	case h.bell <- struct{}{}:
	default:
	}
}

func newWaiter(poll func() bool, every func() time.Duration) *waiter {
	w := &waiter{
		closing: make(chan struct{}), poll: poll, every: every,
		idle: make(chan struct{}, 1), kick: make(chan struct{}, 1),
	}
	w.found = w.changed
	return w
}

// close ends every hold, now and later.
func (w *waiter) close() {
	w.once.Do(func() {
		close(w.closing)
		w.ringAll(wakeClosed)
	})
}

// changed wakes the held callers: a breaker changed, or a source would
// admit.
func (w *waiter) changed() { w.ringAll(wakeChanged) }

// freed wakes the held callers that a released permit may help.
func (w *waiter) freed() { w.ringAll(wakeFreed) }

func (w *waiter) ringAll(why wake) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch why {
	case wakeChanged:
		w.changes++
	case wakeClosed:
		w.closed = true
	}
	if why == wakeFreed {
		for _, h := range w.listeners {
			h.ring(why)
		}
		return
	}
	// A breaker change or close ends every hold: the holders leave here,
	// under one lock, rather than one by one as 10 000 woken goroutines.
	for i, h := range w.holders {
		h.ring(why)
		h.slot, h.heard, h.nap = -1, -1, -1
		h.gone.Store(true)
		w.holders[i] = nil
	}
	w.holders = w.holders[:0]
	clear(w.listeners)
	w.listeners = w.listeners[:0]
	clear(w.naps)
	w.naps = w.naps[:0]
	if w.timer != nil {
		w.timer.Stop()
	}
}

// ticket registers a caller for the wake-ups; take it before reading the
// backend, and release it when done (hold releases it too).
func (w *waiter) ticket() *holder {
	h := &holder{bell: make(chan struct{}, 1), nap: -1}
	w.mu.Lock()
	defer w.mu.Unlock()
	h.slot, h.heard = len(w.holders), len(w.listeners)
	w.holders = append(w.holders, h)
	w.listeners = append(w.listeners, h)
	if w.closed {
		h.ring(wakeClosed)
	}
	return h
}

// release unregisters a holder; releasing it again does nothing.
func (w *waiter) release(h *holder) {
	if h.gone.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	h.gone.Store(true)
	if h.slot >= 0 {
		last := len(w.holders) - 1
		w.holders[h.slot] = w.holders[last]
		w.holders[h.slot].slot = h.slot
		w.holders[last] = nil
		w.holders = w.holders[:last]
		h.slot = -1
	}
	w.unlisten(h)
	if h.nap >= 0 {
		heap.Remove(&w.naps, h.nap)
		if len(w.naps) == 0 {
			w.timer.Stop() // nothing left to end: no timer outlives the holds
		}
	}
}

// hold holds a caller for at most nap, and reports whether a change ended
// the hold early. circuit: the caller is refused by every breaker, so a
// released permit does not help it. uncertain: the caller has no certain time
// to wait for, so the poller runs while it is held. A hold ended by close or
// by nap elapsing is not woken; one ended by ctx returns ctx's error. It
// releases h.
func (w *waiter) hold(ctx context.Context, h *holder, nap time.Duration, circuit, uncertain bool) (woken bool, err error) {
	defer w.release(h)
	ignored := wake(0)
	if circuit || h.inLine {
		ignored = wakeFreed
	}
	if uncertain {
		w.watch(!circuit)
		defer w.unwatch(!circuit)
	}
	w.sleep(h, nap, ignored)
	for {
		select {
		case <-h.bell:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		why := wake(h.why.Swap(0)) &^ ignored
		switch {
		case why&(wakeChanged|wakeFreed|wakeHanded) != 0:
			return true, nil
		case why&(wakeElapsed|wakeClosed) != 0:
			return false, nil
		}
	}
}

// unlisten takes h out of the listeners to releases. Called with mu held.
func (w *waiter) unlisten(h *holder) {
	if h.heard < 0 {
		return
	}
	last := len(w.listeners) - 1
	w.listeners[h.heard] = w.listeners[last]
	w.listeners[h.heard].heard = h.heard
	w.listeners[last] = nil
	w.listeners = w.listeners[:last]
	h.heard = -1
}
