package redisgate

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// No permit without an owner. A call whose reply is lost may still run (a
// stalled Redis runs what its sockets queued when it resumes). Permit ids
// are minted before the call and settling a permit that holds no slot
// changes nothing, so until Redis confirms, an Admit without a readable
// reply is given back on each of its candidates (lua/ops.lua's give_back),
// and a failed settle is repeated with its verdict.

// DefaultGiveBackQueue bounds the settles kept for Redis.
const DefaultGiveBackQueue = 10000

type giveBacks struct {
	mu sync.Mutex
	// items are the settles to repeat and the permits to give back, one
	// per permit and kind: a settle repeated while Redis is away replaces
	// the one queued (a client retrying in a loop fills nothing).
	items                      map[owedKey]*op
	max                        int
	log                        *slog.Logger
	kick                       chan struct{} // wakes RunGiveBacks: Redis answered, or one was queued
	queued                     atomic.Int64
	released, done, overflowed atomic.Uint64
}

type owedKey struct {
	scope, permit string
	giveBack      bool
}

func keyOf(o *op) owedKey {
	scope, permit := o.ids()
	return owedKey{scope, permit, o.giveBack != nil}
}

// add queues o, or counts it lost when the queue is full (its slot ends
// with its lease).
func (g *giveBacks) add(o *op) {
	g.mu.Lock()
	_, again := g.items[keyOf(o)]
	full := !again && g.queued.Load() >= int64(g.max)
	if !full {
		g.items[keyOf(o)] = o
		if !again {
			g.queued.Add(1)
		}
	}
	g.mu.Unlock()
	if full {
		g.overflowed.Add(1)
		g.log.Warn("redis give-back queue full: a permit's slot stays held until its lease ends", "scope", o.scope(), "queue", g.max)
		return
	}
	g.poke()
}

// giveBack queues the permit of an Admit whose reply was lost.
func (g *giveBacks) giveBack(req *gate.AdmitRequest) {
	g.add(&op{giveBack: &gate.AdmitRequest{Scope: req.Scope, PermitID: req.PermitID, Candidates: slices.Clone(req.Candidates), Tenant: req.Tenant}})
}

// poke wakes RunGiveBacks when anything is queued.
func (g *giveBacks) poke() {
	if g.queued.Load() > 0 {
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
}

// take removes and returns what is queued: each is owed (counted in
// queued) until it is done or put back.
func (g *giveBacks) take() []*op {
	g.mu.Lock()
	defer g.mu.Unlock()
	items := make([]*op, 0, len(g.items))
	for k, o := range g.items {
		items = append(items, o)
		delete(g.items, k)
	}
	return items
}

// putBack queues again what Redis did not confirm, unless a newer one of
// the same permit was queued meanwhile.
func (g *giveBacks) putBack(items []*op) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, o := range items {
		if _, newer := g.items[keyOf(o)]; newer {
			g.queued.Add(-1)
		} else {
			g.items[keyOf(o)] = o
		}
	}
}

// GiveBacks counts what the give-back queue did: Queued, the settles Redis
// owes now (queued, or being sent); Released, the give-backs and repeated
// settles that freed a slot; Confirmed, those Redis confirmed; Overflowed,
// those lost to a full queue.
type GiveBacks struct {
	Queued                          int64
	Released, Confirmed, Overflowed uint64
}

// GiveBacks reports the give-back queue's counters.
func (b *Backend) GiveBacks() GiveBacks {
	g := b.owed
	return GiveBacks{Queued: g.queued.Load(), Released: g.released.Load(), Confirmed: g.done.Load(), Overflowed: g.overflowed.Load()}
}

// DeferSettle queues req for Redis without trying now: a settle served
// elsewhere (a local fallback) of a permit Redis may hold.
func (b *Backend) DeferSettle(req gate.SettleRequest) {
	if req.Source != nil && len(req.PermitID) <= gate.MaxText {
		b.owed.add(&op{settle: &req})
	}
}

// RunGiveBacks retries the queued settles until ctx ends: at once when a
// call finds Redis answering again, and every interval while any is
// queued. It also checks for a loss of Redis's state (loss.go) every
// checkEvery, or every interval while a loss is pending.
func (b *Backend) RunGiveBacks(ctx context.Context, every time.Duration) {
	every = max(every, time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	var checked time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.owed.kick:
		}
		b.retryOwed(ctx)
		if time.Since(checked) >= checkEvery || b.loss.anyPending() {
			checked = time.Now()
			if err := b.checkLosses(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, gate.ErrUnavailable) {
				b.log.Error("redis state check failed", "err", err)
			}
		}
		next := checkEvery - time.Since(checked)
		if b.owed.queued.Load() > 0 || b.loss.anyPending() {
			next = every
		}
		t.Reset(max(next, 0))
	}
}

// retryOwed sends what is queued, a call's worth per scope at most, the
// scopes side by side (one not answering holds up no other).
func (b *Backend) retryOwed(ctx context.Context) {
	items := b.owed.take()
	if len(items) == 0 {
		return
	}
	var again, later []*op // (again under mu)
	perScope := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, it := range items {
		if perScope[it.scope()]++; perScope[it.scope()] > maxBatchOps {
			later = append(later, it)
			continue
		}
		wg.Go(func() {
			if !b.sendOwed(ctx, it) {
				mu.Lock()
				again = append(again, it)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.owed.putBack(append(again, later...))
}

// sendOwed sends one owed settle and reports whether Redis answered it.
func (b *Backend) sendOwed(ctx context.Context, it *op) bool {
	o := &op{settle: it.settle, giveBack: it.giveBack, owed: true}
	v, err := b.batches.do(ctx, b.until(), o)
	if err == nil {
		err, _ = v.(error)
	}
	if errors.Is(err, gate.ErrUnavailable) || ctx.Err() != nil {
		return false
	}
	b.owed.queued.Add(-1)
	if err != nil {
		b.log.Error("redis give-back failed", "scope", it.scope(), "err", err)
		return true
	}
	b.owed.done.Add(1)
	var released bool
	if it.settle != nil {
		st, err := b.settlement(it.settle, v)
		released = err == nil && st.Released
	} else {
		a, ok := v.([]any)
		released = ok && len(a) == 1 && a[0] == int64(1) // (give_back's reply)
	}
	if released {
		b.owed.released.Add(1)
		scope, permit := it.ids()
		b.log.Info("gave back a permit whose reply was lost", "scope", scope, "permit", permit)
	}
	return true
}
