// Package inmem is the memory backend of gate: every scope's breakers and
// quotas in this process, for a single replica.
package inmem

import (
	"context"
	"slices"
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
	progress int64                 // ms of the last successful attempt; 0 = never
	lines    map[string]*gate.Line // by source
	tenants  map[string]*gate.Tenant
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
		s = &scope{sources: make(map[string]*gate.SourceState), lines: make(map[string]*gate.Line)}
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

// line is source's line; an empty one is not kept.
func (s *scope) line(source string) *gate.Line {
	l, ok := s.lines[source]
	if !ok {
		if s.lines == nil { // a scope loaded from the state file
			s.lines = make(map[string]*gate.Line)
		}
		l = &gate.Line{}
		s.lines[source] = l
	}
	return l
}

// tenant is the named tenant's state, made when first needed.
func (s *scope) tenant(name string) *gate.Tenant {
	t, ok := s.tenants[name]
	if !ok {
		if s.tenants == nil {
			s.tenants = make(map[string]*gate.Tenant)
		}
		t = &gate.Tenant{}
		s.tenants[name] = t
	}
	return t
}

// tidyTenant forgets a tenant that holds nothing, so that a scope keeps
// only its busy tenants.
func (s *scope) tidyTenant(tc *gate.TenantCall, now int64) {
	if t, ok := s.tenants[tc.Name]; ok && t.Idle(tc.Limits, now) {
		delete(s.tenants, tc.Name)
	}
}

// tidy forgets source's line when it is empty.
func (s *scope) tidy(source string) {
	if l, ok := s.lines[source]; ok && l.Len() == 0 {
		delete(s.lines, source)
	}
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
	w := req.Line
	if tc := req.Tenant; tc != nil {
		if reason, wait := s.tenant(tc.Name).Verdict(tc.Limits, req.Tokens, now); reason != gate.ReasonNone {
			for _, c := range req.Candidates {
				out.Rejections = append(out.Rejections, gate.Rejection{Source: c.Source.Name, Reason: reason, RetryAfter: gate.Millis(wait)})
			}
			if w != nil {
				out.Places = s.after(w, req.Candidates, out)
			}
			s.tidyTenant(tc, now)
			return out, nil
		}
	}
	for _, c := range req.Candidates {
		name := c.Source.Name
		if w != nil && s.inLine(w, name) && !s.line(name).Check(w.At(name), now) {
			out.Rejections = append(out.Rejections, gate.Rejection{Source: name, Reason: gate.ReasonQueued})
			continue
		}
		permit, rej, events := s.source(name).Admit(c, req.PermitID, req.Tokens, now)
		out.Events = append(out.Events, named(events, name)...)
		if rej.Reason == gate.ReasonNone {
			out.Granted, out.Permit = true, permit
			break
		}
		out.Rejections = append(out.Rejections, rej)
	}
	if w != nil {
		out.Places = s.after(w, req.Candidates, out)
	}
	if tc := req.Tenant; tc != nil {
		if out.Granted {
			s.tenant(tc.Name).Take(tc.Limits, out.Permit.ID, out.Permit.Tokens, out.Permit.Lease, now)
		}
		s.tidyTenant(tc, now)
	}
	return out, nil
}

// inLine reports whether source's line has anything to say about w: a line
// is kept, or w has a place in it. Without either, Check admits w and After
// keeps no place, so the walk makes no line (nor its maps) just to drop it.
func (s *scope) inLine(w *gate.Waiter, source string) bool {
	_, ok := s.lines[source]
	return ok || w.Places[source] != ""
}

// after records the walk's result in each candidate's line and returns w's
// places: a grant leaves every line, a refusal for capacity keeps the
// source's place, a breaker's refusal leaves the source's line. It returns
// nil when w has no place.
func (s *scope) after(w *gate.Waiter, cands []gate.Candidate, out gate.Admission) map[string]string {
	var places map[string]string
	for _, c := range cands {
		name := c.Source.Name
		l, ok := s.lines[name]
		if !ok {
			continue
		}
		here := out.Granted && out.Permit.Source == name
		i := slices.IndexFunc(out.Rejections, func(r gate.Rejection) bool { return r.Source == name })
		capacity := i >= 0 && gate.CapacityRefused(out.Rejections[i:i+1])
		if out.Granted && !here {
			l.Leave(w.ID)
		} else if p := l.After(w.At(name), here, capacity); p != "" {
			if places == nil {
				places = make(map[string]string, len(cands))
			}
			places[name] = p
		}
		s.tidy(name)
	}
	return places
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
	if tc := req.Tenant; tc != nil {
		if t, ok := s.tenants[tc.Name]; ok {
			t.Release(req.PermitID, req.ActualTokens, now)
			s.tidyTenant(tc, now)
		}
	}
	if l, ok := s.lines[req.Source.Name]; ok && req.Line != nil && out.Released {
		out.Handoff = l.Handoff(req.Line, now)
		s.tidy(req.Source.Name)
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
		if r := req.Line; r != nil {
			read := *r
			read.Join = nil
			if r.Join != nil && slices.Contains(r.Joins, src.Name) {
				read.Join = r.Join.At(src.Name)
			}
			v.Line = s.line(src.Name).Read(&read, now)
			s.tidy(src.Name)
		}
		out.Sources = append(out.Sources, v)
	}
	for _, tc := range req.Tenants {
		t, ok := s.tenants[tc.Name]
		if !ok {
			t = &gate.Tenant{}
		}
		out.Tenants = append(out.Tenants, t.View(tc, req.Tokens, now))
	}
	return out, nil
}

// Leave implements gate.Backend.
func (b *Backend) Leave(_ context.Context, req gate.LeaveRequest) error {
	s, _ := b.lock(req.Scope)
	defer s.mu.Unlock()
	for _, name := range req.Sources {
		if l, ok := s.lines[name]; ok {
			l.Leave(req.Waiter)
			s.tidy(name)
		}
	}
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

// Adopt makes each breaker the one recs describe (gate.Record.Breaker), and
// every other breaker CLOSED without override, at a later epoch than its
// own (but a probe out keeps its epoch), keeping quotas, lines and
// progress; an OPEN whose cooldown is still running and a probe still out
// stay (see stillOpen). fallback's local gate starts each outage of the
// shared backend from what this replica last saw of its breakers, and from
// what an earlier outage's local gate still knows of a failing source, not
// from its overrides. A record's Minute counts in its source's RPM and TPM.
// It returns how many breakers it left other than CLOSED without override.
func (b *Backend) Adopt(recs []gate.Record) (kept int) {
	by := make(map[string]map[string]gate.Record)
	for _, r := range recs {
		if by[r.Scope] == nil {
			by[r.Scope] = make(map[string]gate.Record)
		}
		by[r.Scope][r.Source] = r
	}
	b.mu.Lock()
	names := make([]string, 0, len(b.scopes)+len(by))
	for name := range b.scopes {
		names = append(names, name)
	}
	for name := range by {
		if _, ok := b.scopes[name]; !ok {
			names = append(names, name)
		}
	}
	b.mu.Unlock()
	for _, name := range names {
		s, now := b.lock(name)
		for src, st := range s.sources {
			if _, ok := by[name][src]; !ok && st.Breaker != (gate.Breaker{}) {
				st.Breaker = stillOpen(st.Breaker, gate.Breaker{Epoch: st.Breaker.Epoch + 1}, now)
			}
		}
		for src, r := range by[name] {
			st := s.source(src)
			nb := r.Breaker(now)
			if r.Probe == "" { // a probe's outcome is fenced by its own epoch
				nb.Epoch = max(nb.Epoch, st.Breaker.Epoch+1)
				nb = stillOpen(st.Breaker, nb, now)
			}
			st.Breaker = nb
			if len(r.Minute) > 0 {
				st.Quota.AddMinute(r.Minute, now)
			}
		}
		for _, st := range s.sources {
			if st.Breaker.State != gate.Closed || st.Breaker.Override != gate.NoOverride {
				kept++
			}
		}
		var none []gate.Event
		b.unlock(context.Background(), s, &none)
	}
	return kept
}

// stillOpen is nb, OPEN until old's end when old is OPEN with its cooldown
// still running at now and nb is not OPEN as long, or HALF_OPEN with old's
// probe (at old's epoch, which fences its outcome) when that is still out
// and nb is not OPEN.
func stillOpen(old, nb gate.Breaker, now int64) gate.Breaker {
	switch {
	case old.State == gate.Open && now < old.OpenUntil && (nb.State != gate.Open || nb.OpenUntil < old.OpenUntil):
		nb.State, nb.OpenedAt, nb.OpenUntil, nb.Cause = gate.Open, old.OpenedAt, old.OpenUntil, old.Cause
		nb.Reopens = max(nb.Reopens, old.Reopens)
	case old.State == gate.HalfOpen && old.Probe != "" && now < old.ProbeUntil && nb.State != gate.Open:
		nb.State, nb.Probe, nb.ProbeUntil, nb.Epoch = gate.HalfOpen, old.Probe, old.ProbeUntil, old.Epoch
		nb.Reopens, nb.OpenedAt, nb.OpenUntil = max(nb.Reopens, old.Reopens), old.OpenedAt, old.OpenUntil
	}
	return nb
}
