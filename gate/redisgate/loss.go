package redisgate

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// A Redis restarted without persistence, or failed over to a replica that
// missed the writes, forgets a scope's breakers: an OPEN source reads back
// CLOSED. So each Backend remembers the OPEN breakers and overrides it saw
// (in its replies, refusals and reads, and in announcements) and
// re-asserts them where Redis lost them (lua/ops.lua's restore).
//
// A marker key per scope, without TTL, tells a loss: restore creates it
// with a random value, and each Backend remembers the value it saw. An
// admit whose scope's marker is missing or another grants nothing: the
// Backend re-asserts, then admits again, within one timeout, so a source
// it knew OPEN is never granted after a loss, not even once. checkLosses
// runs the same check in the background every checkEvery.

// maxRecords bounds the breakers remembered; past it the one seen least
// recently is forgotten.
const maxRecords = 10000

const checkEvery = 250 * time.Millisecond

// record is what one source's breaker last said, as of at.
type record struct {
	gate.Record
	at time.Time
}

// aged is r as of now.
func (r *record) aged(now time.Time) gate.Record {
	d, out := now.Sub(r.at), r.Record
	out.OpenLeft, out.OpenedAgo, out.OverrideAgo = out.OpenLeft-d, out.OpenedAgo+d, out.OverrideAgo+d
	out.Open = out.Open && out.OpenLeft > 0
	return out
}

func (r *record) empty(now time.Time) bool {
	a := r.aged(now)
	return !a.Open && a.Override == gate.NoOverride
}

// lossWatch is what this Backend saw of each scope, to find and repair a
// loss of Redis's state.
type lossWatch struct {
	mu      sync.Mutex
	scopes  map[string]*scopeWatch
	records *list.List // of *record, the most recently seen first
	log     *slog.Logger
	onLoss  func(scope string, restored int)
	losses  atomic.Uint64
}

type scopeWatch struct {
	seen    string // the marker last seen ("": none yet)
	pending bool
	loss    gate.StateLoss
	records map[string]*list.Element // by source
	// restoring runs one re-assert of the scope at a time.
	restoring sync.Mutex
}

func newLossWatch(log *slog.Logger, onLoss func(string, int)) *lossWatch {
	return &lossWatch{scopes: map[string]*scopeWatch{}, records: list.New(), log: log, onLoss: onLoss}
}

// scope is the scope's watch, made on first use; m.mu is held. Past
// 2×maxRecords scopes (announcements name any scope), those that hold no
// record and no pending loss are forgotten: a first look at their marker
// again costs an admit one round trip more.
func (m *lossWatch) scope(name string) *scopeWatch {
	sm := m.scopes[name]
	if sm == nil {
		if len(m.scopes) >= 2*maxRecords {
			for n, s := range m.scopes {
				if len(s.records) == 0 && !s.pending {
					delete(m.scopes, n)
				}
			}
			m.log.Warn("forgot the markers of scopes without breakers to re-assert, for room", "scopes", len(m.scopes))
		}
		sm = &scopeWatch{records: map[string]*list.Element{}}
		m.scopes[name] = sm
	}
	return sm
}

// seen is the marker last seen of scope.
func (m *lossWatch) seen(scope string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.scope(scope).seen
}

// marked notes the marker a read found, and reports whether the read shows
// the scope this Backend saw: a first look adopts the marker; another one
// (or none) is a loss to re-assert (checkLosses), and what a lost scope
// reads must not make the Backend forget what it saw.
func (m *lossWatch) marked(scope, marker string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	sm := m.scope(scope)
	switch {
	case marker == sm.seen:
	case sm.seen == "":
		sm.seen = marker
	default:
		sm.pending = true
	}
	return marker == sm.seen
}

// see remembers br, a breaker Redis showed at its time now (ms).
func (m *lossWatch) see(scope, source string, br gate.Breaker, now int64) {
	if br.State != gate.Open && br.Override == gate.NoOverride {
		m.mu.Lock()
		defer m.mu.Unlock()
		if sm := m.scopes[scope]; sm != nil && sm.records[source] != nil {
			m.forget(sm.records[source])
		}
		return
	}
	m.update(scope, source, func(r *gate.Record) {
		r.Open = br.State == gate.Open
		if r.Open {
			r.OpenLeft, r.OpenedAgo = gate.Millis(br.OpenUntil-now), gate.Millis(now-br.OpenedAt)
			r.Reopens, r.Epoch, r.Cause = br.Reopens, br.Epoch, br.Cause
		}
		r.Override, r.Actor, r.Why, r.OverrideAgo = br.Override, br.Actor, br.Why, gate.Millis(now-br.OverrideAt)
	})
}

// heard remembers what events say: an opening, a closing, an operator's
// action (other replicas' announcements, this Backend's own events).
func (m *lossWatch) heard(scope string, events []gate.Event) {
	for _, e := range events {
		switch {
		case e.Kind == gate.EventOverride:
			m.update(scope, e.Source, func(r *gate.Record) { r.Override, r.Actor, r.Why, r.OverrideAgo = e.Override, e.Actor, e.Why, 0 })
		case e.Kind == gate.EventTransition && e.To == gate.Open:
			m.update(scope, e.Source, func(r *gate.Record) {
				r.Open, r.OpenLeft, r.OpenedAgo, r.Reopens, r.Epoch, r.Cause = true, e.Cooldown, 0, e.Reopens, e.Epoch, gate.OpenCauseFailures
				if e.Cause == gate.CauseSourceDead {
					r.Cause = gate.OpenCauseSourceDead
				}
			})
		case e.Kind == gate.EventTransition:
			m.update(scope, e.Source, func(r *gate.Record) { r.Open = false })
		}
	}
}

// update changes a source's record (made if missing), forgotten once it
// holds nothing to re-assert.
func (m *lossWatch) update(scope, source string, change func(*gate.Record)) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	sm := m.scope(scope)
	el := sm.records[source]
	r := &record{Record: gate.Record{Scope: scope, Source: source}, at: now}
	if el != nil {
		r = el.Value.(*record)
		r.Record, r.at = r.aged(now), now
	}
	change(&r.Record)
	if r.Open && r.Cause == gate.OpenCauseNone {
		r.Cause = gate.OpenCauseFailures
	}
	switch {
	case r.empty(now) && el != nil:
		m.forget(el)
	case r.empty(now):
	case el != nil:
		m.records.MoveToFront(el)
	default:
		sm.records[source] = m.records.PushFront(r)
		if m.records.Len() > maxRecords {
			old := m.records.Back().Value.(*record)
			m.forget(m.records.Back())
			m.log.Warn("forgot a breaker for room: it is not re-asserted if redis loses its state",
				"scope", old.Scope, "source", old.Source, "records", maxRecords)
		}
	}
}

// forget drops a record; m.mu is held.
func (m *lossWatch) forget(el *list.Element) {
	r := m.records.Remove(el).(*record)
	delete(m.scopes[r.Scope].records, r.Source)
}

// anyPending reports whether a loss waits for its re-assert.
func (m *lossWatch) anyPending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sm := range m.scopes {
		if sm.pending {
			return true
		}
	}
	return false
}

// due are the scopes with something to re-assert or a loss pending.
func (m *lossWatch) due() []string {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name, sm := range m.scopes {
		for _, el := range sm.records {
			if el.Value.(*record).empty(now) {
				m.forget(el)
			}
		}
		if len(sm.records) > 0 || sm.pending {
			out = append(out, name)
		}
	}
	return out
}

// remark answers an admit that found another marker than the one seen: a
// first look adopts it; anything else is re-asserted.
func (b *Backend) remark(ctx context.Context, until time.Time, scope, marker string) error {
	b.loss.mu.Lock()
	sm := b.loss.scope(scope)
	first := sm.seen == "" && marker != "" && len(sm.records) == 0
	if first {
		sm.seen = marker
	} else {
		sm.pending = true
	}
	b.loss.mu.Unlock()
	if first {
		return nil
	}
	return b.restore(ctx, until, scope)
}

// restore re-asserts what this Backend knows of scope where Redis lost it.
func (b *Backend) restore(ctx context.Context, until time.Time, scope string) error {
	m := b.loss
	m.mu.Lock()
	sm := m.scope(scope)
	m.mu.Unlock()
	sm.restoring.Lock()
	defer sm.restoring.Unlock()
	m.mu.Lock()
	c := newCall(b, scope, sm.seen)
	now := time.Now()
	recs := make([]gate.Record, 0, len(sm.records))
	for _, el := range sm.records {
		recs = append(recs, el.Value.(*record).aged(now))
	}
	c.restore(randomID(), recs)
	m.mu.Unlock()
	rctx, cancel := b.bound(ctx, until)
	defer cancel()
	v, err := b.single(rctx, c)
	if err != nil {
		return err
	}
	r := reading("restore", v)
	lost, restored, marker := r.num("lost", 0, 1) == 1, int(r.num("restored", 0, 1<<31)), r.str("marker")
	if r.done(); r.err == nil && marker == "" {
		r.fail("no marker")
	}
	if r.err != nil {
		return r.err
	}
	m.mu.Lock()
	sm.seen, sm.pending = marker, false
	if lost {
		sm.loss.Count++
		sm.loss.Last, sm.loss.Restored = now, restored
	}
	m.mu.Unlock()
	if lost {
		n := m.losses.Add(1)
		m.log.Error("redis lost the scope's state (restart without persistence, or failover to an empty replica); re-asserted the OPEN breakers and overrides this replica knew",
			"scope", scope, "restored", restored, "state_losses_total", n)
		if m.onLoss != nil {
			m.onLoss(scope, restored)
		}
	}
	return nil
}

// checkLosses reads the markers of the scopes due in one pipeline and
// re-asserts each scope whose marker is not the one seen.
func (b *Backend) checkLosses(ctx context.Context) error {
	scopes := b.loss.due()
	if len(scopes) == 0 {
		return nil
	}
	rctx, cancel := b.bound(ctx, time.Time{})
	cmds := make([]*redis.StringCmd, len(scopes))
	_, err := b.client.Pipelined(rctx, func(p redis.Pipeliner) error {
		for i, s := range scopes {
			cmds[i] = p.Get(rctx, b.tag(s)+scopeKeys[1])
		}
		return nil
	})
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		// A marker that cannot be read (its Cluster node down) waits for
		// the next check; the others go on.
		b.log.Debug("redis loss check", "err", err)
	}
	var errs []error
	for i, s := range scopes {
		m, err := cmds[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			continue
		}
		b.loss.mu.Lock()
		sm := b.loss.scope(s)
		// A scope without a marker is marked, so a later loss is seen.
		changed := m != sm.seen || m == "" || sm.pending
		b.loss.mu.Unlock()
		if changed {
			errs = append(errs, b.restore(ctx, time.Time{}, s))
		}
	}
	return errors.Join(errs...)
}

// StateLosses is how many losses of a scope's state this Backend found.
func (b *Backend) StateLosses() uint64 { return b.loss.losses.Load() }

// StateLoss is what this Backend saw of Redis losing scope's state.
func (b *Backend) StateLoss(scope string) gate.StateLoss {
	b.loss.mu.Lock()
	defer b.loss.mu.Unlock()
	sm := b.loss.scopes[scope]
	if sm == nil {
		return gate.StateLoss{}
	}
	l := sm.loss
	l.Pending = sm.pending
	return l
}

// Records are the OPEN breakers and overrides this Backend saw, as of now:
// what an on_unavailable: local gate starts from.
func (b *Backend) Records() []gate.Record {
	now := time.Now()
	b.loss.mu.Lock()
	defer b.loss.mu.Unlock()
	var out []gate.Record
	for el := b.loss.records.Front(); el != nil; el = el.Next() {
		if r := el.Value.(*record); !r.empty(now) {
			out = append(out, r.aged(now))
		}
	}
	return out
}
