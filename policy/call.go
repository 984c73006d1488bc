package policy

import (
	"crypto/rand"
	"encoding/base32"
	"sync"
	"time"

	"github.com/polygate/polygate/gate"
)

// NewID returns an unguessable id: kind, then 128 random bits from
// crypto/rand (26 base32 characters). Knowing one's own ids tells nothing
// of another client's. The id is built on the stack and allocated once (two
// are made per attempt).
func NewID(kind string) string {
	var random [16]byte
	rand.Read(random[:])
	var buf [maxIDKind + 1 + 26]byte
	if len(kind) > maxIDKind {
		return kind + "-" + idEncoding.EncodeToString(random[:])
	}
	n := copy(buf[:], kind)
	buf[n] = '-'
	idEncoding.Encode(buf[n+1:], random[:])
	return string(buf[:n+1+idEncoding.EncodedLen(len(random))])
}

// maxIDKind is the longest kind NewID builds on the stack.
const maxIDKind = 8

// idEncoding is crypto/rand.Text's alphabet: RFC 4648 base32, no padding.
var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// Call is one logical request of the application: the accounting of its two
// budgets, its attempts, and the permit it holds. Each call has its own clock
// readings; calls never share them.
type Call struct {
	ID       string
	Scope    string
	Started  time.Time
	Deadline time.Time // zero: none
	// Tokens is the estimate charged to TPM for each attempt.
	Tokens int64
	// Priority (higher first) and Tenant rank the call among callers waiting
	// for capacity; set them before the call's first Pick.
	Tenant   string
	Priority int32
	// waiting and peeked are guarded by mu, as the fields below; they sit
	// beside Priority so that the three share a word (a held call's Call
	// is live).
	waiting bool // refused since the last grant
	peeked  bool // OnNoRunnable's last answer was an immediate wake-up

	mu         sync.Mutex
	productive time.Duration
	attempts   int            // attempts granted
	charged    int            // attempts charged to max_attempts
	failures   int            // failed attempts, the backoff exponent
	failedIn   map[string]int // made at the first failure
	permit     *gate.Permit
	permitSrc  *gate.Source // the source's spec at grant time (a source's gate never changes)
	grantedAt  time.Time
	last       *NoRunnable // the last refusal, for OnNoRunnable
	end        *Action
	answers    *answers          // made at the first RecordOutcome
	places     map[string]string // the call's places in line by source, as the backend gave them (see line)
}

// answers are a call's answers by permit, so that RecordOutcome is
// idempotent: the last one in last, earlier ones in earlier (made at the
// second attempt).
type answers struct {
	lastPermit string
	last       Recorded
	earlier    map[string]Recorded
}

// NewCall opens a call at now. Its maps and its answers are made when first
// written: most calls never fail, and a call held waiting, never granted,
// should cost little (240 bytes).
func NewCall(id, scope string, tokens int64, deadline, now time.Time) *Call {
	c := new(Call)
	c.Init(id, scope, tokens, deadline, now)
	return c
}

// Init makes c, a zero Call, what NewCall returns, for a caller that
// allocates the call inside a value of its own.
func (c *Call) Init(id, scope string, tokens int64, deadline, now time.Time) {
	c.ID, c.Scope, c.Tokens, c.Deadline, c.Started = id, scope, tokens, deadline, now
}

// stalledFor is the call's non-productive time so far.
func (c *Call) stalledFor(now time.Time) time.Duration {
	return now.Sub(c.Started) - c.productive
}

// Stats is the call's accounting at one moment.
type Stats struct {
	Attempts int
	// Charged attempts count against max_attempts (429s do not).
	Charged    int
	Productive time.Duration
	// Waiting is the non-productive time: waits, backoffs, 429 attempts.
	Waiting time.Duration
	// Ended is the call's last action when it has ended.
	Ended *Action
	// Holding is the permit the call holds, if any.
	Holding *gate.Permit
}

// Stats reads the call's accounting at now.
func (c *Call) Stats(now time.Time) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Stats{Attempts: c.attempts, Charged: c.charged, Productive: c.productive, Ended: c.end, Holding: c.permit}
	st.Waiting = c.stalledFor(now)
	if c.permit != nil {
		st.Waiting -= now.Sub(c.grantedAt)
	}
	return st
}

// done is the end of every call that ends Done (an end is never written).
var done = &Action{Done: true}

// finish ends the call with a.
func (c *Call) finish(a Action) {
	switch {
	case a == *done:
		c.end = done
	case a.Retry == nil:
		c.end = &a
	}
}

// Ended reports whether the call has ended (Done or Failure).
func (c *Call) Ended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end != nil
}

// answer returns the answer already given for a permit, if any.
func (c *Call) answer(permit string) (Recorded, bool) {
	a := c.answers
	if a == nil {
		return Recorded{}, false
	}
	if permit == a.lastPermit && permit != "" {
		return a.last, true
	}
	r, ok := a.earlier[permit]
	return r, ok
}

// keepAnswer keeps the answer given for a permit.
func (c *Call) keepAnswer(permit string, r Recorded) {
	a := c.answers
	if a == nil {
		c.answers = &answers{lastPermit: permit, last: r}
		return
	}
	if a.lastPermit != "" && a.lastPermit != permit {
		if a.earlier == nil {
			a.earlier = make(map[string]Recorded, 1)
		}
		a.earlier[a.lastPermit] = a.last
	}
	a.lastPermit, a.last = permit, r
}
