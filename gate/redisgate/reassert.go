package redisgate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// A Redis that restarts without persistence, or a failover to a replica that
// had not received the writes, forgets every breaker and override of a
// scope: a source that was OPEN reads back CLOSED and every replica admits
// it. Each Backend therefore keeps a small record of the last OPEN and the
// last override it saw of every source, from its own replies and from other
// replicas' announcements, and re-asserts them (restore.lua) where Redis
// lost them. A marker key per scope, without TTL, says whether Redis lost the
// scope: restore.lua creates it, and finding it missing for a scope this
// Backend had seen it for is a state loss (the first time a scope is seen,
// a missing marker is just a new scope).
//
// The check is one script run per scope, in the background (RunGiveBacks's
// ticks): scopes with something to re-assert at every tick, every other
// scope once every lossCheckEvery ticks. It adds nothing to the RPCs'
// round trips; in exchange a replica may admit a source that was OPEN for at
// most one tick after Redis comes back empty (the cooldown memo of the
// replica that saw the OPEN refuses it meanwhile).

// maxRemembered bounds the records (sources) and the scopes kept; names
// come from announcements too, which any replica with the same prefix sends.
const maxRemembered = 10000

// lossCheckEvery is how many ticks pass between two checks of a scope with
// nothing to re-assert.
const lossCheckEvery = 20

// remembered is what one source's breaker last said, as seen here.
type remembered struct {
	source *string
	// openUntil is zero unless the breaker was last seen OPEN.
	openUntil, openedAt time.Time
	reopens             int
	epoch               uint64
	override            gate.Override
	actor, why          string
	overrideAt          time.Time
}

func (r *remembered) empty(now time.Time) bool {
	return !r.openUntil.After(now) && r.override == gate.NoOverride
}

// memory is every scope's records.
type memory struct {
	mu     sync.Mutex
	scopes map[string]*scopeMemory
	n      int
	losses atomic.Uint64
}

type scopeMemory struct {
	sources map[string]*remembered
	// marked: the scope's marker was seen (created or found) by this Backend.
	marked bool
}

func (m *memory) scope(name string) *scopeMemory {
	sm := m.scopes[name]
	if sm == nil && len(m.scopes) < maxRemembered {
		sm = &scopeMemory{sources: map[string]*remembered{}}
		m.scopes[name] = sm
	}
	return sm
}

// see records the breaker events of one reply or announcement.
func (m *memory) see(scope string, events []gate.Event, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.scopes == nil {
		m.scopes = map[string]*scopeMemory{}
	}
	sm := m.scope(scope)
	if sm == nil {
		return
	}
	for _, e := range events {
		if e.Kind != gate.EventTransition && e.Kind != gate.EventOverride {
			continue
		}
		r := sm.sources[e.Source]
		if r == nil {
			if m.n >= maxRemembered {
				continue
			}
			name := e.Source
			r = &remembered{source: &name}
			sm.sources[e.Source] = r
			m.n++
		}
		switch e.Kind {
		case gate.EventTransition:
			r.openUntil = time.Time{}
			if e.To == gate.Open {
				r.openUntil, r.openedAt, r.reopens, r.epoch = now.Add(e.Cooldown), now, e.Reopens, e.Epoch
			}
		case gate.EventOverride:
			r.override, r.actor, r.why, r.overrideAt = e.Override, e.Actor, e.Why, now
			if e.To != gate.Open {
				r.openUntil = time.Time{}
			}
		}
	}
}

// restoreArgs is what restore.lua needs for one scope: the records still
// worth re-asserting (others are forgotten).
func (m *memory) restoreArgs(sm *scopeMemory, now time.Time) []remembered {
	var out []remembered
	for name, r := range sm.sources {
		if r.empty(now) {
			delete(sm.sources, name)
			m.n--
			continue
		}
		out = append(out, *r)
	}
	return out
}

// StateLosses counts the scopes found lost by Redis (see RunGiveBacks).
func (b *Backend) StateLosses() uint64 { return b.memory.losses.Load() }

// reassert checks the scopes due at tick and re-asserts their records.
func (b *Backend) reassert(ctx context.Context, tick uint64) error {
	now := time.Now()
	type job struct {
		scope  string
		recs   []remembered
		marked bool
	}
	var jobs []job
	b.memory.mu.Lock()
	for name, sm := range b.memory.scopes {
		recs := b.memory.restoreArgs(sm, now)
		if len(recs) > 0 || !sm.marked || tick%lossCheckEvery == 0 {
			jobs = append(jobs, job{name, recs, sm.marked})
		}
	}
	b.memory.mu.Unlock()
	for _, j := range jobs {
		tag := b.tag(j.scope)
		keys := append(make([]string, 0, 1+len(j.recs)), tag+":marker")
		args := restoreArgs.pack(make([]any, 0, restoreArgs.width()+restoreSrcArgs.width()*len(j.recs)), &restoreCall{b, len(j.recs)})
		for _, r := range j.recs {
			keys = append(keys, tag+":src:"+*r.source+":"+brkKeys.suffixes[0]) // as appendSourceKeys
			rec := restoreRec{
				openedAgo: now.Sub(r.openedAt).Milliseconds(), overrideAgo: now.Sub(r.overrideAt).Milliseconds(),
				reopens: r.reopens, epoch: r.epoch, override: r.override, actor: r.actor, why: r.why,
			}
			if r.openUntil.After(now) {
				rec.openLeft = max(1, r.openUntil.Sub(now).Milliseconds())
			}
			args = restoreSrcArgs.pack(args, &rec)
		}
		v, err := b.run(ctx, "restore", restoreScript, keys, args)
		if err != nil {
			return err
		}
		p := &parser{op: "restore"}
		out := restoreReply.parse(p, v)
		lost, restored := out.lost == 1, out.restored
		if p.err != nil {
			return p.err
		}
		b.memory.mu.Lock()
		if sm := b.memory.scopes[j.scope]; sm != nil {
			sm.marked = true
		}
		b.memory.mu.Unlock()
		if lost && (j.marked || restored > 0) {
			n := b.memory.losses.Add(1)
			b.orphans.log.Error("redis lost the scope's state (restart without persistence, or failover to an empty replica); re-asserted the OPEN breakers and overrides this replica knew",
				"scope", j.scope, "restored", restored, "state_losses_total", n)
			if b.onLoss != nil {
				b.onLoss(j.scope, int(restored))
			}
		}
	}
	return nil
}
