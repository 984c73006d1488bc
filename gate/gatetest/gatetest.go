// Package gatetest is the contract every gate.Backend must honour, as table
// tests that take a backend constructor: the memory backend and the Redis
// backend both run it, so they cannot drift apart.
package gatetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// Epoch is where every test clock starts: a whole second, far from zero.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a manual clock the suite advances; a backend under test reads its
// time from Now.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at Epoch.
func NewClock() *Clock { return &Clock{t: Epoch} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t, back as well as forward.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Factory returns a fresh backend whose time is clock.Now. Scopes of
// different tests never share a name, so a factory may share one store.
type Factory func(t *testing.T, clock *Clock) gate.Backend

// Run runs the whole contract suite against the backends factory makes.
func Run(t *testing.T, factory Factory) {
	t.Run("Breaker", func(t *testing.T) { runBreaker(t, factory) })
	t.Run("RetryAfter", func(t *testing.T) { runRetryAfter(t, factory) })
	t.Run("Overrides", func(t *testing.T) { runOverrides(t, factory) })
	t.Run("Quota", func(t *testing.T) { runQuota(t, factory) })
	t.Run("Verdict", func(t *testing.T) { runVerdict(t, factory) })
	t.Run("Model", func(t *testing.T) { runModel(t, factory) })
	t.Run("Line", func(t *testing.T) { runLine(t, factory) })
	t.Run("Tenants", func(t *testing.T) { runTenants(t, factory) })
}

// env is one test's backend, clock and scope.
type env struct {
	t       *testing.T
	ctx     context.Context
	b       gate.Backend
	clock   *Clock
	scope   string
	permits atomic.Int64
}

func newEnv(t *testing.T, factory Factory) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	clock := NewClock()
	return &env{t: t, ctx: ctx, b: factory(t, clock), clock: clock, scope: t.Name()}
}

// Src returns a source with roomy limits and a small breaker, changed by opts.
func Src(name string, opts ...func(*gate.Source)) *gate.Source {
	s := &gate.Source{
		Name:   name,
		Limits: gate.Limits{MaxConcurrency: 100, Lease: time.Hour},
		Breaker: gate.BreakerPolicy{
			FailThreshold: 3, MinCalls: 10, FailRate: 0.5, Window: 10 * time.Second,
			Cooldown: time.Second, MaxCooldown: 8 * time.Second, ProbeTTL: 5 * time.Second,
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (e *env) nextID() string {
	return fmt.Sprintf("p%d", e.permits.Add(1))
}

// admit asks for a permit from the sources, in order, at full pacer ceiling.
func (e *env) admit(tokens int64, srcs ...*gate.Source) gate.Admission {
	e.t.Helper()
	cands := make([]gate.Candidate, len(srcs))
	for i, s := range srcs {
		cands[i] = gate.Candidate{Source: s, Ceiling: s.Limits.MaxConcurrency}
	}
	return e.admitCandidates(tokens, cands)
}

func (e *env) admitCandidates(tokens int64, cands []gate.Candidate) gate.Admission {
	e.t.Helper()
	a, err := e.b.Admit(e.ctx, gate.AdmitRequest{Scope: e.scope, PermitID: e.nextID(), Tokens: tokens, Candidates: cands})
	if err != nil {
		e.t.Fatalf("Admit: %v", err)
	}
	return a
}

// grant admits from one source and fails the test unless it is granted.
func (e *env) grant(src *gate.Source) gate.Permit {
	e.t.Helper()
	a := e.admit(0, src)
	if !a.Granted {
		e.t.Fatalf("Admit(%s) refused: %+v", src.Name, a.Rejections)
	}
	return a.Permit
}

// refuse admits from one source and fails the test unless it is refused.
func (e *env) refuse(src *gate.Source) gate.Rejection {
	e.t.Helper()
	a := e.admit(0, src)
	if a.Granted {
		e.t.Fatalf("Admit(%s) granted %+v, want a refusal", src.Name, a.Permit)
	}
	if len(a.Rejections) != 1 {
		e.t.Fatalf("Admit(%s) rejections = %+v, want one", src.Name, a.Rejections)
	}
	return a.Rejections[0]
}

func (e *env) settle(src *gate.Source, p gate.Permit, v gate.Verdict) gate.Settlement {
	e.t.Helper()
	return e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: v, ActualTokens: -1, Progress: v == gate.VerdictSuccess})
}

func (e *env) settleReq(req gate.SettleRequest) gate.Settlement {
	e.t.Helper()
	req.Scope = e.scope
	s, err := e.b.Settle(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Settle: %v", err)
	}
	return s
}

// attempt makes one whole attempt with the given verdict.
func (e *env) attempt(src *gate.Source, v gate.Verdict) gate.Settlement {
	e.t.Helper()
	return e.settle(src, e.grant(src), v)
}

func (e *env) peek(srcs ...*gate.Source) gate.Snapshot {
	e.t.Helper()
	s, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: srcs})
	if err != nil {
		e.t.Fatalf("Peek: %v", err)
	}
	return s
}

func (e *env) view(src *gate.Source) gate.SourceView {
	e.t.Helper()
	return e.peek(src).Sources[0]
}

func (e *env) override(src *gate.Source, a gate.Action) gate.OverrideResult {
	e.t.Helper()
	r, err := e.b.Override(e.ctx, gate.OverrideRequest{Scope: e.scope, Source: src, Action: a, Actor: "tester", Why: "contract"})
	if err != nil {
		e.t.Fatalf("Override(%v): %v", a, err)
	}
	return r
}

// open trips src's breaker with fail_threshold consecutive failures.
func (e *env) open(src *gate.Source) {
	e.t.Helper()
	for range src.Breaker.FailThreshold {
		e.attempt(src, gate.VerdictFailure)
	}
	if st := e.view(src).Breaker.State; st != gate.Open {
		e.t.Fatalf("after %d failures state = %v, want open", src.Breaker.FailThreshold, st)
	}
}

func (e *env) wantState(src *gate.Source, want gate.State) {
	e.t.Helper()
	if got := e.view(src).Breaker.State; got != want {
		e.t.Fatalf("state = %v, want %v", got, want)
	}
}

func hasEvent(events []gate.Event, kind gate.EventKind) bool {
	for _, ev := range events {
		if ev.Kind == kind {
			return true
		}
	}
	return false
}
