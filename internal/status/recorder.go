package status

import (
	"sync"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// MaxTransitions is how many breaker events the page keeps, newest first.
const MaxTransitions = 50

// Transition is one breaker event the page shows.
type Transition struct {
	At       time.Time     `json:"at"`
	Scope    string        `json:"scope"`
	Source   string        `json:"source"`
	Kind     string        `json:"kind"`
	From     string        `json:"from"`
	To       string        `json:"to"`
	Cause    string        `json:"cause"`
	Epoch    uint64        `json:"epoch"`
	Cooldown time.Duration `json:"cooldown_ns"`
	Actor    string        `json:"actor,omitempty"`
	Why      string        `json:"why,omitempty"`
}

// Recorder is a policy.Observer that keeps what the page shows and a
// scope's description lacks: the last MaxTransitions breaker transitions and
// overrides, and the calls waiting now. Each observation takes one short
// lock; nothing blocks a decision.
type Recorder struct {
	policy.NopObserver
	now func() time.Time

	mu      sync.Mutex
	ring    [MaxTransitions]Transition
	next    int // where the next transition goes
	n       int // transitions kept
	waiting map[string]map[string]struct{}
}

// NewRecorder returns an empty Recorder timing events with now.
func NewRecorder(now func() time.Time) *Recorder {
	return &Recorder{now: now, waiting: map[string]map[string]struct{}{}}
}

// Breaker implements policy.Observer: transitions and overrides are kept.
func (r *Recorder) Breaker(scope string, e gate.Event) {
	if e.Kind != gate.EventTransition && e.Kind != gate.EventOverride {
		return
	}
	t := Transition{
		At: r.now(), Scope: scope, Source: e.Source, Kind: e.Kind.String(), From: e.From.String(), To: e.To.String(),
		Cause: e.Cause.String(), Epoch: e.Epoch, Cooldown: e.Cooldown, Actor: e.Actor, Why: e.Why,
	}
	r.mu.Lock()
	r.ring[r.next] = t
	r.next = (r.next + 1) % MaxTransitions
	r.n = min(r.n+1, MaxTransitions)
	r.mu.Unlock()
}

// Waiting implements policy.Observer: the call waits until its next
// decision.
func (r *Recorder) Waiting(c *policy.Call, _ time.Duration, _ []gate.Rejection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := r.waiting[c.Scope]
	if calls == nil {
		calls = map[string]struct{}{}
		r.waiting[c.Scope] = calls
	}
	calls[c.ID] = struct{}{}
}

// Picked implements policy.Observer: a grant or a failure ends a wait; a
// refusal does not (the call goes on waiting through OnNoRunnable).
func (r *Recorder) Picked(c *policy.Call, p policy.Pick) {
	if p.Grant != nil || p.Failure != nil {
		r.done(c)
	}
}

// Settled implements policy.Observer.
func (r *Recorder) Settled(c *policy.Call, _ policy.Attempt, _ policy.Recorded) { r.done(c) }

// Decided implements policy.Observer: a failure ends the wait; a sleep
// handed to the client continues it until the next Pick.
func (r *Recorder) Decided(c *policy.Call, d policy.Decision) {
	if d.Failure != nil {
		r.done(c)
	}
}

// Abandoned forgets a call that ended without a decision.
func (r *Recorder) Abandoned(c *policy.Call, _ string) { r.done(c) }

func (r *Recorder) done(c *policy.Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if calls := r.waiting[c.Scope]; calls != nil {
		delete(calls, c.ID)
		if len(calls) == 0 {
			delete(r.waiting, c.Scope)
		}
	}
}

// WaitingIn counts the calls of scope waiting now.
func (r *Recorder) WaitingIn(scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiting[scope])
}

// Transitions returns the kept transitions, newest first.
func (r *Recorder) Transitions() []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Transition, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.ring[(r.next-i+MaxTransitions)%MaxTransitions])
	}
	return out
}
