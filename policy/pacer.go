package policy

import (
	"math"
	"sync"
)

// Pacer is a source's AIMD concurrency ceiling, between 1 and the source's
// max_concurrency: a RATE_LIMITED outcome halves it, each success raises it by
// 1/ceiling (one slot per ceiling's worth of successes). The backend applies
// the ceiling to the source's in-flight count, which on the Redis backend is
// shared: each replica learns its own ceiling from the 429s it sees.
type Pacer struct {
	mu      sync.Mutex
	ceiling float64
	max     int
}

// Decrease is the multiplicative cut on a RATE_LIMITED outcome.
const Decrease = 0.5

// NewPacer returns a pacer at its full ceiling.
func NewPacer(max int) *Pacer { return &Pacer{ceiling: float64(max), max: max} }

// Ceiling is the number of attempts the source may have out now.
func (p *Pacer) Ceiling() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(1, int(math.Floor(p.ceiling)))
}

// Success raises the ceiling additively.
func (p *Pacer) Success() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ceiling = min(float64(p.max), p.ceiling+1/p.ceiling)
}

// RateLimited cuts the ceiling multiplicatively.
func (p *Pacer) RateLimited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ceiling = max(1, p.ceiling*Decrease)
}

// resize applies a reloaded max_concurrency: a ceiling at the old maximum
// follows the new one; a learned lower ceiling is kept if it still fits.
func (p *Pacer) resize(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ceiling >= float64(p.max) || p.ceiling > float64(n) {
		p.ceiling = float64(n)
	}
	p.max = n
}
