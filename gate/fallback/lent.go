package fallback

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/polygate/polygate/gate"
)

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
