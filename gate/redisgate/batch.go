package redisgate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// Group commit. Most of what a call costs Redis is paid per call (the
// FCALL, the header, TIME, the scope's keys, each source's record), so a
// scope has at most one call in flight, and the Admits and Settles that
// arrive meanwhile go out together as its next call. A call runs its
// settles first, then its admits, each in arrival order: its ops were all
// pending at once, so any order is a legal interleaving, and this one
// frees slots before the admits ask.
//
// Under load the next call lingers: after a call of two ops or more, it
// waits as long as that call took (at most Options.BatchLinger) or until a
// call's worth of ops wait. A lone op on a quiet scope never waits.
//
// A failed call gives back each of its admits and repeats each of its
// settles (giveback.go). A caller that gives up drops its admit if not yet
// sent; a settle is sent all the same, and a permit granted to a caller
// gone is given back.

// maxBatchOps bounds the ops of one call; the ops beyond wait for the next.
const maxBatchOps = 64

// maxQueuedOps bounds the ops of a scope waiting for its next call: one
// beyond fails at once as unavailable (a settle is kept to give back).
var maxQueuedOps = 10000 // a variable for tests

// op is an Admit's, a Settle's or a give-back's part of a call.
type op struct {
	admit    *gate.AdmitRequest
	settle   *gate.SettleRequest
	giveBack *gate.AdmitRequest // give back its permit on its candidates
	// owed: the give-back queue's own (it keeps what fails itself).
	owed bool
	done chan result // one reply, buffered
	// Under batcher.mu: sent in a call; gone, its caller stopped waiting;
	// delivered, its result is in done.
	sent, gone, delivered bool
}

type result struct {
	v   any
	err error
}

func (o *op) scope() string {
	if o.settle != nil {
		return o.settle.Scope
	}
	return o.admission().Scope
}

func (o *op) permit() string {
	if o.settle != nil {
		return o.settle.PermitID
	}
	return o.admission().PermitID
}

// admission is the admit, or the permit to give back.
func (o *op) admission() *gate.AdmitRequest {
	if o.admit != nil {
		return o.admit
	}
	return o.giveBack
}

// addTo adds the op to call c.
func (o *op) addTo(b *Backend, c *call) {
	switch {
	case o.settle != nil:
		c.settle(o.settle)
	case o.admit != nil:
		c.admit(o.admit)
	default:
		c.giveBack(o.giveBack)
	}
}

// batcher keeps each scope's ops between calls.
type batcher struct {
	b      *Backend
	mu     sync.Mutex
	scopes map[string]*queue
	// What was sent (ops / calls is the mean batch), and the time lingered.
	calls, ops atomic.Uint64
	lingered   atomic.Int64
}

// BatchStats counts the calls that carried Admits and Settles, those ops,
// and how long the calls lingered for more.
type BatchStats struct {
	Calls, Ops uint64
	Lingered   time.Duration
}

// BatchStats reports what the Backend's calls carried.
func (b *Backend) BatchStats() BatchStats {
	return BatchStats{Calls: b.batches.calls.Load(), Ops: b.batches.ops.Load(), Lingered: time.Duration(b.batches.lingered.Load())}
}

// queue is a scope's ops waiting for its next call; running while a
// goroutine sends its calls.
type queue struct {
	ops     []*op
	running bool
	// full wakes a lingering drain once a call's worth of ops wait.
	full chan struct{}
}

// do sends o in its scope's next call and returns its reply, waiting at
// most until until (zero: no bound) and as long as ctx.
func (q *batcher) do(ctx context.Context, until time.Time, o *op) (any, error) {
	o.done = make(chan result, 1)
	scope := o.scope()
	q.mu.Lock()
	sq := q.scopes[scope]
	if sq == nil {
		if q.scopes == nil {
			q.scopes = map[string]*queue{}
		}
		sq = &queue{full: make(chan struct{}, 1)}
		q.scopes[scope] = sq
	}
	if len(sq.ops) >= maxQueuedOps {
		q.mu.Unlock()
		if o.settle != nil && !o.owed {
			q.b.owed.add(&op{settle: o.settle})
		}
		return nil, fmt.Errorf("redisgate: %w: %d requests of the scope wait for redis already", gate.ErrUnavailable, len(sq.ops))
	}
	sq.ops = append(sq.ops, o)
	if len(sq.ops) == maxBatchOps {
		select {
		case sq.full <- struct{}{}:
		default:
		}
	}
	if !sq.running {
		sq.running = true
		go q.drain(scope, sq)
	}
	q.mu.Unlock()
	var timeout <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-o.done:
		return r.v, r.err
	case <-ctx.Done():
		return nil, q.abandon(scope, o, fmt.Errorf("redisgate: %w", ctx.Err()))
	case <-timeout:
		return nil, q.abandon(scope, o, fmt.Errorf("redisgate: %w: no answer within %v", gate.ErrUnavailable, q.b.timeout))
	}
}

// abandon is o's caller giving up: an admit not sent yet is dropped, and a
// result that came meanwhile is settled as nobody's.
func (q *batcher) abandon(scope string, o *op, err error) error {
	q.mu.Lock()
	o.gone = true
	if !o.sent && o.settle == nil {
		if sq := q.scopes[scope]; sq != nil {
			if i := slices.Index(sq.ops, o); i >= 0 {
				sq.ops = slices.Delete(sq.ops, i, i+1)
			}
		}
	}
	delivered := o.delivered
	q.mu.Unlock()
	if delivered {
		if r := <-o.done; r.err == nil {
			q.b.orphan(o, r.v)
		}
	}
	return err
}

// drain sends the scope's calls while ops wait.
func (q *batcher) drain(scope string, sq *queue) {
	var took time.Duration // the last call's, when it carried two ops or more
	for {
		q.mu.Lock()
		if len(sq.ops) == 0 {
			sq.running = false
			delete(q.scopes, scope)
			q.mu.Unlock()
			return
		}
		if wait := min(took, q.b.linger); wait > 0 && len(sq.ops) < maxBatchOps {
			q.mu.Unlock()
			q.linger(sq, wait)
			took = 0
			continue
		}
		n := min(len(sq.ops), maxBatchOps)
		ops := slices.Clone(sq.ops[:n])
		sq.ops = slices.Delete(sq.ops, 0, n)
		for _, o := range ops {
			o.sent = true
		}
		q.mu.Unlock()
		// Settles (and give-backs) first, then admits, each in arrival order.
		slices.SortStableFunc(ops, func(a, b *op) int { return cmp.Compare(a.rank(), b.rank()) })
		q.calls.Add(1)
		q.ops.Add(uint64(len(ops)))
		start := time.Now()
		replies, err := q.b.send(scope, ops)
		took = 0
		if len(ops) >= 2 {
			took = time.Since(start)
		}
		for i, o := range ops {
			r := result{err: err}
			if err == nil {
				r.v = replies[i]
			}
			q.deliver(o, r)
		}
	}
}

// linger waits for more ops, at most wait or until a call's worth wait.
func (q *batcher) linger(sq *queue, wait time.Duration) {
	select {
	case <-sq.full: // (a signal of an earlier call's)
	default:
	}
	q.mu.Lock()
	full := len(sq.ops) >= maxBatchOps
	q.mu.Unlock()
	if full {
		return
	}
	start := time.Now()
	t := time.NewTimer(wait)
	select {
	case <-t.C:
	case <-sq.full:
		t.Stop()
	}
	q.lingered.Add(int64(time.Since(start)))
}

func (o *op) rank() int {
	if o.admit != nil {
		return 1
	}
	return 0
}

// deliver hands o its result, or settles it as nobody's when its caller
// is gone. A call that failed owes what each of its ops may have done.
func (q *batcher) deliver(o *op, r result) {
	if r.err != nil && !o.owed {
		switch {
		case o.admit != nil:
			q.b.owed.giveBack(o.admit)
		case o.settle != nil:
			q.b.owed.add(&op{settle: o.settle})
		}
	}
	q.mu.Lock()
	gone := o.gone
	o.delivered = !gone
	q.mu.Unlock()
	if !gone {
		o.done <- r
	} else if r.err == nil {
		q.b.orphan(o, r.v)
	}
}

// send makes one call of ops, bounded by the Backend's timeout and not by
// any caller's context.
func (b *Backend) send(scope string, ops []*op) ([]any, error) {
	c := newCall(b, scope, b.loss.seen(scope))
	for _, o := range ops {
		o.addTo(b, c)
	}
	ctx, cancel := b.bound(context.Background(), time.Time{})
	defer cancel()
	replies, err := b.run(ctx, c)
	if err != nil {
		return nil, b.wrap(context.Background(), "call", err)
	}
	return replies, nil
}

// orphan settles the reply of an op whose caller is gone: a permit it was
// granted (or may have been: a reply that cannot be read) is given back.
func (b *Backend) orphan(o *op, v any) {
	if o.admit == nil {
		return
	}
	if out, unmarked, err := b.admission(o.admit, v); err != nil || (unmarked == nil && out.Granted) {
		b.owed.giveBack(o.admit)
	}
}
