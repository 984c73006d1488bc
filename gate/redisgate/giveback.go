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
// reply is given back on each of its candidates (a tombstone makes a late
// Admit grant nothing: lua/ops.lua's give_back), and a failed settle is
// repeated with its verdict.

// DefaultGiveBackQueue bounds the settles kept for Redis.
const DefaultGiveBackQueue = 10000

type giveBacks struct {
	mu    sync.Mutex
	items []*op // a settle to repeat, or a permit to give back
	max   int
	log   *slog.Logger
	// kick wakes RunGiveBacks: Redis answered, or a settle was queued.
	kick                       chan struct{}
	queued                     atomic.Int64
	released, done, overflowed atomic.Uint64
}

func newGiveBacks(max int, log *slog.Logger) *giveBacks {
	if max <= 0 {
		max = DefaultGiveBackQueue
	}
	return &giveBacks{max: max, log: log, kick: make(chan struct{}, 1)}
}

// add queues o, or counts it lost when the queue is full (its slot ends
// with its lease).
func (g *giveBacks) add(o *op) {
	g.mu.Lock()
	full := g.queued.Load() >= int64(g.max)
	if !full {
		g.items = append(g.items, o)
		g.queued.Add(1)
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
	if g.queued.Load() == 0 {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// take removes and returns what is queued: each is owed (counted in
// queued) until it is done or put back.
func (g *giveBacks) take() []*op {
	g.mu.Lock()
	defer g.mu.Unlock()
	items := g.items
	g.items = nil
	return items
}

// putBack queues again what Redis did not confirm.
func (g *giveBacks) putBack(items []*op) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.items = append(g.items, items...)
}

// GiveBacks counts what the give-back queue did.
type GiveBacks struct {
	// Queued is how many settles Redis owes now (queued, or being sent).
	Queued int64
	// Released counts give-backs and repeated settles that freed a slot;
	// Confirmed counts those Redis confirmed; Overflowed those lost to a
	// full queue.
	Released, Confirmed, Overflowed uint64
}

// GiveBacks reports the give-back queue's counters.
func (b *Backend) GiveBacks() GiveBacks {
	g := b.owed
	return GiveBacks{Queued: g.queued.Load(), Released: g.released.Load(), Confirmed: g.done.Load(), Overflowed: g.overflowed.Load()}
}

// DeferSettle queues req to be settled in Redis once it answers, without
// trying now: for a settle served elsewhere (a local fallback) of a permit
// Redis may hold.
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

// retryOwed sends what is queued, at most a call's worth per scope, the
// scopes side by side (one that does not answer holds up no other); what
// Redis does not confirm is queued again.
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
		err = opError(v)
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
		b.log.Info("gave back a permit whose reply was lost", "scope", it.scope(), "permit", it.permit())
	}
	return true
}
