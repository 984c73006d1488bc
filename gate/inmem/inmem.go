// Package inmem is the memory backend of gate: every scope's breakers and
// quotas in this process, for a single replica.
package inmem

import (
	"context"
	"sync"
	"time"

	"github.com/polygate/polygate/gate"
)

// Backend keeps state in memory. Decisions of one scope are serialized by a
// per-scope lock; scopes do not contend.
type Backend struct {
	now func() time.Time

	mu     sync.Mutex
	scopes map[string]*scope
	// store keeps the state file (persist.go); nil when there is none.
	store *store
}

type scope struct {
	mu       sync.Mutex
	sources  map[string]*gate.SourceState
	progress int64 // ms of the last successful attempt; 0 = never
	line     gate.Line
}

// New returns a memory backend reading time from now (time.Now if nil).
func New(now func() time.Time) *Backend {
	if now == nil {
		now = time.Now
	}
	return &Backend{now: now, scopes: make(map[string]*scope)}
}

// lock returns the scope's state, locked, and the time of the decision.
func (b *Backend) lock(name string) (*scope, int64) {
	b.mu.Lock()
	s, ok := b.scopes[name]
	if !ok {
		s = &scope{sources: make(map[string]*gate.SourceState)}
		b.scopes[name] = s
	}
	b.mu.Unlock()
	s.mu.Lock()
	return s, b.now().UnixMilli()
}

func (s *scope) source(name string) *gate.SourceState {
	st, ok := s.sources[name]
	if !ok {
		st = &gate.SourceState{}
		s.sources[name] = st
	}
	return st
}

func (s *scope) progressAge(now int64) time.Duration {
	if s.progress == 0 {
		return gate.Never
	}
	return time.Duration(now-s.progress) * time.Millisecond
}

func named(events []gate.Event, source string) []gate.Event {
	for i := range events {
		events[i].Source = source
	}
	return events
}

// Admit implements gate.Backend.
func (b *Backend) Admit(ctx context.Context, req gate.AdmitRequest) (out gate.Admission, _ error) {
	s, now := b.lock(req.Scope)
	defer b.unlock(ctx, s, &out.Events)
	out.ProgressAge = s.progressAge(now)
	if w := req.Line; w != nil && !s.line.Check(w, now) {
		out.Queued, out.Place = true, s.line.Place(w.ID)
		return out, nil
	}
	for _, c := range req.Candidates {
		permit, rej, events := s.source(c.Source.Name).Admit(c, req.PermitID, req.Tokens, now)
		out.Events = append(out.Events, named(events, c.Source.Name)...)
		if rej.Reason == gate.ReasonNone {
			out.Granted, out.Permit = true, permit
			break
		}
		out.Rejections = append(out.Rejections, rej)
	}
	if w := req.Line; w != nil {
		out.Place = s.line.After(w, out.Granted, gate.CapacityRefused(out.Rejections))
	}
	return out, nil
}

// Settle implements gate.Backend.
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (out gate.Settlement, _ error) {
	s, now := b.lock(req.Scope)
	defer b.unlock(ctx, s, &out.Events)
	out, events := s.source(req.Source.Name).Settle(req, now)
	out.Events = named(events, req.Source.Name)
	if req.Progress {
		s.progress = now
	}
	if req.Line != nil && out.Released {
		out.Handoff = s.line.Handoff(req.Line, now)
	}
	out.ProgressAge = s.progressAge(now)
	return out, nil
}

// Peek implements gate.Backend.
func (b *Backend) Peek(_ context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	s, now := b.lock(req.Scope)
	defer s.mu.Unlock()
	out := gate.Snapshot{Sources: make([]gate.SourceView, 0, len(req.Sources)), ProgressAge: s.progressAge(now)}
	for i, src := range req.Sources {
		st, ok := s.sources[src.Name]
		if !ok {
			st = &gate.SourceState{}
		}
		v := st.View(src, now)
		v.Verdict = st.Verdict(req.Candidate(i), req.Tokens, now)
		out.Sources = append(out.Sources, v)
	}
	if req.Line != nil {
		out.Line = s.line.Read(req.Line, now)
	}
	return out, nil
}

// Leave implements gate.Backend.
func (b *Backend) Leave(_ context.Context, req gate.LeaveRequest) error {
	s, _ := b.lock(req.Scope)
	defer s.mu.Unlock()
	s.line.Leave(req.Waiter)
	return nil
}

// Override implements gate.Backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (out gate.OverrideResult, _ error) {
	s, now := b.lock(req.Scope)
	defer b.unlock(ctx, s, &out.Events)
	st := s.source(req.Source.Name)
	events, err := st.Breaker.Apply(req.Action, req.Actor, req.Why, now)
	if err != nil {
		return gate.OverrideResult{}, err
	}
	return gate.OverrideResult{View: st.View(req.Source, now), Events: named(events, req.Source.Name)}, nil
}
