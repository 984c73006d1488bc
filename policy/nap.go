package policy

import (
	"container/heap"
	"time"
)

// sleep rings h with wakeElapsed after d, through the waiter's one timer,
// and stops ringing it for the wakes it ignores: a held caller refused by
// every breaker, or one in line, is not woken by every release of the scope
// only to park again.
func (w *waiter) sleep(h *holder, d time.Duration, ignored wake) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.slot < 0 {
		h.ring(wakeElapsed) // released: nothing else would end the hold
		return
	}
	if ignored&wakeFreed != 0 {
		w.unlisten(h)
	}
	h.end = time.Now().Add(d)
	heap.Push(&w.naps, h)
	if h.nap == 0 {
		w.arm()
	}
}

// arm sets the timer to the earliest end of a nap. Called with mu held.
func (w *waiter) arm() {
	if len(w.naps) == 0 {
		return // a timer that fires for nothing only re-arms
	}
	d := time.Until(w.naps[0].end)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.expire)
		return
	}
	w.timer.Reset(d)
}

// expire rings the holds whose nap is over and re-arms the timer.
func (w *waiter) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for len(w.naps) > 0 && !w.naps[0].end.After(now) {
		heap.Pop(&w.naps).(*holder).ring(wakeElapsed)
	}
	w.arm()
}

// naps is a heap of holders by the end of their nap.
type naps []*holder

func (n naps) Len() int           { return len(n) }
func (n naps) Less(i, j int) bool { return n[i].end.Before(n[j].end) }
func (n naps) Swap(i, j int) {
	n[i], n[j] = n[j], n[i]
	n[i].nap, n[j].nap = i, j
}
func (n *naps) Push(x any) {
	h := x.(*holder)
	h.nap = len(*n)
	*n = append(*n, h)
}
func (n *naps) Pop() any {
	old := *n
	h := old[len(old)-1]
	old[len(old)-1] = nil
	*n = old[:len(old)-1]
	h.nap = -1
	return h
}
