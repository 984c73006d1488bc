package fallback

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/enum"
)

// Mode is what to do while the shared backend is unavailable.
type Mode uint8

const (
	// FailClosed returns the shared backend's error (the server answers
	// UNAVAILABLE); every call still tries the shared backend first.
	FailClosed Mode = iota
	// Local serves calls from a memory backend whose limits are this
	// replica's share, and checks at most every PingEvery whether the shared
	// backend answers again.
	Local
)

var modeNames = []string{
	FailClosed: "fail_closed",
	Local:      "local",
}

func (m Mode) String() string { return enum.String(m, modeNames) }

// Shared is the backend to protect: the Redis backend.
type Shared interface {
	gate.Backend
	// Ping reports whether the backend answers; its error wraps
	// gate.ErrUnavailable when it does not.
	Ping(ctx context.Context) error
}

// DefaultPingEvery is how often a degraded Local backend checks the shared one.
const DefaultPingEvery = time.Second

// Options configure a Backend.
type Options struct {
	Mode Mode
	// Replicas is how many replicas share the limits: the local backend
	// gives each source MaxConcurrency, RPM and TPM divided by it, rounded
	// up, at least 1 (a 0 limit stays unlimited). Values below 1 count as 1.
	Replicas int
	// PingEvery is the least time between two checks of the shared backend
	// while degraded in Local mode; default DefaultPingEvery.
	PingEvery time.Duration
	// OnChange is called once per change of mode, in order, with the error
	// that made the backend degraded (nil when it recovers). It must not
	// call the Backend.
	OnChange func(degraded bool, cause error)
	// Now is the clock of the local backend and of the checks; default time.Now.
	Now func() time.Time
}

// Backend is a gate.Backend that delegates to a shared one and follows
// Options.Mode while that one is unavailable.
//
// In Local mode the local backend knows of the shared state only what a
// Recorder remembers of its breakers (OPEN ones and overrides): a
// permit the shared backend granted and that is settled while degraded is
// reported stale (and handed to the shared backend to settle later, see
// Settle). Permits the local backend granted still hold their slots when
// the shared backend is back, which it does not know of: until they are
// settled (locally) or their leases end, its Admits and Peeks of their
// sources leave them room (see lent). The reverse holds too: permits the
// shared backend granted this replica still hold their slots when it goes
// away, which the local backend does not know of; until they are settled
// or their leases end, local Admits and Peeks of their sources leave them
// room (see out). Override is never served locally: an operator's action
// that would vanish when the shared backend comes back fails instead.
type Backend struct {
	shared Shared
	local  *inmem.Backend
	o      Options
	lent   lent
	out    out

	degraded atomic.Bool
	kept     atomic.Int64  // see Kept
	changes  atomic.Uint64 // counts changes of mode, twice each (odd while one is under way)
	nextPing atomic.Int64  // UnixNano of the next allowed check
	mu       sync.Mutex    // serializes changes of mode and their OnChange
}

var _ gate.Backend = (*Backend)(nil)

// New wraps shared.
func New(shared Shared, o Options) *Backend {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.PingEvery <= 0 {
		o.PingEvery = DefaultPingEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Backend{shared: shared, local: inmem.New(o.Now), o: o}
}

// Degraded reports whether the shared backend is currently held unavailable.
func (b *Backend) Degraded() bool { return b.degraded.Load() }

// Kept is how many of the local backend's breakers the last change to
// degraded (in Local mode) left OPEN, HALF_OPEN or overridden, from what the
// replica knew of the shared ones: OnChange may log it.
func (b *Backend) Kept() int { return int(b.kept.Load()) }

// Check asks the shared backend whether it answers, and records the answer
// as any call would: a change of mode is reported through OnChange.
func (b *Backend) Check(ctx context.Context) error {
	seen := b.changes.Load()
	err := b.shared.Ping(ctx)
	b.observe(err, seen)
	return err
}

// Admit implements gate.Backend. A permit granted by one side while the
// mode changed (a decision in flight at the switch) may not have been
// counted by the other side's decisions since: it is given back where it
// was granted and the Admit is asked again, once, so that the switch
// never makes more holders than the limits (see lent and out). The count
// of changes is read before call reads the mode, so that a change between
// the two is seen; an odd count is a change under way (see set).
func (b *Backend) Admit(ctx context.Context, req gate.AdmitRequest) (gate.Admission, error) {
	for try := 0; ; try++ {
		var racedShared, racedLocal bool
		seen := b.changes.Load()
		raced := func() bool { return seen%2 == 1 || b.changes.Load() != seen }
		a, err := call(b, ctx,
			func() (gate.Admission, error) {
				a, err := b.shared.Admit(ctx, b.leaveRoom(ctx, req))
				if err == nil && a.Granted && b.o.Mode == Local {
					b.out.add(req, a.Permit, b.o.Now())
					racedShared = raced()
				}
				return a, err
			},
			func() (gate.Admission, error) {
				a, err := b.local.Admit(ctx, b.leaveOut(b.share(b.localAdmit(req))))
				if err == nil && a.Granted {
					b.lent.add(req.Scope, a.Permit.Source)
					racedLocal = raced()
				}
				return a, err
			})
		if try > 0 || !(racedShared || racedLocal) {
			return a, err
		}
		give := gate.SettleRequest{Scope: req.Scope, Source: grantedSource(req, a.Permit), PermitID: a.Permit.ID,
			Epoch: a.Permit.Epoch, Probe: a.Permit.Probe, Verdict: gate.VerdictNone, ActualTokens: 0}
		// The same permit id again: the one given back no longer holds a
		// slot where it was granted, and the other side never had it.
		if racedLocal {
			_, _ = b.local.Settle(ctx, b.localSettle(give))
		} else {
			_, _ = b.Settle(ctx, give) // to Redis, or deferred for it
		}
	}
}

// grantedSource is the candidate of req that p is of.
func grantedSource(req gate.AdmitRequest, p gate.Permit) *gate.Source {
	for _, c := range req.Candidates {
		if c.Source.Name == p.Source {
			return c.Source
		}
	}
	return &gate.Source{Name: p.Source}
}

// Settle implements gate.Backend. A settle served locally may be of a
// permit the shared backend granted before it went away: a shared backend
// that can defer settles (a Deferrer) is handed it too, to settle when it
// answers again, so that its slot does not stay held until its lease ends.
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	// Its holder is done: a permit of the shared backend that the local
	// backend left room for frees that room.
	wasOut := req.Source != nil && b.out.remove(req.Scope, req.Source.Name, req.PermitID)
	return call(b, ctx,
		func() (gate.Settlement, error) {
			if req.Source != nil && b.lent.has(req.Scope, req.Source.Name) {
				// Perhaps a permit the local backend granted: settle it
				// there, where its slot is held.
				if st, err := b.local.Settle(ctx, b.localSettle(req)); err == nil && st.Released {
					return st, nil
				}
			}
			return b.shared.Settle(ctx, req)
		},
		func() (gate.Settlement, error) {
			if d, ok := b.shared.(Deferrer); ok {
				d.DeferSettle(req)
			}
			st, err := b.local.Settle(ctx, b.localSettle(req))
			st.Released = st.Released || wasOut // wakes callers held for its room (those in a line: the poller)
			return st, err
		})
}

// localReplica names this degradation's waiters in the local lines, a new
// name each time the mode changes: waiters of an earlier outage, granted or
// gone through the shared backend since, are then not kept alive by this
// one's reads, and leave the local lines with their lease.
func (b *Backend) localReplica() string {
	return "local-" + strconv.FormatUint((b.changes.Load()+1)/2, 10) // the change under way's number while it is under way
}

func (b *Backend) localAdmit(req gate.AdmitRequest) gate.AdmitRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(w *gate.Waiter) { w.Replica = r })
	return req
}

func (b *Backend) localPeek(req gate.PeekRequest) gate.PeekRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(l *gate.LineRead) {
		l.Replica = r
		l.Join = withCopy(l.Join, func(w *gate.Waiter) { w.Replica = r })
	})
	return req
}

func (b *Backend) localSettle(req gate.SettleRequest) gate.SettleRequest {
	r := b.localReplica()
	req.Line = withCopy(req.Line, func(h *gate.LineHandoff) { h.Replica = r })
	return req
}

// withCopy is a changed copy of *p (the caller's request is not touched);
// nil stays nil.
func withCopy[T any](p *T, change func(*T)) *T {
	if p == nil {
		return nil
	}
	c := *p
	change(&c)
	return &c
}

// Recorder is a shared backend that remembers the OPEN breakers and the
// overrides it saw (redisgate's records of them). At each change to
// degraded in Local mode the local backend adopts them, with the probes
// of the shared backend this replica holds (see records and
// inmem.Backend.Adopt), so that a source forced open, OPEN or being probed
// in the shared backend stays so while it is away.
type Recorder interface {
	Records() []gate.Record
}

// Deferrer is a shared backend that can keep a settle until it answers.
type Deferrer interface {
	DeferSettle(req gate.SettleRequest)
}

// Peek implements gate.Backend.
// Its in_flight counts the other side's permits still out that its
// verdicts leave room for, so that a refusal is explained by what it shows.
func (b *Backend) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	return call(b, ctx,
		func() (gate.Snapshot, error) {
			n := b.room(ctx, req.Scope, req.Sources)
			snap, err := b.shared.Peek(ctx, lessPeek(req, n))
			return addInFlight(snap, n), err
		},
		func() (gate.Snapshot, error) {
			n := b.outOf(req.Scope, req.Sources)
			snap, err := b.local.Peek(ctx, lessPeek(b.sharePeek(b.localPeek(req)), n))
			return addInFlight(snap, n), err
		})
}

// addInFlight is snap with n[i] more in flight on source i (n may be nil).
func addInFlight(snap gate.Snapshot, n []int) gate.Snapshot {
	for i := range snap.Sources {
		if i < len(n) {
			snap.Sources[i].Quota.InFlight += n[i]
		}
	}
	return snap
}

// Leave implements gate.Backend.
func (b *Backend) Leave(ctx context.Context, req gate.LeaveRequest) error {
	_, err := call(b, ctx,
		func() (struct{}, error) { return struct{}{}, b.shared.Leave(ctx, req) },
		func() (struct{}, error) { return struct{}{}, b.local.Leave(ctx, req) })
	return err
}

// Override implements gate.Backend; it always goes to the shared backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	seen := b.changes.Load()
	r, err := b.shared.Override(ctx, req)
	b.observe(err, seen)
	return r, err
}

// call runs shared unless the Backend is degraded in Local mode, and falls
// back to local when shared is unavailable and the mode allows it.
func call[T any](b *Backend, ctx context.Context, shared, local func() (T, error)) (T, error) {
	if b.o.Mode == Local && b.degraded.Load() && !b.recovered(ctx) {
		return local()
	}
	seen := b.changes.Load()
	v, err := shared()
	b.observe(err, seen)
	if err != nil && b.o.Mode == Local && errors.Is(err, gate.ErrUnavailable) {
		return local()
	}
	return v, err
}

// observe updates the mode after a call to the shared backend that began
// when the mode had changed seen times. A success that began before the
// latest change (a call that was on its way when another one failed) does
// not end a degradation: only a call or a check begun since may.
func (b *Backend) observe(err error, seen uint64) {
	switch {
	case err == nil:
		if b.changes.Load() == seen {
			b.set(false, nil)
		}
	case errors.Is(err, gate.ErrUnavailable):
		b.set(true, err)
	}
}

// recovered checks the shared backend, at most once per PingEvery over all
// callers, and reports whether it answers again.
func (b *Backend) recovered(ctx context.Context) bool {
	now := b.o.Now().UnixNano()
	next := b.nextPing.Load()
	if now < next || !b.nextPing.CompareAndSwap(next, now+int64(b.o.PingEvery)) {
		return false
	}
	seen := b.changes.Load()
	err := b.shared.Ping(ctx)
	b.observe(err, seen)
	return err == nil
}

func (b *Backend) set(degraded bool, cause error) {
	if b.degraded.Load() == degraded {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.degraded.Load() == degraded {
		return
	}
	if degraded {
		b.nextPing.Store(b.o.Now().UnixNano() + int64(b.o.PingEvery))
		if b.o.Mode == Local {
			// Before any call is served locally.
			b.kept.Store(int64(b.local.Adopt(b.records())))
		}
	}
	// The count of changes goes up before and after the mode (odd while it
	// changes), so that a decision whose read of the count and of the mode
	// straddle the change is seen by Admit's check.
	b.changes.Add(1)
	b.degraded.Store(degraded)
	b.changes.Add(1)
	if b.o.OnChange != nil {
		b.o.OnChange(degraded, cause)
	}
}

// share gives each candidate this replica's share of its limits.
func (b *Backend) share(req gate.AdmitRequest) gate.AdmitRequest {
	if b.o.Replicas == 1 {
		return req
	}
	out := req
	out.Candidates = make([]gate.Candidate, len(req.Candidates))
	for i, c := range req.Candidates {
		out.Candidates[i] = b.shareOf(c)
	}
	return out
}

// sharePeek asks for the local verdicts with the limits the local Admit
// enforces, so that a caller is never told to retry what Admit refuses.
func (b *Backend) sharePeek(req gate.PeekRequest) gate.PeekRequest {
	if b.o.Replicas == 1 {
		return req
	}
	out := req
	out.Sources = make([]*gate.Source, len(req.Sources))
	out.Ceilings = make([]int, len(req.Sources))
	for i := range req.Sources {
		c := b.shareOf(req.Candidate(i))
		out.Sources[i], out.Ceilings[i] = c.Source, c.Ceiling
	}
	return out
}

// shareOf is c with this replica's share of its limits and ceiling.
func (b *Backend) shareOf(c gate.Candidate) gate.Candidate {
	n := b.o.Replicas
	src := *c.Source
	src.Limits.MaxConcurrency = int(part(int64(src.Limits.MaxConcurrency), n))
	src.Limits.RPM = part(src.Limits.RPM, n)
	src.Limits.TPM = part(src.Limits.TPM, n)
	return gate.Candidate{Source: &src, Ceiling: min(int(part(int64(c.Ceiling), n)), src.Limits.MaxConcurrency)}
}

// part is v/n rounded up, at least 1; 0 (unlimited) stays 0.
func part(v int64, n int) int64 {
	if v <= 0 {
		return v
	}
	q := v / int64(n)
	if v%int64(n) != 0 {
		q++ // rounded up without v+n-1, which wraps near the top of int64
	}
	return max(1, q)
}

// lent marks the sources, by scope, of which the local backend granted
// permits that may still hold their slots. It is empty (and costs one
// atomic load per call) unless the Backend served permits locally.
type lent struct {
	n  atomic.Int64 // len(by)
	mu sync.Mutex
	by map[lentKey]struct{}
}

type lentKey struct{ scope, source string }

func (l *lent) add(scope, source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[lentKey]struct{}{}
	}
	l.by[lentKey{scope, source}] = struct{}{}
	l.n.Store(int64(len(l.by)))
}

func (l *lent) has(scope, source string) bool {
	if l.n.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.by[lentKey{scope, source}]
	return ok
}

func (l *lent) drop(scope, source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.by, lentKey{scope, source})
	l.n.Store(int64(len(l.by)))
}

// room is the local backend's permits in flight of each of srcs (nil when
// none is lent), forgetting the sources that have none left.
func (b *Backend) room(ctx context.Context, scope string, srcs []*gate.Source) []int {
	if b.lent.n.Load() == 0 {
		return nil
	}
	var out []int
	for i, src := range srcs {
		if src == nil || !b.lent.has(scope, src.Name) {
			continue
		}
		snap, err := b.local.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}})
		if err != nil || len(snap.Sources) != 1 {
			continue
		}
		n := snap.Sources[0].Quota.InFlight
		if n == 0 {
			b.lent.drop(scope, src.Name)
			continue
		}
		if out == nil {
			out = make([]int, len(srcs))
		}
		out[i] = n
	}
	return out
}

// leaveRoom is req with the slots of the local backend's permits still out
// taken from its candidates' limits and ceilings.
func (b *Backend) leaveRoom(ctx context.Context, req gate.AdmitRequest) gate.AdmitRequest {
	if b.lent.n.Load() == 0 {
		return req
	}
	srcs := make([]*gate.Source, len(req.Candidates))
	for i, c := range req.Candidates {
		srcs[i] = c.Source
	}
	return lessAdmit(req, b.room(ctx, req.Scope, srcs))
}

// out is the permits the shared backend granted this replica (in Local
// mode) that are neither settled nor past their leases, by scope and
// source: their holders still use the upstream's slots, so the local
// backend leaves them room while the shared one is away. It costs one
// atomic load per Settle while empty.
type out struct {
	n  atomic.Int64 // len(of)
	mu sync.Mutex
	by map[lentKey]*outSource
	of map[string]lentKey // permit → its source
}

type outSource struct {
	ends map[string]int64 // permit → end of its lease (UnixNano)
	// soonest is at most the earliest of ends: expire looks through them
	// only once it has passed (as gate.Quota does).
	soonest int64
	// probe is the permit of ends that holds the breaker's HALF_OPEN
	// probe ("" none), of epoch, until probeEnd (UnixNano).
	probe    string
	epoch    uint64
	probeEnd int64
	// prune is the size at which ends is next rid of its ended leases, so
	// that permits whose holders never report cost amortized O(1) each.
	prune int
	// minute is the admissions of the last minute (local clock, ms), of a
	// source with an RPM or TPM, for the local backend to count at the
	// switch; at most maxMinute, the oldest dropped first.
	minute []gate.Charge
}

// maxMinute bounds the admissions of one source kept for the switch.
const maxMinute = 1 << 16

// add keeps p, which the shared backend granted for req at now.
func (o *out) add(req gate.AdmitRequest, p gate.Permit, now time.Time) {
	scope, source, id := req.Scope, p.Source, p.ID
	end := now.Add(p.Lease).UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by, o.of = map[lentKey]*outSource{}, map[string]lentKey{}
	}
	k := lentKey{scope, source}
	s := o.by[k]
	if s == nil {
		s = &outSource{ends: map[string]int64{}, prune: 16}
		o.by[k] = s
	}
	if len(s.ends) >= s.prune {
		o.expire(s, now.UnixNano())
		s.prune = max(16, 2*len(s.ends))
	}
	if len(s.ends) == 0 || end < s.soonest {
		s.soonest = end
	}
	s.ends[id] = end
	o.of[id] = k
	src := grantedSource(req, p)
	if p.Probe {
		s.probe, s.epoch, s.probeEnd = id, p.Epoch, now.Add(src.Breaker.ProbeTTL).UnixNano()
	}
	if src.Limits.RPM > 0 || src.Limits.TPM > 0 {
		ms := now.UnixMilli()
		i := 0
		for i < len(s.minute) && (s.minute[i].At+gate.Minute <= ms || len(s.minute)-i >= maxMinute) {
			i++
		}
		s.minute = append(s.minute[i:], gate.Charge{At: ms, Tokens: p.Tokens})
	}
	o.n.Store(int64(len(o.of)))
}

// remove forgets a permit and reports whether it was kept.
func (o *out) remove(scope, source, id string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k, ok := o.of[id]
	if !ok || k != (lentKey{scope, source}) {
		return false
	}
	delete(o.of, id)
	if s := o.by[k]; s != nil { // kept when empty: the next grant reuses it
		delete(s.ends, id)
		if s.probe == id {
			s.probe = ""
		}
	}
	o.n.Store(int64(len(o.of)))
	return true
}

// count is the permits of the source still out at now (UnixNano).
func (o *out) count(scope, source string, now int64) int {
	if o.n.Load() == 0 {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k := lentKey{scope, source}
	s := o.by[k]
	if s == nil {
		return 0
	}
	o.expire(s, now)
	return len(s.ends)
}

// expire forgets the permits of s whose leases ended by now. The caller
// holds o.mu.
func (o *out) expire(s *outSource, now int64) {
	if len(s.ends) > 0 && now >= s.soonest {
		s.soonest = math.MaxInt64
		for id, end := range s.ends {
			if end <= now {
				delete(s.ends, id)
				delete(o.of, id)
			} else {
				s.soonest = min(s.soonest, end)
			}
		}
	}
	if _, ok := s.ends[s.probe]; !ok || s.probeEnd <= now {
		s.probe = ""
	}
	o.n.Store(int64(len(o.of)))
}

// less is c with n fewer slots and n less ceiling (n permits the other
// backend granted hold them); a ceiling of 0 makes the source full, so
// that a Peek (where 0 means no pacer) and an Admit agree.
func less(c gate.Candidate, n int) gate.Candidate {
	src := *c.Source
	src.Limits.MaxConcurrency = max(0, src.Limits.MaxConcurrency-n)
	c.Ceiling = max(0, c.Ceiling-n)
	if c.Ceiling == 0 {
		src.Limits.MaxConcurrency = 0
	}
	c.Source = &src
	return c
}

// lessAdmit is req with less(c, n[i]) for each candidate i (req when n is nil).
func lessAdmit(req gate.AdmitRequest, n []int) gate.AdmitRequest {
	if n == nil {
		return req
	}
	req.Candidates = slices.Clone(req.Candidates)
	for i, c := range req.Candidates {
		if n[i] > 0 {
			req.Candidates[i] = less(c, n[i])
		}
	}
	return req
}

// lessPeek is lessAdmit for a Peek, so that its verdicts are Admit's.
func lessPeek(req gate.PeekRequest, n []int) gate.PeekRequest {
	if n == nil {
		return req
	}
	srcs, ceilings := slices.Clone(req.Sources), make([]int, len(req.Sources))
	for i := range req.Sources {
		c := req.Candidate(i)
		if n[i] > 0 {
			c = less(c, n[i])
		}
		srcs[i], ceilings[i] = c.Source, c.Ceiling
	}
	req.Sources, req.Ceilings = srcs, ceilings
	return req
}

// outOf is the shared backend's permits still out of each of srcs (nil
// when none is).
func (b *Backend) outOf(scope string, srcs []*gate.Source) []int {
	if b.out.n.Load() == 0 {
		return nil
	}
	now := b.o.Now().UnixNano()
	var n []int
	for i, src := range srcs {
		if k := b.out.count(scope, src.Name, now); k > 0 {
			if n == nil {
				n = make([]int, len(srcs))
			}
			n[i] = k
		}
	}
	return n
}

// leaveOut is req (already the local share) with room left for the shared
// backend's permits still out.
func (b *Backend) leaveOut(req gate.AdmitRequest) gate.AdmitRequest {
	if b.out.n.Load() == 0 {
		return req
	}
	srcs := make([]*gate.Source, len(req.Candidates))
	for i, c := range req.Candidates {
		srcs[i] = c.Source
	}
	return lessAdmit(req, b.outOf(req.Scope, srcs))
}

// records is what the local backend starts an outage from: the shared
// backend's records (a Recorder's), the HALF_OPEN probes the shared
// backend granted this replica that are still out, so that their outcomes
// decide the local breakers, and the admissions it made for this replica
// over the last minute, so that RPM and TPM hold across the switch.
func (b *Backend) records() []gate.Record {
	var recs []gate.Record
	if r, ok := b.shared.(Recorder); ok {
		recs = r.Records()
	}
	now := b.o.Now().UnixNano()
	b.out.mu.Lock()
	defer b.out.mu.Unlock()
	for k, s := range b.out.by {
		probe := s.probe != "" && s.probeEnd > now
		if !probe && len(s.minute) == 0 {
			continue
		}
		i := slices.IndexFunc(recs, func(r gate.Record) bool { return r.Scope == k.scope && r.Source == k.source })
		if i < 0 {
			recs = append(recs, gate.Record{Scope: k.scope, Source: k.source})
			i = len(recs) - 1
		}
		if probe {
			recs[i].Probe, recs[i].Epoch, recs[i].ProbeLeft = s.probe, s.epoch, time.Duration(s.probeEnd-now)
		}
		// Handed over: the next switch counts only what Redis admits since.
		recs[i].Minute, s.minute = s.minute, nil
	}
	return recs
}
