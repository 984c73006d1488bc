package redisgate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// A Redis that restarts without persistence, or a failover to a replica that
// had not received the writes, forgets every breaker and override of a
// scope: a source that was OPEN reads back CLOSED and every replica admits
// it. Each Backend therefore keeps a small record of the last OPEN and the
// last override it saw of every source, from its own replies and from other
// replicas' announcements, and re-asserts them (restore.lua) where Redis
// lost them.
//
// A marker key per scope, without TTL, says whether Redis lost the scope:
// restore.lua creates it with a random value, and each Backend remembers
// the value it saw. Every Admit passes that value and checks the marker in
// the same script run (admit.lua's unmarked); when the marker is missing or
// another (Redis lost the scope since, and maybe another replica found it
// first), the script grants nothing and the Backend re-asserts, then admits
// again: three round trips, within one timeout, in the rare loss case (and
// at a Backend's first Admit of a scope), one otherwise. So a replica that
// knows a source OPEN never grants it after a loss, not even once.
//
// The same check runs in the background (RunGiveBacks's ticks), so that a
// scope without Admits is re-asserted too: scopes with something to
// re-assert every recordCheckPeriod (or every tick, if ticks are further
// apart), every other scope once every lossCheckEvery ticks. The period
// bounds how long another replica that never heard of an OPEN breaker
// (started after it opened) may admit it after Redis lost it; checking at
// every 50 ms tick cost a sidecar ~0.7% of a core for each such scope.

// maxRemembered bounds the records (sources) and the scopes kept; names
// come from announcements too, which any replica with the same prefix sends
// (or anyone who can PUBLISH to its Redis). What was only heard of gives its
// room up to what this Backend's own calls saw (memory.scope, memory.see),
// never the other way round, so that announcements never leave one of its
// scopes, or one of its breakers, unprotected after a loss.
const maxRemembered = 10000

// lossCheckEvery is how many ticks pass between two checks of a scope with
// nothing to re-assert.
const lossCheckEvery = 20

// recordCheckPeriod is how often a scope with something to re-assert (an
// OPEN breaker or an override this Backend remembers) is checked.
const recordCheckPeriod = 250 * time.Millisecond

// remembered is what one source's breaker last said, as seen here.
type remembered struct {
	source *string
	// own: an event of one of this Backend's replies said it; false for a
	// record only heard of in announcements.
	own bool
	// openUntil is zero unless the breaker was last seen OPEN.
	openUntil, openedAt time.Time
	reopens             int
	epoch               uint64
	cause               gate.OpenCause
	override            gate.Override
	actor, why          string
	overrideAt          time.Time
}

func (r *remembered) empty(now time.Time) bool {
	return !r.openUntil.After(now) && r.override == gate.NoOverride
}

// StateLoss is what one Backend saw of Redis losing a scope's state.
type StateLoss struct {
	// Count is how many losses this Backend found; Last is when it found
	// the last one.
	Count uint64
	Last  time.Time
	// Restored is how many breakers the last re-assert wrote.
	Restored int
	// Pending: an Admit found the scope's marker changed and the re-assert
	// has not succeeded yet (it is retried by the next Admit and by
	// RunGiveBacks).
	Pending bool
}

// memory is every scope's records.
type memory struct {
	mu     sync.Mutex
	scopes map[string]*scopeMemory
	n      int
	losses atomic.Uint64
	// restoring admits one restore at a time (see Backend.restore).
	restoring chan struct{}
	// wake is rung when a scope is to be marked or re-asserted
	// (RunGiveBacks's ticksToWork): the Backend's orphans.wake.
	wake alarm
	// heardScopes are the scopes only heard of (scopeMemory.own false),
	// each with a record at least, and heardRecs the records only heard of
	// (remembered.own false, in any scope) with their scopes: what makes
	// room for this Backend's own, any one of them taken at once.
	heardScopes map[string]*scopeMemory
	heardRecs   map[*remembered]*scopeMemory
	// log tells what was forgotten for room, and the first scope and the
	// first record of this Backend's own refused room (refusedScope,
	// refusedRecord: nothing more is logged); notes wait for m.mu's
	// release (unlock), so that no caller waits on the log under it.
	log                         *slog.Logger
	notes                       []note
	refusedScope, refusedRecord bool
}

// note is a line to log once m.mu is released.
type note struct {
	level slog.Level
	msg   string
	args  []any
}

// unlock releases m.mu, then logs the notes taken under it.
func (m *memory) unlock() {
	notes := m.notes
	m.notes = nil
	m.mu.Unlock()
	if len(notes) == 0 {
		return
	}
	log := m.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, n := range notes {
		log.Log(context.Background(), n.level, n.msg, n.args...)
	}
}

type scopeMemory struct {
	name    string
	sources map[string]*remembered
	// marker is the value of the scope's marker this Backend last saw; ""
	// before its first look.
	marker string
	loss   StateLoss
	// own: this Backend asked Redis of the scope (an Admit, or the reply
	// of one of its calls); false for a scope only heard of in
	// announcements, which is remembered while it has records.
	own bool
}

// scope is the named scope's memory, created if there is room; nil if not.
// own: this Backend's own call asks, which takes the room of a scope only
// heard of when there is none (forget), and makes a scope heard of first
// its own; else the caller adds a record to the scope at once (see). The
// caller holds m.mu.
func (m *memory) scope(name string, own bool) *scopeMemory {
	if m.scopes == nil {
		m.scopes = map[string]*scopeMemory{}
		m.heardScopes = map[string]*scopeMemory{}
		m.heardRecs = map[*remembered]*scopeMemory{}
	}
	sm := m.scopes[name]
	if sm == nil {
		if len(m.scopes) >= maxRemembered && !(own && m.forget(name)) {
			if own && !m.refusedScope {
				m.refusedScope = true
				m.notes = append(m.notes, note{slog.LevelError, "no room to remember the scope's breakers: it is not checked for a loss of Redis's state",
					[]any{"scope", name, "scopes_remembered", len(m.scopes), "max", maxRemembered}})
			}
			return nil
		}
		sm = &scopeMemory{name: name, sources: map[string]*remembered{}, own: own}
		m.scopes[name] = sm
		if !own {
			m.heardScopes[name] = sm
		}
		m.wake.ring() // unmarked
	}
	if own && !sm.own {
		sm.own = true
		delete(m.heardScopes, name)
	}
	return sm
}

// forget drops a scope only heard of, with its records, to make room for
// the scope own, this Backend's: whether there was one. The replicas that
// serve it remember it and re-assert it themselves. The caller holds m.mu.
func (m *memory) forget(own string) bool {
	for _, sm := range m.heardScopes {
		for _, r := range sm.sources {
			delete(m.heardRecs, r) // (a scope heard of has no record of its own)
		}
		m.drop(sm)
		m.notes = append(m.notes, note{slog.LevelWarn, "forgot a scope only heard of in announcements, to make room for one this replica serves",
			[]any{"forgotten", sm.name, "records", len(sm.sources), "for", own, "max", maxRemembered}})
		return true
	}
	return false
}

// drop forgets the scope sm. The caller holds m.mu.
func (m *memory) drop(sm *scopeMemory) {
	m.n -= len(sm.sources)
	delete(m.scopes, sm.name)
	delete(m.heardScopes, sm.name)
}

// forgetRecord drops a record only heard of, to make room for one of this
// Backend's own, of the source src of scope own: whether there was one. A
// scope only heard of goes with its last record. The caller holds m.mu.
func (m *memory) forgetRecord(own, src string) bool {
	for r, sm := range m.heardRecs {
		delete(m.heardRecs, r)
		delete(sm.sources, *r.source)
		m.n--
		if !sm.own && len(sm.sources) == 0 {
			m.drop(sm)
		}
		m.notes = append(m.notes, note{slog.LevelWarn, "forgot a breaker only heard of in announcements, to make room for one of this replica's own",
			[]any{"forgotten_scope", sm.name, "forgotten_source", *r.source, "for_scope", own, "for_source", src, "max", maxRemembered}})
		return true
	}
	return false
}

// unchecked is the marker an Admit passes for a scope this Backend has no
// room to remember: it has no record of it to re-assert either, so the
// script does not check (admit.lua's unmarked).
const unchecked = "*"

// marker is the scope's marker as this Backend last saw it, for Admit.
func (m *memory) marker(scope string) string {
	m.mu.Lock()
	defer m.unlock()
	sm := m.scope(scope, true)
	if sm == nil {
		return unchecked
	}
	return sm.marker
}

// suspect notes that an Admit found the scope's marker changed (a loss,
// unless this Backend had not looked yet); the restore that follows clears
// it.
func (m *memory) suspect(scope string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sm := m.scopes[scope]; sm != nil && sm.marker != "" {
		sm.loss.Pending = true
		m.wake.ring()
	}
}

// see records the breaker events of one reply (own) or announcement. An
// event that leaves a source nothing to re-assert (a transition to other
// than OPEN, an override cleared) makes no record where there is none, and
// an announcement no scope.
func (m *memory) see(scope string, events []gate.Event, now time.Time, own bool) {
	m.mu.Lock()
	defer m.unlock()
	var sm *scopeMemory
	if own {
		if sm = m.scope(scope, true); sm == nil {
			return
		}
	} else {
		sm = m.scopes[scope] // nil: made with its first record
	}
	for _, e := range events {
		if e.Kind != gate.EventTransition && e.Kind != gate.EventOverride {
			continue
		}
		var r *remembered
		if sm != nil {
			r = sm.sources[e.Source]
		}
		if r == nil {
			if e.Kind == gate.EventTransition && e.To != gate.Open || e.Kind == gate.EventOverride && e.Override == gate.NoOverride {
				continue
			}
			if m.n >= maxRemembered && !(own && m.forgetRecord(scope, e.Source)) {
				if own && !m.refusedRecord {
					m.refusedRecord = true
					m.notes = append(m.notes, note{slog.LevelError, "no room to remember the breaker: it is not re-asserted after a loss of Redis's state",
						[]any{"scope", scope, "source", e.Source, "records", m.n, "max", maxRemembered}})
				}
				continue
			}
			if sm == nil {
				if sm = m.scope(scope, false); sm == nil {
					continue
				}
			}
			name := e.Source
			r = &remembered{source: &name, own: own}
			sm.sources[e.Source] = r
			m.n++
			if !own {
				m.heardRecs[r] = sm
			}
		}
		if own && !r.own {
			r.own = true
			delete(m.heardRecs, r)
		}
		switch e.Kind {
		case gate.EventTransition:
			r.openUntil = time.Time{}
			if e.To == gate.Open {
				r.openUntil, r.openedAt, r.reopens, r.epoch = now.Add(e.Cooldown), now, e.Reopens, e.Epoch
				r.cause = gate.OpenCauseFailures
				if e.Cause == gate.CauseSourceDead {
					r.cause = gate.OpenCauseSourceDead
				}
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
// worth re-asserting. The others are forgotten, and a scope only heard of
// with them (m.scopes[sm.name] != sm after). The caller holds m.mu.
func (m *memory) restoreArgs(sm *scopeMemory, now time.Time) []remembered {
	var out []remembered
	for name, r := range sm.sources {
		if r.empty(now) {
			delete(sm.sources, name)
			delete(m.heardRecs, r)
			m.n--
			continue
		}
		out = append(out, *r)
	}
	if !sm.own && len(sm.sources) == 0 {
		m.drop(sm)
	}
	return out
}

// StateLosses counts the scopes found lost by Redis.
func (b *Backend) StateLosses() uint64 { return b.memory.losses.Load() }

// StateLoss is what this Backend saw of Redis losing the scope's state.
func (b *Backend) StateLoss(scope string) StateLoss {
	b.memory.mu.Lock()
	defer b.memory.mu.Unlock()
	if sm := b.memory.scopes[scope]; sm != nil {
		return sm.loss
	}
	return StateLoss{}
}

// reassert checks the scopes due at tick (a scope with something to
// re-assert every recordTicks ticks) and re-asserts their records. A scope
// whose marker this Backend has seen is checked with a plain GET of the
// marker, all such scopes in one pipelined round trip: the restore script
// runs only where the marker is missing or another (or was never seen, or
// a re-assert is pending). So checking a scope costs Redis one GET, not a
// script run.
func (b *Backend) reassert(ctx context.Context, tick, recordTicks uint64) error {
	var due, check, seen []string
	b.memory.mu.Lock()
	now := time.Now()
	for name, sm := range b.memory.scopes {
		if sm.marker == "" || sm.loss.Pending {
			due = append(due, name)
			continue
		}
		// Records are pruned at every record tick, a loss check's too.
		records := tick%recordTicks == 0 && len(b.memory.restoreArgs(sm, now)) > 0
		if b.memory.scopes[name] != sm {
			continue // only heard of, and nothing left to re-assert: forgotten
		}
		if records || tick%lossCheckEvery == 0 {
			check, seen = append(check, name), append(seen, sm.marker)
		}
	}
	b.memory.mu.Unlock()
	var checkErr error
	if len(check) > 0 {
		changed, err := b.markersChanged(ctx, check, seen)
		if err != nil && len(changed) == 0 {
			return err
		}
		// Some markers were not read (their node did not answer: a Redis
		// Cluster node down): the scopes found lost elsewhere are re-asserted
		// all the same, first.
		due, checkErr = append(changed, due...), err
	}
	for _, scope := range due {
		rctx, cancel := b.bound(ctx)
		err := b.restore(ctx, rctx, scope)
		cancel()
		if err != nil {
			return err
		}
	}
	return checkErr
}

// markersChanged reads the markers of scopes in one pipelined round trip
// and returns the scopes whose marker is not the one seen (missing or
// another). A marker that could not be read (in a Redis Cluster, its
// node did not answer) says nothing of its scope: the others' are still
// returned, with the error.
func (b *Backend) markersChanged(ctx context.Context, scopes, seen []string) ([]string, error) {
	const op = "marker check"
	rctx, cancel := b.bound(ctx)
	defer cancel()
	pipe := b.client.Pipeline()
	gets := make([]*redis.StringCmd, len(scopes))
	for i, scope := range scopes {
		gets[i] = pipe.Get(rctx, b.tag(scope)+":"+restoreKeys.suffixes[0])
	}
	_, _ = pipe.Exec(rctx) // each GET has its own result (go-redis sets a failed call's on each)
	var changed []string
	var err error
	answered := false
	for i, g := range gets {
		v, gerr := g.Result()
		if gerr != nil && !errors.Is(gerr, redis.Nil) {
			err = cmp.Or(err, gerr)
			continue
		}
		answered = true
		if gerr != nil || v != seen[i] {
			changed = append(changed, scopes[i])
		}
	}
	if answered {
		b.orphans.poke()
	}
	if err != nil {
		return changed, b.wrap(ctx, op, err)
	}
	return changed, nil
}

// restore checks whether Redis lost the scope since this Backend last saw
// its marker and re-asserts the scope's records if so (restore.lua), within
// rctx (ctx bounded by the Backend's timeout). One runs at a time, so that
// a loss found by several Admits at once is re-asserted and counted once:
// the later ones pass the marker the first one learned.
func (b *Backend) restore(ctx, rctx context.Context, scope string) error {
	const op = "restore"
	b.memory.mu.Lock()
	if b.memory.restoring == nil {
		b.memory.restoring = make(chan struct{}, 1)
	}
	sem := b.memory.restoring
	b.memory.mu.Unlock()
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-rctx.Done():
		return b.wrap(ctx, op, rctx.Err())
	}

	now := time.Now()
	b.memory.mu.Lock()
	sm := b.memory.scopes[scope] // (marker made an Admit's; reassert's are there, unless forgotten since)
	if sm == nil {
		b.memory.mu.Unlock()
		return nil
	}
	seen, recs := sm.marker, b.memory.restoreArgs(sm, now)
	if b.memory.scopes[scope] != sm {
		b.memory.mu.Unlock()
		return nil // only heard of, and nothing left to re-assert: forgotten
	}
	b.memory.mu.Unlock()

	tag := b.tag(scope)
	keys := append(make([]string, 0, 1+len(recs)), tag+":"+restoreKeys.suffixes[0])
	call := &restoreCall{b: b, n: len(recs), seen: seen, token: strconv.FormatUint(rand.Uint64(), 36)}
	args := restoreArgs.pack(make([]any, 0, restoreArgs.width()+restoreSrcArgs.width()*len(recs)), call)
	for _, r := range recs {
		keys = append(keys, tag+":src:"+*r.source+":"+brkKeys.suffixes[0]) // as appendSourceKeys
		rec := restoreRec{
			openedAgo: now.Sub(r.openedAt).Milliseconds(), overrideAgo: now.Sub(r.overrideAt).Milliseconds(),
			reopens: r.reopens, epoch: r.epoch, cause: r.cause, override: r.override, actor: r.actor, why: r.why,
		}
		if r.openUntil.After(now) {
			rec.openLeft = max(1, r.openUntil.Sub(now).Milliseconds())
		}
		args = restoreSrcArgs.pack(args, &rec)
	}
	v, err := b.runIn(ctx, rctx, op, restoreScript, keys, nil, args)
	if err != nil {
		return err
	}
	p := &parser{op: op}
	out := restoreReply.parse(p, v)
	if p.err != nil {
		return p.err
	}
	if out.marker == "" {
		return fmt.Errorf("redisgate: %s: empty marker in the reply", op)
	}
	// A missing marker at a first look is a new scope, unless there was
	// something to write.
	loss := out.lost == 1 && (seen != "" || out.restored > 0)
	b.memory.mu.Lock()
	sm.marker = out.marker
	sm.loss.Pending = false
	if loss {
		sm.loss.Count++
		sm.loss.Last, sm.loss.Restored = now, int(out.restored)
	}
	b.memory.mu.Unlock()
	if loss {
		n := b.memory.losses.Add(1)
		b.orphans.log.Error("redis lost the scope's state (restart without persistence, or failover to an empty replica); re-asserted the OPEN breakers and overrides this replica knew",
			"scope", scope, "restored", out.restored, "state_losses_total", n)
		if b.onLoss != nil {
			b.onLoss(scope, int(out.restored))
		}
	}
	return nil
}

// Records is every record this Backend keeps (the last OPEN and override it
// saw of each source), as of now: what a degraded on_unavailable: local
// gate starts from. A record of an OPEN whose cooldown has elapsed is
// included (the breaker is HALF_OPEN, or closed by a probe not heard of).
func (b *Backend) Records() []gate.Record {
	now := time.Now()
	b.memory.mu.Lock()
	defer b.memory.mu.Unlock()
	var out []gate.Record
	for scope, sm := range b.memory.scopes {
		for name, r := range sm.sources {
			rec := gate.Record{Scope: scope, Source: name, Reopens: r.reopens, Epoch: r.epoch, Cause: r.cause,
				Override: r.override, Actor: r.actor, Why: r.why, OverrideAgo: now.Sub(r.overrideAt)}
			if !r.openUntil.IsZero() {
				rec.Open, rec.OpenLeft, rec.OpenedAgo = true, r.openUntil.Sub(now), now.Sub(r.openedAt)
			}
			if rec.Open || rec.Override != gate.NoOverride {
				out = append(out, rec)
			}
		}
	}
	return out
}
