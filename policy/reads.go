package policy

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
// concurrent callers cost about one read per read time instead of n. A read
// that fails answers the callers gathered behind it with its error (see
// ended), so that no caller waits for two reads of a backend that does not
// answer.
//
// A caller that finds no read in flight leads one: it yields its processor
// once (runtime.Gosched) before the read starts, so that the callers already
// runnable (the RPCs one batch of HTTP/2 frames brought in) ask first and
// share it, instead of gathering behind a read of one caller: at 64 callers
// on Redis, 17–19 RetryAfters per script call instead of 15–16
// (docs/performance.md, "The per-RPC chain and RetryAfter on Redis"). A read
// none joined is its leader's alone and needs no shared record.
//
// A read runs on the goroutine of the caller that leads it, unless that
// caller asks for it apart: OnNoRunnable's caller then parks for minutes, and
// a backend's deep call (go-redis) would have grown its stack to 16 KB
// (docs/performance.md, "What a held call costs"). A read runs without its
// leader's cancellation: a read cut short costs a Redis connection (go-redis
// closes it), and a caller's deadline reaching the socket could read as
// Redis unavailable. A read apart runs on a goroutine of its own.
// Reads that gathered behind a read run on a goroutine of their own too, one
// after the other, so no caller serves others' reads after its own.
type reads struct {
	// do reads every current source of the scope for an attempt of tokens.
	do func(ctx context.Context, tokens int64) ([]*source, gate.Snapshot, error)

	// yield lets the callers already runnable ask before a read starts
	// (runtime.Gosched; tests make them ask).
	yield func()

	mu   sync.Mutex
	keys map[int64]readKey // by token count; absent while none is asked for
}

// readKey is the reads of one token count.
type readKey struct {
	running bool  // a read is in flight
	leading bool  // a caller about to lead a read yields; next is its read
	next    *read // gathering callers; starts when the running read ends, or when the leader is back
}

// read is one Peek shared by the callers it answers.
type read struct {
	ctx  context.Context
	done chan struct{}
	srcs []*source
	snap gate.Snapshot
	err  error
}

func newReads(do func(ctx context.Context, tokens int64) ([]*source, gate.Snapshot, error)) *reads {
	return &reads{do: do, yield: runtime.Gosched, keys: make(map[int64]readKey)}
}

func newRead(ctx context.Context) *read {
	return &read{ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
}

// peek reads every source of the scope for an attempt of tokens, sharing the
// read with the callers that ask at the same time, and returns the sources
// read with the snapshot. apart: a read this caller starts runs on another
// goroutine. A read runs without ctx's cancellation (others may share it;
// the backend bounds its own calls); a caller that does not run it stops
// waiting for it when ctx ends.
func (r *reads) peek(ctx context.Context, tokens int64, apart bool) ([]*source, gate.Snapshot, error) {
	r.mu.Lock()
	k := r.keys[tokens]
	if k.running || k.leading {
		if k.next == nil {
			k.next = newRead(ctx)
			r.keys[tokens] = k
		}
		r.mu.Unlock()
		return wait(ctx, k.next)
	}
	r.keys[tokens] = readKey{leading: true}
	r.mu.Unlock()
	r.yield() // the callers already runnable join the read
	r.mu.Lock()
	rd := r.keys[tokens].next // nil: none joined
	r.keys[tokens] = readKey{running: true}
	r.mu.Unlock()
	switch {
	case rd == nil && !apart:
		return r.alone(ctx, tokens)
	case rd == nil:
		rd = newRead(ctx)
	default:
		rd.ctx = context.WithoutCancel(ctx) // the leader's read, not its first joiner's
	}
	if apart {
		go r.run(tokens, rd)
		return wait(ctx, rd)
	}
	return r.inline(tokens, rd)
}

// alone runs a read of its caller's alone on its goroutine (no shared
// record), then hands the read gathered behind it, if any, to a goroutine of
// its own; also when the backend panics (the caller's recovery answers it),
// so that later callers are not left waiting for a read that never ends.
func (r *reads) alone(ctx context.Context, tokens int64) (srcs []*source, snap gate.Snapshot, err error) {
	defer func() { r.handOn(tokens, err) }()
	return r.do(context.WithoutCancel(ctx), tokens)
}

// inline runs rd, shared with the callers that joined it, on its leader's
// goroutine, then hands on the read gathered behind it. When the backend
// panics, the leader's recovery answers it and the others get an error; so
// they do when it ends the goroutine (runtime.Goexit).
func (r *reads) inline(tokens int64, rd *read) ([]*source, gate.Snapshot, error) {
	answered := false
	defer func() {
		if answered {
			return
		}
		p := recover()
		r.answer(tokens, rd, nil, gate.Snapshot{}, unanswered(p))
		if p != nil {
			panic(p)
		}
	}()
	srcs, snap, err := r.do(rd.ctx, tokens)
	answered = true
	r.answer(tokens, rd, srcs, snap, err)
	return srcs, snap, err
}

// answer answers rd's callers and hands on the read gathered behind it.
func (r *reads) answer(tokens int64, rd *read, srcs []*source, snap gate.Snapshot, err error) {
	rd.srcs, rd.snap, rd.err, rd.ctx = srcs, snap, err, nil
	close(rd.done)
	r.handOn(tokens, err)
}

// handOn notes that the running read of tokens ended with err and runs the
// read gathered behind it, if any, on a goroutine of its own.
func (r *reads) handOn(tokens int64, err error) {
	if next := r.ended(tokens, err); next != nil {
		go r.run(tokens, next)
	}
}

// wait is rd's answer, or ctx's error if ctx ends first.
func wait(ctx context.Context, rd *read) ([]*source, gate.Snapshot, error) {
	select {
	case <-rd.done:
		return rd.srcs, rd.snap, rd.err
	case <-ctx.Done():
		return nil, gate.Snapshot{}, ctx.Err()
	}
}

// run does rd, then the reads that gathered behind it, until none is asked.
// A backend that panics fails the read, whose callers get the error, not
// the process (no caller's recovery covers this goroutine); one that ends
// the goroutine (runtime.Goexit) fails it too, and the reads behind go on
// on another.
func (r *reads) run(tokens int64, rd *read) {
	defer func() {
		if rd != nil {
			r.answer(tokens, rd, nil, gate.Snapshot{}, unanswered(nil))
		}
	}()
	for rd != nil {
		srcs, snap, err := r.guarded(rd.ctx, tokens)
		rd.srcs, rd.snap, rd.err, rd.ctx = srcs, snap, err, nil
		close(rd.done)
		rd = r.ended(tokens, err)
	}
}

// guarded is do, a panic of the backend's turned into the read's error.
func (r *reads) guarded(ctx context.Context, tokens int64) (srcs []*source, snap gate.Snapshot, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = unanswered(p)
		}
	}()
	return r.do(ctx, tokens)
}

// unanswered is the error of a read whose backend panicked with p, or, when
// p is nil, ended its goroutine.
func unanswered(p any) error {
	if p == nil {
		return errors.New("policy: reading the scope ended its goroutine (runtime.Goexit)")
	}
	msg := fmt.Sprint(p)
	if len(msg) > maxPanicText {
		msg = msg[:maxPanicText] + "…"
	}
	return fmt.Errorf("policy: reading the scope panicked: %s", msg)
}

// maxPanicText bounds what a read's error says of a panic.
const maxPanicText = 200

// ended notes that the running read of tokens ended with err, and returns
// the read gathered behind it, now running, if any. A read that failed
// answers the callers gathered behind it with its error instead: it was in
// flight all the while they asked, and the backend did not answer it, so a
// read of their own would only make them wait a second timeout.
func (r *reads) ended(tokens int64, err error) *read {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := r.keys[tokens].next
	if next != nil && err != nil {
		next.err, next.ctx = err, nil
		close(next.done)
		next = nil
	}
	if next == nil {
		delete(r.keys, tokens)
	} else {
		r.keys[tokens] = readKey{running: true}
	}
	return next
}
