package policy

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// RetryAfter is the earliest certain retry moment over the named sources (all
// when none are named), with each source's state.
//
// It reads every source, in a read shared with the scope's other readers
// (reads), and answers for the named ones.
func (s *Scope) RetryAfter(ctx context.Context, names []string) (time.Duration, []gate.SourceView, error) {
	_, srcs := s.snapshot()
	for _, n := range names {
		if !slices.ContainsFunc(srcs, func(src *source) bool { return src.cfg.Name == n }) {
			return 0, nil, fmt.Errorf("%w: %q in scope %s", ErrUnknownSource, n, s.name)
		}
	}
	_, snap, err := s.reads.peek(ctx, 0, false)
	if err != nil {
		return 0, nil, err
	}
	if len(names) > 0 {
		picked := make([]gate.SourceView, 0, len(names))
		for _, n := range names {
			i := slices.IndexFunc(snap.Sources, func(v gate.SourceView) bool { return v.Source == n })
			if i < 0 { // removed by a reload since the names were checked
				return 0, nil, fmt.Errorf("%w: %q in scope %s", ErrUnknownSource, n, s.name)
			}
			picked = append(picked, snap.Sources[i])
		}
		snap.Sources = picked
	}
	return s.breakerWait(snap, time.Now()), snap.Sources, nil
}

// SourceState is one source as DescribeScope shows it.
type SourceState struct {
	Config *config.Source
	View   gate.SourceView
	// Ceiling is the pacer's ceiling; Memo the cooldown memo's remaining time.
	Ceiling        int
	Memo           time.Duration
	FailedRecently bool
	// Line is the line of callers waiting for the source's capacity (the
	// fleet's on a shared backend).
	Line LineState
}

// Description is a scope's live state and effective configuration.
type Description struct {
	Config      *config.Scope
	Sources     []SourceState
	ProgressAge time.Duration
	// Tenants are every tenant the scope names, then gate.OverflowTenant
	// for the others, with their use (none read from a backend that keeps
	// no tenants).
	Tenants []TenantState
}

// Describe reads the scope; it never takes a probe.
func (s *Scope) Describe(ctx context.Context) (Description, error) {
	cfg, srcs := s.snapshot()
	req := s.peekRequest(srcs, 0)
	req.Line = &gate.LineRead{Lease: lineLease(cfg), Describe: true}
	tenants, calls, at := describedTenants(cfg)
	req.Tenants = calls
	snap, err := s.backend.Peek(ctx, req)
	if err != nil {
		return Description{}, err
	}
	for j, v := range snap.Tenants {
		if j < len(at) {
			tenants[at[j]].View = v
		}
	}
	now := time.Now()
	d := Description{Config: cfg, ProgressAge: snap.ProgressAge, Tenants: tenants}
	for i, src := range srcs {
		l := snap.Sources[i].Line
		d.Sources = append(d.Sources, SourceState{
			Line:   LineState{Length: l.Length, OldestWait: l.Oldest, Groups: l.Groups},
			Config: src.cfg, View: snap.Sources[i], Ceiling: src.pacer.Ceiling(),
			Memo: s.memo.Remaining(src.cfg.Name, now), FailedRecently: src.failedRecently(now),
		})
	}
	return d, nil
}

// Override carries out an operator's action on a source's breaker.
func (s *Scope) Override(ctx context.Context, name string, a gate.Action, actor, why string) (gate.SourceView, error) {
	src := s.source(name)
	if src == nil {
		return gate.SourceView{}, fmt.Errorf("%w: %q in scope %s", ErrUnknownSource, name, s.name)
	}
	r, err := s.backend.Override(ctx, gate.OverrideRequest{Scope: s.name, Source: &src.gate, Action: a, Actor: actor, Why: why})
	if err != nil {
		return gate.SourceView{}, err
	}
	for i := range r.Events {
		if r.Events[i].Kind == gate.EventOverride {
			r.Events[i].Action = a // observers name the action; backends report the override it left
		}
	}
	s.remember(name, r.View.Breaker, time.Now())
	s.absorb(r.Events)
	return r.View, nil
}
