package redisgate

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// DefaultGiveBackQueue is the size of a zero Options' give-back queue.
const DefaultGiveBackQueue = 10000

// A script whose reply is lost may still have run: Redis runs a command it
// has read even when the client that sent it gave up waiting (a stalled
// server runs what queued up on its sockets when it resumes). An Admit whose
// reply is lost may thus have granted a permit nobody will ever report, and a
// Settle whose reply is lost may not have run at all. Both are owed to Redis:
// the Backend keeps them in a bounded queue and settles them again until
// Redis confirms. Permit ids are the caller's (minted before Admit), and a
// Settle of a permit that holds no slot changes nothing, so every retry is
// idempotent.
//
// A lost Admit is given back on each of its candidates (the reply would have
// said which one granted it) with no verdict, twice: once as soon as Redis
// answers again, and once more a retry interval later, for the case where
// the Admit, read from its abandoned connection in the same event-loop turn
// as the first give-back, ran after it.

// orphan is one settle Redis owes.
type orphan struct {
	req gate.SettleRequest
	// left counts the confirmations still needed; notBefore is when the
	// next attempt may run.
	left      int
	notBefore time.Time
}

type orphanKey struct{ scope, source, permit string }

// orphans is the give-back queue, in arrival order.
type orphans struct {
	max int
	log *slog.Logger

	mu    sync.Mutex
	items []*orphan
	keys  map[orphanKey]*orphan

	queued    atomic.Int64
	released  atomic.Uint64
	confirmed atomic.Uint64
	overflow  atomic.Uint64
	kick      chan struct{}
	wake      alarm // rung when a settle is queued: RunGiveBacks ticks again
}

func newOrphans(max int, log *slog.Logger) *orphans {
	if max <= 0 {
		max = DefaultGiveBackQueue
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &orphans{max: max, log: log, keys: map[orphanKey]*orphan{}, kick: make(chan struct{}, 1), wake: make(alarm, 1)}
}

// add queues req (needing confirms confirmations) unless the same permit of
// the same source is queued already; a full queue counts and logs the loss.
func (q *orphans) add(req gate.SettleRequest, confirms int) {
	k := orphanKey{req.Scope, req.Source.Name, req.PermitID}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.keys[k]; ok {
		return
	}
	if len(q.items) >= q.max {
		n := q.overflow.Add(1)
		q.log.Error("redis give-back queue full: a permit may stay held until its lease ends",
			"scope", req.Scope, "source", req.Source.Name, "permit", req.PermitID, "queue", q.max, "overflowed_total", n)
		return
	}
	o := &orphan{req: req, left: confirms}
	q.items = append(q.items, o)
	q.keys[k] = o
	q.queued.Store(int64(len(q.items)))
	q.wake.ring()
}

// alarm wakes a loop that sleeps until it has work, to look again (one
// ring is kept while the loop is busy).
type alarm chan struct{}

func (a alarm) ring() {
	select {
	case a <- struct{}{}:
	default:
	}
}

// due returns the orphans whose next attempt may run at now.
func (q *orphans) due(now time.Time) []*orphan {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*orphan
	for _, o := range q.items {
		if !now.Before(o.notBefore) {
			out = append(out, o)
		}
	}
	return out
}

// confirm records that Redis answered o's settle at now; the next
// confirmation, if one is needed, is due after every.
func (q *orphans) confirm(o *orphan, st gate.Settlement, now time.Time, every time.Duration) {
	if st.Released {
		q.released.Add(1)
		q.log.Warn("gave back a permit whose reply was lost", "scope", o.req.Scope, "source", o.req.Source.Name,
			"permit", o.req.PermitID, "verdict", int(o.req.Verdict))
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	o.left--
	o.notBefore = now.Add(every)
	if o.left > 0 {
		return
	}
	q.confirmed.Add(1)
	delete(q.keys, orphanKey{o.req.Scope, o.req.Source.Name, o.req.PermitID})
	for i, x := range q.items {
		if x == o {
			q.items = append(q.items[:i], q.items[i+1:]...)
			break
		}
	}
	q.queued.Store(int64(len(q.items)))
}

// drop removes o after Redis refused its script (a bug, not an outage:
// retrying would fail the same way).
func (q *orphans) drop(o *orphan, err error) {
	q.log.Error("redis give-back refused by the script; dropped", "scope", o.req.Scope, "source", o.req.Source.Name,
		"permit", o.req.PermitID, "err", err)
	o.left = 1
	q.confirm(o, gate.Settlement{}, time.Time{}, 0)
}

// poke wakes the retry loop when something is queued.
func (q *orphans) poke() {
	if q.queued.Load() == 0 {
		return
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// GiveBacks counts what the give-back queue did.
type GiveBacks struct {
	// Queued is how many settles Redis owes now.
	Queued int64
	// Released counts give-backs that freed a slot (a permit nobody owned,
	// or a report whose first settle was lost); Confirmed counts settles
	// done; Overflowed counts settles lost to a full queue.
	Released, Confirmed, Overflowed uint64
}

// GiveBacks reports the give-back queue's counters.
func (b *Backend) GiveBacks() GiveBacks {
	q := b.orphans
	return GiveBacks{Queued: q.queued.Load(), Released: q.released.Load(), Confirmed: q.confirmed.Load(), Overflowed: q.overflow.Load()}
}

// DeferSettle queues req to be settled in Redis once it answers, without
// trying now: for a settle served elsewhere (a local fallback) of a permit
// Redis may hold.
func (b *Backend) DeferSettle(req gate.SettleRequest) {
	if req.Source != nil && len(req.PermitID) <= gate.MaxText { // (Settle refuses a longer one)
		b.orphans.add(req, 1)
	}
}

// RunGiveBacks retries the queued settles until ctx ends: at once when a
// call finds Redis answering again, and at least every interval while any
// is queued (each attempt bounded by the Backend's timeout), so a permit
// whose reply was lost is given back within interval plus that timeout of
// Redis's return. At its ticks it also checks whether Redis lost a scope's
// state and re-asserts what this Backend knows (see reassert.go).
//
// It wakes only at the ticks with work (ticksToWork): every interval while
// a give-back is queued or a scope is unmarked, otherwise at the next
// record check; queueing a give-back and finding a scope to mark or
// re-assert wake it to look again (orphans.wake). An idle sidecar with the
// default 50 ms poll_interval wakes 4 times a second, not 20, and each
// wake-up of a Go process costs more than the nothing the loop did (the
// scheduler, sysmon).
func (b *Backend) RunGiveBacks(ctx context.Context, every time.Duration) {
	recordTicks := max(1, uint64(recordCheckPeriod/every))
	var tick uint64   // the ticks so far
	at := time.Now()  // when tick was
	step := uint64(1) // the ticks the timer is set for, from at
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tick, at = tick+step, time.Now()
			if err := b.reassert(ctx, tick, recordTicks); err != nil && ctx.Err() == nil && !errors.Is(err, gate.ErrUnavailable) {
				b.orphans.log.Error("redis state check failed", "err", err)
			}
			b.retryOrphans(ctx, every)
		case <-b.orphans.kick:
			b.retryOrphans(ctx, every)
			if step == 1 {
				continue // the timer keeps its pace
			}
			tick, at = slept(tick, at, step, every)
		case <-b.orphans.wake: // a settle queued, a scope to mark or re-assert
			if step == 1 {
				continue
			}
			tick, at = slept(tick, at, step, every)
		}
		step = b.ticksToWork(tick, recordTicks)
		t.Reset(time.Until(at.Add(time.Duration(step) * every)))
	}
}

// slept counts the ticks a sleep of step ticks from at has lasted, short
// of the one it slept for (whose work is still to do): the tick and its
// time that the timer is set again from.
func slept(tick uint64, at time.Time, step uint64, every time.Duration) (uint64, time.Time) {
	n := min(uint64(time.Since(at)/every), step-1)
	return tick + n, at.Add(time.Duration(n) * every)
}

// ticksToWork is how many ticks after tick the next one with work for
// RunGiveBacks is: 1 while a give-back is queued or a scope is unmarked (or
// its re-assert pending), which reassert handles at every tick; otherwise
// the next tick at which scopes with records are checked (a record, an
// OPEN breaker seen here, may be added meanwhile), or every scope, if
// sooner.
func (b *Backend) ticksToWork(tick, recordTicks uint64) uint64 {
	if b.orphans.queued.Load() > 0 {
		return 1
	}
	b.memory.mu.Lock()
	defer b.memory.mu.Unlock()
	for _, sm := range b.memory.scopes {
		if sm.marker == "" || sm.loss.Pending {
			return 1
		}
	}
	next := recordTicks - tick%recordTicks
	return min(next, lossCheckEvery-tick%lossCheckEvery)
}

// back moves the orphans of scope to the end of the queue, in their order.
func (q *orphans) back(scope string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	front := make([]*orphan, 0, len(q.items))
	var rest []*orphan
	for _, o := range q.items {
		if o.req.Scope == scope {
			rest = append(rest, o)
		} else {
			front = append(front, o)
		}
	}
	q.items = append(front, rest...)
}

// retryOrphans settles every due orphan, in order, and stops at the first
// that Redis does not answer, whose scope's orphans go to the end of the
// queue: a scope that does not answer while others do (a Redis Cluster node
// down, the scope's ops piled up to maxQueuedOps) does not keep the others'
// give-backs waiting behind it, and a Redis that does not answer at all
// still costs one attempt per pass.
func (b *Backend) retryOrphans(ctx context.Context, every time.Duration) {
	for _, o := range b.orphans.due(time.Now()) {
		st, err := b.settle(ctx, o.req)
		switch {
		case err == nil:
			b.orphans.confirm(o, st, time.Now(), every)
		case ctx.Err() != nil:
			return
		case errors.Is(err, gate.ErrUnavailable):
			b.orphans.back(o.req.Scope)
			return
		default:
			b.orphans.drop(o, err)
		}
	}
}

// lostAdmit queues the give-back of an Admit whose reply was lost, on each
// candidate.
func (b *Backend) lostAdmit(req gate.AdmitRequest) {
	for _, c := range req.Candidates {
		b.orphans.add(gate.SettleRequest{
			Scope: req.Scope, Source: c.Source, PermitID: req.PermitID, Verdict: gate.VerdictNone, ActualTokens: -1,
		}, 2)
	}
}
