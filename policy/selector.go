package policy

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// selector orders a scope's sources for a Pick walk: by priority (lower
// first); within a priority, by smooth weighted round robin (plain round robin
// when weights are equal) with sources that failed within their breaker
// window moved behind the others; and, for one call, the sources that already
// failed in this call behind all the rest.
type selector struct {
	mu      sync.Mutex
	current map[string]int // smooth weighted round robin state, by source
}

func newSelector() *selector { return &selector{current: make(map[string]int)} }

// order returns the walk order. srcs are in configuration order.
func (sel *selector) order(srcs []*source, failedInCall map[string]int, now time.Time) []*source {
	if len(srcs) < 2 {
		return srcs // nothing to order; the walk only reads it
	}
	out := slices.Clone(srcs)
	slices.SortStableFunc(out, func(a, b *source) int { return cmp.Compare(a.cfg.Priority, b.cfg.Priority) })

	sel.mu.Lock()
	for start := 0; start < len(out); {
		end := start + 1
		for end < len(out) && out[end].cfg.Priority == out[start].cfg.Priority {
			end++
		}
		sel.rotate(out[start:end])
		slices.SortStableFunc(out[start:end], func(a, b *source) int {
			return cmp.Compare(boolInt(a.failedRecently(now)), boolInt(b.failedRecently(now)))
		})
		start = end
	}
	sel.mu.Unlock()

	if len(failedInCall) > 0 {
		slices.SortStableFunc(out, func(a, b *source) int {
			return cmp.Compare(failedInCall[a.cfg.Name], failedInCall[b.cfg.Name])
		})
	}
	return out
}

// keep forgets the state of every source not in srcs (removed by a reload),
// so that a scope reloaded many times does not grow, and a source added back
// starts afresh.
func (sel *selector) keep(srcs []*source) {
	sel.mu.Lock()
	defer sel.mu.Unlock()
	for name := range sel.current {
		if !slices.ContainsFunc(srcs, func(s *source) bool { return s.cfg.Name == name }) {
			delete(sel.current, name)
		}
	}
}

// rotate advances one tier's smooth weighted round robin and orders the tier
// with the chosen source first and the others by their current weight.
func (sel *selector) rotate(tier []*source) {
	if len(tier) < 2 {
		return
	}
	total, best := 0, 0
	for i, s := range tier {
		sel.current[s.cfg.Name] += s.cfg.Weight
		total += s.cfg.Weight
		if sel.current[s.cfg.Name] > sel.current[tier[best].cfg.Name] {
			best = i
		}
	}
	chosen := tier[best].cfg.Name
	slices.SortStableFunc(tier, func(a, b *source) int {
		if a.cfg.Name == chosen || b.cfg.Name == chosen {
			return boolInt(b.cfg.Name == chosen) - boolInt(a.cfg.Name == chosen)
		}
		return cmp.Compare(sel.current[b.cfg.Name], sel.current[a.cfg.Name])
	})
	sel.current[chosen] -= total
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
