package status

import (
	"slices"
	"sync"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// MaxTransitions is how many breaker events the page keeps per scope,
// newest first.
const MaxTransitions = 50

// Bounds on what a Recorder keeps: a scope or source past them (more than a
// configuration names) is not recorded, and a scope the configuration no
// longer names is forgotten at the next read (Keep).
const (
	maxScopes  = 1024
	maxSources = 256
)

// Transition is one breaker event the page shows: an automatic transition,
// or an operator's action (Kind "override": Action and the Override it
// left, From and To the automatic state around it).
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
	Action   string        `json:"action,omitempty"`
	Override string        `json:"override,omitempty"`
	Actor    string        `json:"actor,omitempty"`
	Why      string        `json:"why,omitempty"`
}

// Source is what the Recorder remembers of a source that a scope's
// description lacks: why its breaker last opened, and the last upstream
// status an attempt on it reported.
type Source struct {
	OpenCause string    `json:"open_cause,omitempty"` // the transition's cause: consecutive_failures, failure_rate, source_dead, probe_failed
	OpenedAt  time.Time `json:"opened_at,omitzero"`
	// Status is the last HTTP status reported (0: none yet), Outcome its
	// outcome.
	Status   int       `json:"last_http_status,omitempty"`
	Outcome  string    `json:"last_outcome,omitempty"`
	StatusAt time.Time `json:"last_reported_at,omitzero"`
}

// source is Source as it is kept: enums, not strings, so that recording an
// outcome stores three fields and allocates nothing.
type source struct {
	cause    gate.Cause
	openedAt time.Time
	status   int
	outcome  policy.Outcome
	statusAt time.Time
}

// scopeRecord is everything kept of one scope.
type scopeRecord struct {
	history
	waiting map[string]struct{} // call IDs
	trans   [MaxTransitions]Transition
	next, n int // where the next transition goes; transitions kept
	sources map[string]*source
}

// Recorder is a policy.Observer that keeps what the page shows and a
// scope's description lacks: the calls waiting now, each scope's last 15
// minutes (Buckets of BucketWidth), its last MaxTransitions breaker
// transitions and overrides, and per source why it opened and its last
// upstream status. Each observation takes one short lock and, once a scope
// and source were seen, allocates nothing; nothing blocks a decision.
type Recorder struct {
	now func() time.Time

	mu     sync.Mutex
	scopes map[string]*scopeRecord
}

// NewRecorder returns an empty Recorder timing events with now.
func NewRecorder(now func() time.Time) *Recorder {
	return &Recorder{now: now, scopes: map[string]*scopeRecord{}}
}

// scope returns the record of name, made on first sight; nil past
// maxScopes. r.mu is held.
func (r *Recorder) scope(name string) *scopeRecord {
	s := r.scopes[name]
	if s == nil && len(r.scopes) < maxScopes {
		s = &scopeRecord{waiting: map[string]struct{}{}, sources: map[string]*source{}}
		r.scopes[name] = s
	}
	return s
}

// source returns the record of name, made on first sight; nil past
// maxSources.
func (s *scopeRecord) source(name string) *source {
	src := s.sources[name]
	if src == nil && len(s.sources) < maxSources {
		src = &source{}
		s.sources[name] = src
	}
	return src
}

// Breaker implements policy.Observer: transitions and overrides are kept,
// and an opening is remembered as the source's open cause.
func (r *Recorder) Breaker(scope string, e gate.Event) {
	if e.Kind != gate.EventTransition && e.Kind != gate.EventOverride {
		return
	}
	now := r.now()
	t := Transition{
		At: now, Scope: scope, Source: e.Source, Kind: e.Kind.String(), From: e.From.String(), To: e.To.String(),
		Cause: e.Cause.String(), Epoch: e.Epoch, Cooldown: e.Cooldown, Actor: e.Actor, Why: e.Why,
	}
	if e.Kind == gate.EventOverride {
		t.Action, t.Override, t.Cause = e.Action.String(), e.Override.String(), ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scope(scope)
	if s == nil {
		return
	}
	s.trans[s.next] = t
	s.next = (s.next + 1) % MaxTransitions
	s.n = min(s.n+1, MaxTransitions)
	if e.Kind == gate.EventTransition && e.To == gate.Open {
		if src := s.source(e.Source); src != nil {
			src.cause, src.openedAt = e.Cause, now
		}
	}
}

// Waiting implements policy.Observer: the call waits until its next
// decision.
func (r *Recorder) Waiting(c *policy.Call, _ time.Duration, _ []gate.Rejection) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scope(c.Scope)
	if s == nil {
		return
	}
	s.at(now).waitsStarted++
	s.waiting[c.ID] = struct{}{}
	s.setWaiting(now, int64(len(s.waiting)))
}

// Picked implements policy.Observer: grants and refusals are counted; a
// grant or a failure ends a wait, a refusal does not (the call goes on
// waiting through OnNoRunnable).
func (r *Recorder) Picked(c *policy.Call, p policy.Pick) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scope(c.Scope)
	if s == nil {
		return
	}
	b := s.at(now)
	switch {
	case p.Grant != nil:
		b.grants++
		refused(b, p.Grant.Skipped)
		s.done(now, c)
	case p.NoRunnable != nil:
		refused(b, p.NoRunnable.Sources)
	case p.Failure != nil:
		b.failedCalls++
		s.done(now, c)
	}
}

func refused(b *bucket, rs []gate.Rejection) {
	for _, rj := range rs {
		if int(rj.Reason) < numReasons {
			b.refusals[rj.Reason]++
		}
	}
}

// Settled implements policy.Observer: failed attempts and failed calls are
// counted, and the source's last upstream status kept.
func (r *Recorder) Settled(c *policy.Call, a policy.Attempt, rec policy.Recorded) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scope(c.Scope)
	if s == nil {
		return
	}
	b := s.at(now)
	if a.Outcome == policy.Transient || a.Outcome == policy.SourceDead {
		b.failedAttempts++
	}
	if rec.Next.Failure != nil {
		b.failedCalls++
	}
	if a.Outcome != policy.Cancelled { // the caller gave up: the upstream said nothing
		if src := s.source(a.Source); src != nil {
			src.status, src.outcome, src.statusAt = a.HTTPStatus, a.Outcome, now
		}
	}
	s.done(now, c)
}

// Decided implements policy.Observer: a failure ends the wait; a sleep
// handed to the client continues it until the next Pick.
func (r *Recorder) Decided(c *policy.Call, d policy.Decision) {
	if d.Failure == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.scope(c.Scope); s != nil {
		s.at(now).failedCalls++
		s.done(now, c)
	}
}

// Abandoned forgets a call that ended without a decision.
func (r *Recorder) Abandoned(c *policy.Call, _ string) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.scopes[c.Scope]; s != nil {
		s.done(now, c)
	}
}

// done ends c's wait, if it waited.
func (s *scopeRecord) done(now time.Time, c *policy.Call) {
	if _, ok := s.waiting[c.ID]; ok {
		delete(s.waiting, c.ID)
		s.setWaiting(now, int64(len(s.waiting)))
	}
}

// WaitingIn counts the calls of scope waiting now.
func (r *Recorder) WaitingIn(scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.scopes[scope]; s != nil {
		return len(s.waiting)
	}
	return 0
}

// Keep forgets the scopes not in names (removed by a reload).
func (r *Recorder) Keep(names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.scopes {
		if !slices.Contains(names, name) {
			delete(r.scopes, name)
		}
	}
}

// ScopeRecord is what a Recorder kept of one scope.
type ScopeRecord struct {
	Waiting int
	// Intervals are the last Buckets intervals, oldest first.
	Intervals []Interval
	// Transitions are the kept breaker events, newest first.
	Transitions []Transition
	Sources     map[string]Source
}

// Scope returns what the Recorder kept of scope (empty when nothing).
func (r *Recorder) Scope(scope string) ScopeRecord {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scopes[scope]
	if s == nil {
		return ScopeRecord{Intervals: (&history{}).intervals(now), Sources: map[string]Source{}}
	}
	out := ScopeRecord{Waiting: len(s.waiting), Intervals: s.intervals(now), Transitions: s.transitions(), Sources: make(map[string]Source, len(s.sources))}
	for name, src := range s.sources {
		v := Source{OpenedAt: src.openedAt, Status: src.status, StatusAt: src.statusAt}
		if !src.openedAt.IsZero() {
			v.OpenCause = src.cause.String()
		}
		if !src.statusAt.IsZero() {
			v.Outcome = src.outcome.String()
		}
		out.Sources[name] = v
	}
	return out
}

func (s *scopeRecord) transitions() []Transition {
	out := make([]Transition, 0, s.n)
	for i := 1; i <= s.n; i++ {
		out = append(out, s.trans[(s.next-i+MaxTransitions)%MaxTransitions])
	}
	return out
}

// Transitions returns the kept transitions of every scope, newest first.
func (r *Recorder) Transitions() []Transition {
	r.mu.Lock()
	var out []Transition
	for _, s := range r.scopes {
		out = append(out, s.transitions()...)
	}
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Transition) int { return b.At.Compare(a.At) })
	return out
}
