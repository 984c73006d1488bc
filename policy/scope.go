package policy

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// Errors of misuse; the server maps each to a gRPC status.
var (
	// ErrCallEnded: the call already ended (Done or Failure).
	ErrCallEnded = errors.New("policy: call has ended")
	// ErrPermitOutstanding: Pick while the call's permit is not settled.
	ErrPermitOutstanding = errors.New("policy: the call holds a permit that is not settled")
	// ErrPermitNotOfCall: RecordOutcome for a permit the call does not hold.
	ErrPermitNotOfCall = errors.New("policy: permit is not held by this call")
	// ErrNoRefusal: OnNoRunnable without a NoRunnable Pick before it.
	ErrNoRefusal = errors.New("policy: the call's last Pick was not refused")
	// ErrEstimateTooLarge: the token estimate can never be admitted: it
	// exceeds every source's TPM, or its tenant's TPM or token budget.
	ErrEstimateTooLarge = errors.New("policy: estimated tokens too large")
	// ErrUnknownSource: a named source is not in the scope.
	ErrUnknownSource = errors.New("policy: unknown source")
	// ErrUnknownOutcome: an outcome outside the table.
	ErrUnknownOutcome = errors.New("policy: unknown outcome")
)

// Observer is told what the scope decides. Calls happen outside every lock,
// after the decision; an observer must not block.
type Observer interface {
	// Breaker reports an event of one of the scope's breakers.
	Breaker(scope string, e gate.Event)
	// Waiting reports that a call starts waiting: the first Wait after a
	// grant (or after the call opened), not every poll.
	Waiting(c *Call, sleep time.Duration, sources []gate.Rejection)
	// Picked reports a Pick's result.
	Picked(c *Call, p Pick)
	// Settled reports an attempt's outcome and the next action.
	Settled(c *Call, a Attempt, r Recorded)
	// Decided reports an OnNoRunnable decision (after any server-side sleep).
	Decided(c *Call, d Decision)
}

// NopObserver observes nothing; embed it to observe only some things.
type NopObserver struct{}

func (NopObserver) Breaker(string, gate.Event)                     {}
func (NopObserver) Waiting(*Call, time.Duration, []gate.Rejection) {}
func (NopObserver) Picked(*Call, Pick)                             {}
func (NopObserver) Settled(*Call, Attempt, Recorded)               {}
func (NopObserver) Decided(*Call, Decision)                        {}

// Options tunes a Scope; zero values take math/rand and no observer. The
// clock is time.Now and real timers, so that reading the time and sleeping
// agree; tests run in testing/synctest bubbles, where both are fake.
type Options struct {
	Rand     func() float64
	Observer Observer
}

// source is a configured source with its local state. The local state (the
// pacer and the last failure) is shared by pointer with the source's earlier
// versions, so a reload neither copies it nor loses a mark made meanwhile.
type source struct {
	cfg  *config.Source
	gate gate.Source
	*local
}

type local struct {
	pacer *Pacer

	mu         sync.Mutex
	lastFailed time.Time
}

func (l *local) markFailed(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastFailed = now
}

func (s *source) failedRecently(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lastFailed.IsZero() && now.Sub(s.lastFailed) < s.cfg.Breaker.Window
}

// Scope decides for one configured scope.
type Scope struct {
	name     string
	backend  gate.Backend
	observer Observer
	rand     func() float64

	mu   sync.RWMutex
	cfg  *config.Scope
	srcs []*source
	// handoff is every Settle's line handoff under cfg (backends read it,
	// never write it), made once per configuration rather than per settle;
	// tenants are cfg's tenants with limits, by key (tenantCalls).
	handoff *gate.LineHandoff
	tenants map[string]*gate.TenantCall

	sel   *selector
	memo  *Memo
	wait  *waiter
	line  *line
	reads *reads
	bells *bells

	removed atomic.Bool // a reload removed the scope (Remove)
}

// NewScope returns the decisions of one scope over a backend.
func NewScope(cfg *config.Scope, b gate.Backend, o Options) *Scope {
	s := &Scope{
		name: cfg.Name, backend: b, observer: o.Observer, rand: o.Rand,
		sel: newSelector(), memo: newMemo(), line: newLine(), bells: newBells(),
	}
	s.wait = newWaiter(s.pollOnce, func() time.Duration {
		cfg, _ := s.snapshot()
		return time.Duration(float64(cfg.PollInterval) * (0.5 + 0.5*s.rand()))
	})
	s.reads = newReads(s.read)
	if s.rand == nil {
		s.rand = rand.Float64
	}
	if s.observer == nil {
		s.observer = NopObserver{}
	}
	s.Update(cfg)
	return s
}

// Close ends every server-side wait of the scope, now and later: a waiting
// caller is answered at once with the rest of its sleep.
func (s *Scope) Close() { s.wait.close() }

// Name is the scope's name.
func (s *Scope) Name() string { return s.name }

// Update applies a reloaded configuration. Breaker and quota state live in
// the backend under the sources' names and are kept; so are the pacers and
// failure marks of sources that stay. Waiting callers are woken to re-ask.
func (s *Scope) Update(cfg *config.Scope) {
	s.mu.Lock()
	old := make(map[string]*source, len(s.srcs))
	for _, src := range s.srcs {
		old[src.cfg.Name] = src
	}
	srcs := make([]*source, len(cfg.Sources))
	for i := range cfg.Sources {
		c := &cfg.Sources[i]
		n := &source{cfg: c, gate: cfg.Gate(i)}
		if prev, ok := old[c.Name]; ok {
			prev.pacer.resize(c.MaxConcurrency)
			n.local = prev.local
		} else {
			n.local = &local{pacer: NewPacer(c.MaxConcurrency)}
		}
		srcs[i] = n
	}
	s.cfg, s.srcs, s.handoff, s.tenants = cfg, srcs, &gate.LineHandoff{Lease: lineLease(cfg)}, tenantCalls(cfg)
	s.mu.Unlock()
	s.sel.keep(srcs)
	s.wait.changed()
	s.wait.freed()
}

// Config is the scope's current configuration.
func (s *Scope) Config() *config.Scope {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cfg
}

func (s *Scope) snapshot() (*config.Scope, []*source) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cfg, s.srcs
}

// lineHandoff is what a Settle tells the line under the current configuration.
func (s *Scope) lineHandoff() *gate.LineHandoff {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.handoff
}

// tenant is the named tenant's call under the current configuration (nil:
// it has no limits).
func (s *Scope) tenant(name string) *gate.TenantCall {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return tenantCall(s.cfg, s.tenants, name)
}

// tenantByKey is the call of the tenant kept under key (nil: none has
// limits).
func (s *Scope) tenantByKey(key string) *gate.TenantCall {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tenants[key]
}

// peekRequest asks the backend about srcs, at their pacers' ceilings, for an
// attempt of tokens.
func (s *Scope) peekRequest(srcs []*source, tokens int64) gate.PeekRequest {
	req := gate.PeekRequest{Scope: s.name, Sources: make([]*gate.Source, len(srcs)), Ceilings: make([]int, len(srcs)), Tokens: tokens}
	for i, src := range srcs {
		req.Sources[i], req.Ceilings[i] = &src.gate, src.pacer.Ceiling()
	}
	return req
}

// read reads every current source, at its pacer's ceiling, for an attempt of
// tokens (what reads coalesces).
func (s *Scope) read(ctx context.Context, tokens int64) ([]*source, gate.Snapshot, error) {
	_, srcs := s.snapshot()
	snap, err := s.backend.Peek(ctx, s.peekRequest(srcs, tokens))
	return srcs, snap, err
}

// absorb reports a decision's breaker events and wakes waiting callers when
// one of them may now do better.
func (s *Scope) absorb(events []gate.Event) {
	wake := false
	for _, e := range events {
		s.observer.Breaker(s.name, e)
		switch e.Kind {
		case gate.EventTransition:
			// The entrant that turned the breaker HALF_OPEN took the probe.
			wake = wake || e.Cause != gate.CauseCooldownElapsed
		case gate.EventProbeReleased, gate.EventOverride:
			wake = true
		}
	}
	if wake {
		s.wait.changed()
	}
}

// remember keeps the memo in step with what a backend said of a breaker: an
// OPEN deadline is stored, anything else forgets the source.
func (s *Scope) remember(name string, v gate.BreakerView, now time.Time) {
	if v.Reason == gate.ReasonCircuitOpen {
		s.memo.Set(name, now.Add(v.RetryAfter))
	} else {
		s.memo.Forget(name)
	}
}

// Announce applies a breaker event that another replica caused (the Redis
// backend's broadcast): a breaker that closed, was reset or overridden is
// forgotten by the memo at once, and waiting callers re-ask.
func (s *Scope) Announce(e gate.Event) {
	if e.Kind == gate.EventOverride || (e.Kind == gate.EventTransition && e.To == gate.Closed) {
		s.memo.Forget(e.Source)
	}
	s.wait.changed()
}

func (s *Scope) source(name string) *source {
	_, srcs := s.snapshot()
	for _, src := range srcs {
		if src.cfg.Name == name {
			return src
		}
	}
	return nil
}
