package policy

import (
	"context"
	"sync"

	"github.com/polygate/polygate/gate"
)

// reads coalesces the scope's plain reads of the backend (Peek of every
// source, no line) for OnNoRunnable's decision and RetryAfter. A read that
// carries a line (a caller taking its place in it, the poller renewing this
// replica's lease) is its caller's own. (Before the line moved into the
// backend, sharing the poller's read made cmd/sidecar
// TestHandoffWakesOnlyTheHead wake a second waiter per release.)
//
// Freshness: a caller is answered by a read whose request was built and sent
// after the caller asked, so its answer is never staler than a read of its
// own. Callers asking while a read for the same token count is in flight
// share the next one, which starts when that one ends; so per token count
// there is at most one read in flight and one gathering callers, and n
// concurrent callers cost about one read per read time instead of n.
//
// A read runs on the goroutine of the caller that starts it, unless that
// caller asks for it apart: OnNoRunnable's caller then parks for minutes, and
// a backend's deep call (go-redis) would have grown its stack to 16 KB
// (docs/performance.md, "What a held call costs"). A read apart runs on a
// goroutine of its own. Reads that gathered behind a read run on a goroutine
// of their own too, one after the other, so no caller serves others' reads
// after its own.
type reads struct {
	// do reads every current source of the scope for an attempt of tokens.
	do func(ctx context.Context, tokens int64) ([]*source, gate.Snapshot, error)

	mu   sync.Mutex
	keys map[int64]*readKey // by token count; absent while none is asked for
}

// readKey is the reads of one token count.
type readKey struct {
	running *read // in flight
	next    *read // gathering callers; starts when running ends
}

// read is one Peek and the callers it answers.
type read struct {
	ctx  context.Context
	done chan struct{}
	srcs []*source
	snap gate.Snapshot
	err  error
}

func newReads(do func(ctx context.Context, tokens int64) ([]*source, gate.Snapshot, error)) *reads {
	return &reads{do: do, keys: make(map[int64]*readKey)}
}

// peek reads every source of the scope for an attempt of tokens, sharing the
// read with the callers that ask at the same time, and returns the sources
// read with the snapshot. apart: a read this caller starts runs on another
// goroutine. The read runs without ctx's cancellation (others may share it;
// the backend bounds its own calls); a caller that does not run it stops
// waiting for it when ctx ends.
func (r *reads) peek(ctx context.Context, tokens int64, apart bool) ([]*source, gate.Snapshot, error) {
	r.mu.Lock()
	k := r.keys[tokens]
	if k == nil {
		k = &readKey{}
		r.keys[tokens] = k
	}
	rd, start := k.next, false
	if rd == nil {
		rd = &read{ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
		if k.running == nil {
			k.running, start = rd, true
		} else {
			k.next = rd
		}
	}
	r.mu.Unlock()
	switch {
	case start && apart:
		go r.run(tokens, k, rd, false)
	case start:
		r.run(tokens, k, rd, true)
		return rd.srcs, rd.snap, rd.err
	}
	select {
	case <-rd.done:
		return rd.srcs, rd.snap, rd.err
	case <-ctx.Done():
		return nil, gate.Snapshot{}, ctx.Err()
	}
}

// run does rd, then the reads that gathered behind it, until none is asked;
// inline (on a caller's goroutine), it hands those to a goroutine of their own.
func (r *reads) run(tokens int64, k *readKey, rd *read, inline bool) {
	for rd != nil {
		rd.srcs, rd.snap, rd.err = r.do(rd.ctx, tokens)
		rd.ctx = nil
		close(rd.done)
		r.mu.Lock()
		rd, k.running, k.next = k.next, k.next, nil
		if rd == nil {
			delete(r.keys, tokens)
		}
		r.mu.Unlock()
		if rd != nil && inline {
			go r.run(tokens, k, rd, false)
			return
		}
	}
}
