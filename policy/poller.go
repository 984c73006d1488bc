package policy

import "time"

// quietCeiling bounds the poller's backed-off interval (see interval).
const quietCeiling = time.Second

// watch registers a caller held without a certain time; the poller runs
// while there is one. forCapacity: a released permit would help the caller
// (it is not refused by every breaker), so the poller keeps poll_interval.
// unwatch unregisters it.
func (w *waiter) watch(forCapacity bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
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
}

func (w *waiter) unwatch(forCapacity bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
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
}

// run is the poller: one backend read per interval for the whole scope
// while callers are held, which notices what no local signal reports — a
// permit released or a lease expired on another replica, a probe lease that
// ran out, a breaker change whose announcement was lost — and wakes the held
// callers when a source would admit.
func (w *waiter) run() {
	for {
		w.mu.Lock()
		changes := w.changes
		w.mu.Unlock()
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
		if found || w.changes != changes || w.forCapacity > 0 {
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
