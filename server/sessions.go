package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/polygate/polygate/policy"
)

// endedRetention is how long an ended call is remembered, so that a client
// retrying its last RecordOutcome gets the same answer.
const endedRetention = time.Minute

// sessions holds the calls the sidecar has open: their ids, their idle
// expiry, and a cap on how many may be live at once so that a misbehaving
// client cannot exhaust memory.
type sessions struct {
	max  int
	idle time.Duration

	mu    sync.Mutex
	calls map[string]*session
	live  map[string]int // live calls by scope
	total int            // live calls
}

type session struct {
	call    *policy.Call
	busy    int // RPCs of this call in progress
	touched time.Time
	ended   time.Time // zero while the call is live
}

func newSessions(max int, idle time.Duration) *sessions {
	return &sessions{max: max, idle: idle, calls: make(map[string]*session), live: make(map[string]int)}
}

// configure applies reloaded limits.
func (s *sessions) configure(max int, idle time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max, s.idle = max, idle
}

// open starts a call and holds it busy for the RPC that opened it.
func (s *sessions) open(scope string, tokens int64, deadline time.Duration) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= s.max {
		return nil, fmt.Errorf("%w: %d calls are open (calls.max_live)", errTooManyCalls, s.total)
	}
	now := time.Now()
	var until time.Time
	if deadline > 0 {
		until = now.Add(deadline)
	}
	id := policy.NewID("c")
	sess := &session{call: policy.NewCall(id, scope, tokens, until, now), busy: 1, touched: now}
	s.calls[id] = sess
	s.live[scope]++
	s.total++
	return sess, nil
}

// acquire holds an open call busy for one RPC.
func (s *sessions) acquire(id, scope string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.calls[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", errUnknownCall, clip(id))
	}
	if sess.call.Scope != scope {
		return nil, badField("scope", "call %s belongs to scope %q, not %s", id, sess.call.Scope, clip(scope))
	}
	sess.busy++
	sess.touched = time.Now()
	return sess, nil
}

// release ends an RPC of the call, noting when the call has ended.
func (s *sessions) release(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	sess.busy--
	sess.touched = now
	if sess.ended.IsZero() && sess.call.Ended() {
		sess.ended = now
		s.live[sess.call.Scope]--
		s.total--
	}
}

// discard forgets a call whose opening Pick failed: its id never reached the
// caller, so nobody could end it.
func (s *sessions) discard(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.calls[sess.call.ID]; !ok {
		return
	}
	delete(s.calls, sess.call.ID)
	if sess.ended.IsZero() {
		s.live[sess.call.Scope]--
		s.total--
	}
}

// sweep forgets idle calls and ended calls past their retention. It returns
// the live calls it dropped for idleness.
func (s *sessions) sweep() []*policy.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var dropped []*policy.Call
	for id, sess := range s.calls {
		switch {
		case sess.busy > 0:
		case !sess.ended.IsZero():
			if now.Sub(sess.ended) >= endedRetention {
				delete(s.calls, id)
			}
		case now.Sub(sess.touched) >= s.idle:
			delete(s.calls, id)
			s.live[sess.call.Scope]--
			s.total--
			dropped = append(dropped, sess.call)
		}
	}
	return dropped
}

// liveIn counts the live calls of a scope.
func (s *sessions) liveIn(scope string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[scope]
}

// liveCalls returns the calls that have not ended.
func (s *sessions) liveCalls() []*policy.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*policy.Call
	for _, sess := range s.calls {
		if sess.ended.IsZero() && !sess.call.Ended() {
			out = append(out, sess.call)
		}
	}
	return out
}
