package policy

import (
	"math"
	"sync"
	"time"
)

// Memo is the sidecar's cooldown memo: it remembers, per source, until when
// the source's breaker is certainly OPEN, so that Pick can skip it without a
// backend round trip. It only ever stores now + retry_after of an OPEN
// breaker, so a HALF_OPEN refusal (retry_after 0) leaves nothing behind, and
// it forgets a source as soon as its breaker is seen closed.
type Memo struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func newMemo() *Memo { return &Memo{until: make(map[string]time.Time)} }

// Set remembers the source OPEN until until; a later deadline wins.
func (m *Memo) Set(source string, until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if until.After(m.until[source]) {
		m.until[source] = until
	}
}

// Forget drops what the memo knows of the source.
func (m *Memo) Forget(source string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.until, source)
}

// Remaining is how long the source is still certainly OPEN, rounded up to the
// millisecond (0 when the memo has nothing).
func (m *Memo) Remaining(source string, now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	until, ok := m.until[source]
	if !ok {
		return 0
	}
	if !now.Before(until) {
		delete(m.until, source)
		return 0
	}
	return ceilMs(until.Sub(now))
}

// ceilMs rounds a wait up to the millisecond, so that a caller that waits it
// exactly is never early.
func ceilMs(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		if d > math.MaxInt64-time.Millisecond {
			return d - r // saturate rather than wrap negative
		}
		d += time.Millisecond - r
	}
	return d
}
