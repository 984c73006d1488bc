package gate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A line orders the callers that wait for one source's capacity
// (concurrency, RPM, TPM, pacer), in the backend, so that on a shared
// backend it is the fleet's: a waiter held by one replica ranked before a
// waiter held by another gets the slot first. Each source of a scope has
// its own line: a call waits in the lines of the sources that refused it
// for capacity, Admit checks each candidate's line in its walk, and a
// release hands off from the released source's line.
//
// Rank is static, fixed when a waiter joins, so that the order needs no
// re-scoring: a key of three fixed-width numbers compared as text.
//   - class: the priority, less one for each aging horizon (priority_aging)
//     of the arrival time: effective priority p + (now − t0)/H orders as
//     p − t0/H, counted in whole horizons so that within one horizon the
//     share decides. Higher first.
//   - share: start-time fair queuing across tenants. A waiter of tenant T
//     joins at max(V, last[T]) + Scale/weight(T), where last[T] is T's last
//     tag and V the tag of the last waiter granted: a tenant's share of the
//     grants follows its weight while it has demand, and a tenant that had
//     nobody waiting banks no share (it starts at V). Lower first.
//   - arrival: a counter of the line. Lower first.
//
// The share table holds a bucket per tenant with someone in line: its last
// tag, how many of its waiters are in line, and whether the configuration
// names it. A bucket is freed when its last waiter leaves the line (granted,
// gone or set aside), so the table holds the tenants waiting now, never the
// ones that passed through. A tenant the configuration names (Waiter.Named)
// always has its own bucket; beyond MaxTenants buckets of tenants it does
// not name, further ones share OverflowTenant's. When the line empties, V
// and the counter start over.
//
// A Pick of a waiter goes to the walk when it is the head, or was handed a
// slot (called) that it has not spent; a newcomer goes when nobody waits or
// it would rank before the head; any other Pick is queued without asking the
// quotas. A released slot calls the first waiter not called yet (handoff).
// Waiters leave on a grant, on a refusal by every breaker, on Leave, and
// when they vanish: a waiter whose replica has not been heard of for its
// lease, a called waiter that did not ask within its lease, and a waiter
// not heard of by its due (Waiter.Due, from its last Pick or read that
// joined). A waiter that vanished is set aside: a later Pick with its Place
// takes the same place back. Each vanishes by its own clock, so waiters
// whose callers left cost those behind them the longest of their dues, not
// the sum.
//
// The line holds at most LineCap waiters; a caller that finds it full has no
// place: it is not ordered, and its Picks are queued while anyone waits
// ahead of it, as any newcomer's.

// LineCap bounds a source's line.
const LineCap = 10000

// OverflowTenant is the bucket of tenants beyond a scope's max_tenants.
const OverflowTenant = "~other"

// ShareScale is a grant's share step for weight 1 (weights go to 1000).
const ShareScale = 1_000_000

// ClassOffset makes the class (higher first) a positive number ordered
// lower first.
const ClassOffset = 1 << 51

// Line is a source's line as the memory backend keeps it; the Redis
// backend's lib.lua follows it function by function.
type Line struct {
	entries []*lineEntry // by member
	byID    map[string]*lineEntry
	shares  map[string]*shareBucket // by tenant (or OverflowTenant)
	unnamed int                     // buckets of tenants the configuration does not name (not OverflowTenant's)
	v, seq  int64
	alive   map[string]int64 // replica → heard of until (ms)
}

// shareBucket is a tenant's entry in the share table.
type shareBucket struct {
	last    int64 // the tag of its last waiter to join
	waiting int   // its waiters in line
	unnamed bool  // counted in Line.unnamed
}

type lineEntry struct {
	member  string // key, then the id
	id      string
	replica string
	tenant  string
	prio    int32
	joined  int64
	called  int64 // until (ms); 0: not called
	due     int64 // kept until (ms) without word from the waiter; 0: no bound
}

// KeyLen is the length of a member's key: class, share, arrival.
const KeyLen = 48

// record is the entry as text: member|replica|joined|prio|tenant.
func (e *lineEntry) record() string {
	return e.member + "|" + e.replica + "|" + strconv.FormatInt(e.joined, 10) + "|" + strconv.FormatInt(int64(e.prio), 10) + "|" + e.tenant
}

func parseRecord(r string) (*lineEntry, bool) {
	f := strings.SplitN(r, "|", 5)
	if len(f) != 5 || len(f[0]) <= KeyLen {
		return nil, false
	}
	joined, err1 := strconv.ParseInt(f[2], 10, 64)
	prio, err2 := strconv.ParseInt(f[3], 10, 32)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return &lineEntry{member: f[0], id: f[0][KeyLen:], replica: f[1], joined: joined, prio: int32(prio), tenant: f[4]}, true
}

func (e *lineEntry) share() int64 {
	n, _ := strconv.ParseInt(e.member[16:32], 10, 64)
	return n
}

func (l *Line) init() {
	if l.byID == nil {
		l.byID, l.shares, l.alive = map[string]*lineEntry{}, map[string]*shareBucket{}, map[string]int64{}
	}
}

// Len is the number of waiters.
func (l *Line) Len() int { return len(l.entries) }

// insert puts e in line, counting it in its tenant's bucket (made if the
// tenant has none; named: the configuration names the tenant).
func (l *Line) insert(e *lineEntry, named bool) {
	i, _ := slices.BinarySearchFunc(l.entries, e.member, func(x *lineEntry, m string) int { return strings.Compare(x.member, m) })
	l.entries = slices.Insert(l.entries, i, e)
	l.byID[e.id] = e
	b := l.shares[e.tenant]
	if b == nil {
		b = &shareBucket{unnamed: !named && e.tenant != OverflowTenant}
		if b.unnamed {
			l.unnamed++
		}
		l.shares[e.tenant] = b
	}
	b.last = max(b.last, e.share())
	b.waiting++
}

// Lua twin: l_remove
func (l *Line) remove(e *lineEntry) {
	if i, ok := slices.BinarySearchFunc(l.entries, e.member, func(x *lineEntry, m string) int { return strings.Compare(x.member, m) }); ok {
		l.entries = slices.Delete(l.entries, i, i+1)
	}
	delete(l.byID, e.id)
	if b := l.shares[e.tenant]; b != nil {
		if b.waiting--; b.waiting <= 0 {
			delete(l.shares, e.tenant)
			if b.unnamed {
				l.unnamed--
			}
		}
	}
	if len(l.entries) == 0 {
		clear(l.shares)
		clear(l.alive)
		l.unnamed, l.v, l.seq = 0, 0, 0
	}
}

// Lua twin: l_live
func (l *Line) live(replica string, lease time.Duration, now int64) {
	if len(l.entries) > 0 {
		l.alive[replica] = now + lease.Milliseconds()
	}
}

// dead reports whether e's replica has not been heard of within its lease.
func (l *Line) dead(e *lineEntry, now int64) bool { return l.alive[e.replica] < now }

// gone reports whether e vanished: its replica silent, a slot handed to it
// not asked for in time, or no word from it by its due.
func (l *Line) gone(e *lineEntry, now int64) bool {
	return l.dead(e, now) || (e.called != 0 && e.called < now) || (e.due != 0 && e.due < now)
}

// Lua twin: l_heard
// heard keeps e's place for w.Due from now.
func (e *lineEntry) heard(w *Waiter, now int64) {
	e.due = 0
	if d := w.Due.Milliseconds(); d > 0 {
		e.due = now + d
	}
}

// Lua twin: l_head
// head is the first live waiter (nil when none), setting aside on the way
// those that vanished.
func (l *Line) head(now int64) *lineEntry {
	for len(l.entries) > 0 {
		e := l.entries[0]
		if l.gone(e, now) {
			l.remove(e)
			continue
		}
		return e
	}
	return nil
}

// Lua twin: l_key
// key is where a waiter of w would join now: its tenant's bucket, share tag
// and key. A tenant the configuration does not name, without a bucket,
// joins OverflowTenant's when MaxTenants such tenants have one.
func (l *Line) key(w *Waiter, now int64) (tenant string, share int64, key string) {
	tenant, weight := w.Tenant, w.Weight
	if _, known := l.shares[tenant]; !known && !w.Named && l.unnamed >= w.MaxTenants {
		tenant, weight = OverflowTenant, w.OtherWeight
	}
	last := int64(0)
	if b := l.shares[tenant]; b != nil {
		last = b.last
	}
	share = max(l.v, last) + ShareScale/int64(max(1, weight))
	class := int64(w.Priority)
	if h := w.Aging.Milliseconds(); h > 0 {
		class -= now / h
	}
	return tenant, share, fmt.Sprintf("%016d%016d%016d", ClassOffset-class, share, l.seq+1)
}

// Lua twin: l_enter
// enter gives w its place back, or a new one, or keeps the one it has;
// "" when the line is full.
func (l *Line) enter(w *Waiter, now int64) string {
	if e := l.byID[w.ID]; e != nil {
		e.heard(w, now)
		return e.record()
	}
	if len(l.entries) >= LineCap {
		l.head(now) // those that vanished at the front; no scan of the whole line
		if len(l.entries) >= LineCap {
			return ""
		}
	}
	l.alive[w.Replica] = now + w.Lease.Milliseconds()
	if e, ok := parseRecord(w.Place); ok && e.id == w.ID {
		e.replica = w.Replica
		e.heard(w, now)
		l.insert(e, w.Named)
		return e.record()
	}
	tenant, _, key := l.key(w, now)
	l.seq++
	e := &lineEntry{member: key + w.ID, id: w.ID, replica: w.Replica, tenant: tenant, prio: w.Priority, joined: now}
	e.heard(w, now)
	l.insert(e, w.Named)
	return e.record()
}

// Lua twin: l_check
// Check decides whether a Pick of w goes to the walk (true) or is queued.
// A waiter in line is heard of; one set aside takes its place back.
func (l *Line) Check(w *Waiter, now int64) bool {
	l.init()
	if len(l.entries) == 0 && w.Place == "" {
		return true
	}
	l.live(w.Replica, w.Lease, now)
	e := l.byID[w.ID]
	switch {
	case e != nil:
		e.heard(w, now)
	case w.Place != "":
		l.enter(w, now)
		e = l.byID[w.ID]
	}
	head := l.head(now)
	switch {
	case head == nil:
		return true
	case e != nil:
		return e == head || e.called >= now
	}
	_, _, key := l.key(w, now)
	return key < head.member[:KeyLen]
}

// Lua twin: l_after
// After records the walk's result for w and returns its place: a grant
// leaves the line (its tag becomes V); a refusal for capacity keeps the place
// (a slot it was handed is spent); a refusal by every breaker leaves.
func (l *Line) After(w *Waiter, granted, capacity bool) string {
	l.init()
	e := l.byID[w.ID]
	if e == nil {
		return ""
	}
	switch {
	case granted:
		l.v = max(l.v, e.share())
		l.remove(e)
		return ""
	case capacity:
		e.called = 0
		return e.record()
	}
	l.remove(e)
	return ""
}

// Lua twin: l_handoff
// Handoff hands a released slot to the first waiter not called yet, and
// returns its id ("" when nobody waits uncalled).
func (l *Line) Handoff(h *LineHandoff, now int64) string {
	l.init()
	l.live(h.Replica, h.Lease, now)
	for i := 0; i < len(l.entries); {
		e := l.entries[i]
		switch {
		case l.gone(e, now):
			l.remove(e)
		case e.called != 0:
			i++
		default:
			e.called = now + h.Lease.Milliseconds()
			return e.id
		}
	}
	return ""
}

// Lua twin: l_read
// Read is Peek's part: join, the replica's waiters at the front, and the
// counts.
func (l *Line) Read(r *LineRead, now int64) LineView {
	l.init()
	var v LineView
	l.live(r.Replica, r.Lease, now)
	if r.Join != nil {
		v.Place = l.enter(r.Join, now)
	}
	for i := 0; i < len(l.entries); {
		e := l.entries[i]
		if l.gone(e, now) {
			l.remove(e)
			continue
		}
		if e.called == 0 {
			if i == 0 && e.replica == r.Replica {
				v.Head = e.id
			}
			break
		}
		if e.replica == r.Replica {
			v.Wake = append(v.Wake, e.id)
		}
		i++
	}
	if r.Describe {
		groups := map[LineGroup]int{}
		for _, e := range slices.Clone(l.entries[:min(len(l.entries), DescribeMax)]) {
			if l.dead(e, now) {
				l.remove(e)
				continue
			}
			v.Oldest = max(v.Oldest, time.Duration(now-e.joined)*time.Millisecond)
			groups[LineGroup{Priority: e.prio, Tenant: e.tenant}]++
		}
		for g, n := range groups {
			g.Waiting = n
			v.Groups = append(v.Groups, g)
		}
		SortGroups(v.Groups)
	}
	v.Length = len(l.entries)
	return v
}

// Leave takes a waiter out of the line.
func (l *Line) Leave(id string) {
	l.init()
	if e := l.byID[id]; e != nil {
		l.remove(e)
	}
}
