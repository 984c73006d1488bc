package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/policy"
)

// endedRetention is how long an ended call is at least remembered, so that a
// client retrying its last RecordOutcome gets the same answer.
const endedRetention = time.Minute

// endedGenerations is how many generations of ended calls are kept. A
// generation takes the calls that end during endedRetention/(n-1) and is
// dropped whole n-1 rotations later: an ended call is remembered between
// endedRetention and endedRetention·n/(n-1), and forgetting costs one map
// dropped per rotation, however many calls end per second.
const endedGenerations = 3

// sessions holds the calls the sidecar has open: their ids, their idle
// expiry, and a cap on how many may be live at once so that a misbehaving
// client cannot exhaust memory. Live calls are in one map; those no RPC is
// in also in a list in the order they went idle, which the sweep reads from
// the front until it finds one not idle long enough (so a sweep costs the
// calls it forgets, not the live ones: 10 000 calls held in OnNoRunnable are
// not visited every second); ended calls in generations of maps that are
// dropped whole.
type sessions struct {
	max  int
	idle time.Duration

	mu       sync.Mutex
	live     map[string]*session // calls that have not ended (or were not seen to)
	byScope  map[string]int      // live calls by scope
	byTenant map[scopeTenant]int // live calls by scope and tenant, as the calls name it
	quiet    idleList            // live calls no RPC is in, by when the last one ended
	ended    [endedGenerations]map[string]*session
	rotated  time.Time // when ended[0] started
}

// scopeTenant is a tenant of a scope, as a call names it ("" none).
type scopeTenant struct{ scope, tenant string }

// liveCap is the max_live_calls a new call of a tenant must fit in: max
// (0: none) over the tenant's calls when named names it, else over the
// calls of every tenant named does not name, together.
type liveCap struct {
	max   int
	named map[string]config.Tenant
}

// A session and its call are one allocation (open), 288 bytes: a size
// class smaller than they were with an int for busy and padding between
// the flags.
type session struct {
	call    *policy.Call
	touched time.Time
	// prev and next link the session in sessions.quiet while it is in it
	// (listed).
	prev, next *session
	busy       int32 // RPCs of this call in progress (as many as its streams)
	ended      bool  // moved to the ended generations
	listed     bool
}

// sessionCall is a session and its call, one allocation (open).
type sessionCall struct {
	session
	call policy.Call
}

// idleList is a list of sessions linked through the sessions themselves (no
// allocation per entry). Sessions go in at the back as their last RPC ends,
// under sessions.mu, so it is in the order of touched: a monotonic reading,
// never earlier than the one before it.
type idleList struct{ front, back *session }

func (l *idleList) pushBack(s *session) {
	l.remove(s)
	s.prev, s.next, s.listed = l.back, nil, true
	if l.back != nil {
		l.back.next = s
	} else {
		l.front = s
	}
	l.back = s
}

func (l *idleList) remove(s *session) {
	if !s.listed {
		return
	}
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		l.front = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		l.back = s.prev
	}
	s.prev, s.next, s.listed = nil, nil, false
}

func newSessions(max int, idle time.Duration) *sessions {
	s := &sessions{max: max, idle: idle, live: make(map[string]*session), byScope: make(map[string]int),
		byTenant: make(map[scopeTenant]int), rotated: time.Now()}
	for i := range s.ended {
		s.ended[i] = make(map[string]*session)
	}
	return s
}

// configure applies reloaded limits.
func (s *sessions) configure(max int, idle time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max, s.idle = max, idle
}

// open starts a call of tenant at priority and holds it busy for the RPC
// that opened it; the tenant's calls must fit in lim.
func (s *sessions) open(scope, tenant string, priority int32, tokens int64, deadline time.Duration, lim liveCap) (*session, error) {
	id := policy.NewID("c") // outside the lock: crypto/rand
	now := time.Now()
	var until time.Time
	if deadline > 0 {
		until = now.Add(deadline)
	}
	// The session and its call are one allocation (they live and die
	// together).
	both := &sessionCall{session: session{busy: 1, touched: now}}
	both.call.Init(id, scope, tokens, until, now)
	both.call.Tenant, both.call.Priority = tenant, priority
	sess := &both.session
	sess.call = &both.call
	s.mu.Lock()
	defer s.mu.Unlock()
	if lim.max > 0 && s.tenantLive(scope, tenant, lim.named) >= lim.max {
		return nil, &tenantError{err: errTenantTooManyCalls, tenant: tenant, limit: lim.max}
	}
	if n := len(s.live); n >= s.max {
		return nil, fmt.Errorf("%w: %d calls are open (calls.max_live)", errTooManyCalls, n)
	}
	s.live[id] = sess
	s.byScope[scope]++
	s.byTenant[scopeTenant{scope, tenant}]++
	return sess, nil
}

// tenantLive counts the live calls of tenant in scope: its own when named
// names it, else those of every tenant named does not name. Called with mu
// held.
func (s *sessions) tenantLive(scope, tenant string, named map[string]config.Tenant) int {
	if _, ok := named[tenant]; ok {
		return s.byTenant[scopeTenant{scope, tenant}]
	}
	n := s.byScope[scope]
	for name := range named {
		n -= s.byTenant[scopeTenant{scope, name}]
	}
	return n
}

// tenantsLive counts the live calls of each tenant of names in scope (as
// tenantLive; gate.OverflowTenant, which named never names, counts the
// tenants named does not name).
func (s *sessions) tenantsLive(scope string, names []string, named map[string]config.Tenant) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, len(names))
	for i, name := range names {
		out[i] = s.tenantLive(scope, name, named)
	}
	return out
}

// find looks an id up among the live and the remembered ended calls.
func (s *sessions) find(id string) (*session, bool) {
	if sess, ok := s.live[id]; ok {
		return sess, true
	}
	for _, gen := range s.ended {
		if sess, ok := gen[id]; ok {
			return sess, true
		}
	}
	return nil, false
}

// acquire holds an open call busy for one RPC.
func (s *sessions) acquire(id, scope string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.find(id)
	if !ok {
		return nil, fmt.Errorf("%w: %s", errUnknownCall, clip(id))
	}
	if sess.call.Scope != scope {
		return nil, badField("scope", "call %s belongs to scope %q, not %s", id, sess.call.Scope, clip(scope))
	}
	sess.busy++
	sess.touched = time.Now()
	s.quiet.remove(sess)
	return sess, nil
}

// release ends an RPC of the call; a call that has ended moves to the
// current generation of ended calls.
func (s *sessions) release(sess *session) {
	ended := sess.call.Ended() // outside the lock: the call's own
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.busy--
	sess.touched = time.Now()
	if ended && !sess.ended {
		if _, ok := s.live[sess.call.ID]; ok {
			s.forget(sess)
			s.ended[0][sess.call.ID] = sess
		}
		sess.ended = true
	}
	if _, live := s.live[sess.call.ID]; live && sess.busy == 0 {
		s.quiet.pushBack(sess)
	}
}

// forget removes a live call from the live set.
func (s *sessions) forget(sess *session) {
	s.quiet.remove(sess)
	delete(s.live, sess.call.ID)
	if s.byScope[sess.call.Scope]--; s.byScope[sess.call.Scope] <= 0 {
		delete(s.byScope, sess.call.Scope)
	}
	k := scopeTenant{sess.call.Scope, sess.call.Tenant}
	if s.byTenant[k]--; s.byTenant[k] <= 0 {
		delete(s.byTenant, k)
	}
}

// discard forgets a call whose opening Pick failed: its id never reached the
// caller, so nobody could end it.
func (s *sessions) discard(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.live[sess.call.ID]; ok {
		s.forget(sess)
		return
	}
	for _, gen := range s.ended {
		delete(gen, sess.call.ID)
	}
}

// sweep forgets idle live calls and drops the oldest generation of ended
// calls when its time is up. It returns the live calls it dropped for
// idleness. Its cost grows with the calls it forgets, not with the live
// calls nor with the calls that ended.
func (s *sessions) sweep() []*policy.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	step := endedRetention / (endedGenerations - 1)
	for i := 0; i < endedGenerations && now.Sub(s.rotated) >= step; i++ {
		// The new generation is made the size of the last one: it takes about
		// as many calls, without growing (rehashing) on the way.
		copy(s.ended[1:], s.ended[:endedGenerations-1])
		s.ended[0] = make(map[string]*session, len(s.ended[1]))
		s.rotated = s.rotated.Add(step)
	}
	if now.Sub(s.rotated) >= step {
		s.rotated = now // the clock jumped: every generation is dropped
	}
	var dropped []*policy.Call
	for sess := s.quiet.front; sess != nil && now.Sub(sess.touched) >= s.idle; sess = s.quiet.front {
		s.forget(sess)
		dropped = append(dropped, sess.call)
	}
	return dropped
}

// liveIn counts the live calls of a scope.
func (s *sessions) liveIn(scope string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byScope[scope]
}

// liveCalls returns the calls that have not ended.
func (s *sessions) liveCalls() []*policy.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*policy.Call, 0, len(s.live))
	for _, sess := range s.live {
		if !sess.call.Ended() {
			out = append(out, sess.call)
		}
	}
	return out
}
