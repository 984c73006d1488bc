package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
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
	// ErrEstimateTooLarge: the token estimate exceeds every source's TPM.
	ErrEstimateTooLarge = errors.New("policy: estimated tokens exceed the tpm of every source")
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

// Options tunes a Scope; zero values take time.Now, math/rand and no observer.
type Options struct {
	Now      func() time.Time
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
	now      func() time.Time
	rand     func() float64

	mu   sync.RWMutex
	cfg  *config.Scope
	srcs []*source

	sel  *selector
	memo *Memo
	// breakers fires when a breaker of the scope changes in a way a waiting
	// caller cares about; capacity when a permit of the scope is released.
	breakers *signal
	capacity *signal
	// closing ends every server-side wait (shutdown, or the scope removed).
	closing   chan struct{}
	closeOnce sync.Once

	// The poller runs while callers are held without a certain time.
	pollMu   sync.Mutex
	watchers int
	polling  bool
	idle     chan struct{} // the last watcher left
}

// NewScope returns the decisions of one scope over a backend.
func NewScope(cfg *config.Scope, b gate.Backend, o Options) *Scope {
	s := &Scope{
		name: cfg.Name, backend: b, observer: o.Observer, now: o.Now, rand: o.Rand,
		sel: newSelector(), memo: newMemo(), breakers: newSignal(), capacity: newSignal(),
		closing: make(chan struct{}), idle: make(chan struct{}, 1),
	}
	if s.now == nil {
		s.now = time.Now
	}
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
func (s *Scope) Close() { s.closeOnce.Do(func() { close(s.closing) }) }

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
	s.cfg, s.srcs = cfg, srcs
	s.mu.Unlock()
	s.breakers.fire()
	s.capacity.fire()
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

func (s *Scope) specs(srcs []*source) []*gate.Source {
	out := make([]*gate.Source, len(srcs))
	for i, src := range srcs {
		out[i] = &src.gate
	}
	return out
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
		s.breakers.fire()
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
	s.breakers.fire()
}

// Pick is the result of one Pick: exactly one field is set.
type Pick struct {
	Grant      *Grant
	NoRunnable *NoRunnable
	// Failure: the call ended before anything could be tried (its deadline passed).
	Failure *Failure
}

// Grant is a permit to make one attempt now.
type Grant struct {
	Permit gate.Permit
	Source *config.Source
	// Attempt is the attempt's number in the call, from 1.
	Attempt int
	// Skipped are the sources refused before the granted one, in walk order.
	Skipped []gate.Rejection
}

// NoRunnable is a refusal of every source.
type NoRunnable struct {
	// GateRejections counts sources refused by breaker or cooldown memo.
	GateRejections int
	// Sources is every source's reason, in walk order.
	Sources []gate.Rejection
}

// Pick walks the sources in the selector's order through the cooldown memo,
// then (in one backend decision) the pacer, the quota and the breaker.
//
// The backend decides on a context that the caller's cancellation does not
// cut (the backend's own timeout bounds it), so that a decision is never left
// half-known; if the caller has gone when a permit comes back, nobody would
// ever report it, so it is given back at once and Pick fails with ctx's error.
func (s *Scope) Pick(ctx context.Context, c *Call) (Pick, error) {
	p, events, err := s.pick(ctx, c)
	s.absorb(events)
	if err != nil {
		return p, err
	}
	s.observer.Picked(c, p)
	return p, nil
}

func (s *Scope) pick(ctx context.Context, c *Call) (Pick, []gate.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.end != nil {
		return Pick{}, nil, ErrCallEnded
	}
	if c.permit != nil {
		return Pick{}, nil, fmt.Errorf("%w: %s", ErrPermitOutstanding, c.permit.ID)
	}
	cfg, srcs := s.snapshot()
	now := s.now()
	if !c.Deadline.IsZero() && !now.Before(c.Deadline) {
		f := &Failure{Reason: FailDeadlineExceeded}
		c.finish(Action{Failure: f})
		return Pick{Failure: f}, nil, nil
	}

	order := s.sel.order(srcs, c.failedIn, now)
	refused := make(map[string]gate.Rejection, len(order))
	cands := make([]gate.Candidate, 0, len(order))
	fits := false
	for _, src := range order {
		name := src.cfg.Name
		if src.cfg.TPM > 0 && c.Tokens > src.cfg.TPM {
			refused[name] = gate.Rejection{Source: name, Reason: gate.ReasonRateLimited}
			continue
		}
		fits = true
		if wait := s.memo.Remaining(name, now); wait > 0 {
			refused[name] = gate.Rejection{Source: name, Reason: gate.ReasonCooldown, RetryAfter: wait}
			continue
		}
		cands = append(cands, gate.Candidate{Source: &src.gate, Ceiling: src.pacer.Ceiling()})
	}
	if !fits {
		return Pick{}, nil, fmt.Errorf("%w: %d tokens in scope %s", ErrEstimateTooLarge, c.Tokens, cfg.Name)
	}

	var adm gate.Admission
	if len(cands) > 0 {
		var err error
		adm, err = s.backend.Admit(context.WithoutCancel(ctx), gate.AdmitRequest{Scope: s.name, PermitID: NewID("p"), Tokens: c.Tokens, Candidates: cands})
		if err != nil {
			return Pick{}, nil, err
		}
		if adm.Granted && ctx.Err() != nil {
			i := slices.IndexFunc(cands, func(c gate.Candidate) bool { return c.Source.Name == adm.Permit.Source })
			events, err := s.giveBack(ctx, adm.Permit, cands[i].Source)
			return Pick{}, append(adm.Events, events...), errors.Join(ctx.Err(), err)
		}
		now = s.now()
		for _, r := range adm.Rejections {
			refused[r.Source] = r
			if r.Reason == gate.ReasonCircuitOpen {
				s.memo.Set(r.Source, now.Add(r.RetryAfter))
			}
		}
	}
	var (
		reasons []gate.Rejection
		gateN   int
		granted *source
	)
	for _, src := range order {
		if adm.Granted && src.cfg.Name == adm.Permit.Source {
			granted = src
			break
		}
		if r, ok := refused[src.cfg.Name]; ok {
			reasons = append(reasons, r)
			if r.Reason.Gate() {
				gateN++
			}
		}
	}

	var p Pick
	if granted != nil {
		c.permit, c.permitSrc, c.grantedAt = &adm.Permit, granted.gate, now
		c.attempts++
		c.waiting, c.last = false, nil
		p.Grant = &Grant{Permit: adm.Permit, Source: granted.cfg, Attempt: c.attempts, Skipped: reasons}
	} else {
		c.last = &NoRunnable{GateRejections: gateN, Sources: reasons}
		p.NoRunnable = c.last
	}
	return p, adm.Events, nil
}

// giveBack releases a permit of src nobody will report, without a verdict (a
// probe's lease ends, the next entrant may probe).
func (s *Scope) giveBack(ctx context.Context, p gate.Permit, src *gate.Source) ([]gate.Event, error) {
	st, err := s.backend.Settle(context.WithoutCancel(ctx), gate.SettleRequest{
		Scope: s.name, Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: gate.VerdictNone, ActualTokens: -1,
	})
	if err == nil && st.Released {
		s.capacity.fire()
	}
	return st.Events, err
}

// Release gives back the permit a call holds, without a verdict and without
// accounting it to the call: for a call the sidecar forgets (idle expiry).
func (s *Scope) Release(ctx context.Context, c *Call) error {
	c.mu.Lock()
	p, src := c.permit, c.permitSrc
	c.permit = nil
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	events, err := s.giveBack(ctx, *p, &src)
	s.absorb(events)
	return err
}

// Cancel ends a call its caller gave up on: a held permit is settled as
// Cancelled (the observers are told, as for any outcome); a call waiting
// between attempts ends as cancelled at once, so that no Pick can grant it a
// permit afterwards. ended reports whether the call was live; settled
// whether a permit was reported for it.
func (s *Scope) Cancel(ctx context.Context, c *Call) (ended, settled bool, err error) {
	c.mu.Lock()
	switch {
	case c.end != nil:
		c.mu.Unlock()
		return false, false, nil
	case c.permit == nil:
		c.finish(Action{Failure: &Failure{Reason: FailCancelled}})
		c.mu.Unlock()
		return true, false, nil
	}
	id := c.permit.ID
	c.mu.Unlock()
	// While the permit is held no Pick can run; another report of the same
	// permit is answered once, idempotently.
	r, err := s.RecordOutcome(ctx, c, Attempt{PermitID: id, Outcome: Cancelled, ActualTokens: -1, Detail: "cancelled by the caller"})
	if err != nil {
		return false, false, err
	}
	return r.Next.Failure != nil && r.Next.Failure.Reason == FailCancelled, true, nil
}

// Decision is OnNoRunnable's answer: wait Sleep more (after the sleep the
// sidecar already did), or fail.
type Decision struct {
	Sleep   time.Duration
	Failure *Failure
	// Slept is how long the sidecar held the caller before answering; Woken
	// says a change of the scope ended that wait early.
	Slept time.Duration
	Woken bool
	// Uncertain: there was no certain time to wait for (a probe in flight, a
	// full pool), so the sidecar held the caller until something changed.
	Uncertain bool
}

// OnNoRunnable decides, after a NoRunnable Pick, whether the call waits or
// fails (DESIGN's formula, dispatched by the reason of the refusal), and does
// the wait here, inside the sidecar:
//
//   - with a certain time to wait for (every source OPEN), it sleeps until
//     the earliest cooldown ends plus jitter, clamped to the stall budget, and
//     ends early when a breaker of the scope changes;
//   - without one (a probe in flight, a full pool, a pacer ceiling), it holds
//     the caller until something it waits for changes — a breaker transition,
//     a released permit, or a source the scope's poller finds admissible on
//     its read of the backend every poll_interval — and at most until the
//     stall budget (plus one poll_interval) is spent. A change is noticed
//     within one poll interval, as with the formula's polling, but the caller
//     makes one round trip per change instead of one per poll interval.
//
// Either wait answers before ctx's deadline: a certain wait then leaves the
// rest of its sleep to the caller, an uncertain one leaves nothing (the caller
// asks again). Close answers every wait at once the same way.
func (s *Scope) OnNoRunnable(ctx context.Context, c *Call) (Decision, error) {
	// Take the wake-ups before reading the backend, so that no change between
	// the read and the sleep can be missed.
	changed, freed := s.breakers.wait(), s.capacity.wait()
	d, circuit, first, err := s.decide(ctx, c)
	if err != nil {
		return Decision{}, err
	}
	if first {
		s.observer.Waiting(c, d.Sleep, c.lastSources())
	}
	if d.Failure == nil {
		if circuit {
			freed = nil // a released permit does not help a call every breaker refuses
		}
		if d.Uncertain {
			defer s.watch()()
		}
		nap := d.Sleep
		if deadline, ok := ctx.Deadline(); ok {
			// Answer before the caller's RPC deadline.
			left := time.Until(deadline)
			nap = min(nap, max(0, left-min(left/10, 50*time.Millisecond)))
		}
		start := s.now()
		timer := time.NewTimer(nap)
		select {
		case <-timer.C:
		case <-changed:
			d.Woken = true
		case <-freed:
			d.Woken = true
		case <-s.closing:
		case <-ctx.Done():
			timer.Stop()
			return Decision{}, ctx.Err()
		}
		timer.Stop()
		d.Slept = s.now().Sub(start)
		if d.Woken || d.Uncertain || d.Slept >= d.Sleep {
			d.Sleep = 0
		} else {
			d.Sleep = ceilMs(d.Sleep - d.Slept)
		}
	}
	s.observer.Decided(c, d)
	return d, nil
}

// decide is OnNoRunnable without the wait. circuit reports that every source
// was refused by its breaker or the cooldown memo.
func (s *Scope) decide(ctx context.Context, c *Call) (d Decision, circuit, first bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.end != nil {
		return d, false, false, ErrCallEnded
	}
	nr := c.last
	if nr == nil {
		return d, false, false, ErrNoRefusal
	}
	cfg, srcs := s.snapshot()
	snap, err := s.backend.Peek(ctx, gate.PeekRequest{Scope: s.name, Sources: s.specs(srcs)})
	if err != nil {
		return d, false, false, err
	}
	now := s.now()
	hint := s.breakerWait(snap, now)
	circuit = nr.GateRejections == len(srcs)
	fail := func(reason FailureReason, retryAfter time.Duration) (Decision, bool, bool, error) {
		f := &Failure{Reason: reason, RetryAfter: max(retryAfter, 0), Sources: nr.Sources}
		c.finish(Action{Failure: f})
		return Decision{Failure: f}, circuit, false, nil
	}

	var left time.Duration
	if !c.Deadline.IsZero() {
		if left = c.Deadline.Sub(now); left <= 0 {
			return fail(FailDeadlineExceeded, 0)
		}
	}
	if s.admissible(srcs, snap, c.Tokens) {
		// Something changed between the Pick and this read (a permit released,
		// a breaker closed or reset elsewhere), before the wake-ups were
		// taken: that is a wake-up, not a reason to fail or to wait.
		return Decision{Woken: true}, circuit, false, nil
	}
	if circuit {
		if cfg.CircuitOpen == config.FailFast {
			return fail(FailCircuitOpen, hint)
		}
	} else {
		if cfg.QuotaFull == config.FailFast {
			return fail(FailQuotaExhausted, minRetryAfter(nr.Sources))
		}
		hint = 0
	}
	stalled := c.stalledFor(now)
	if stalled > cfg.StallWindow && snap.ProgressAge > cfg.StallWindow {
		return fail(FailStalled, hint)
	}
	if left > 0 && hint > left {
		// The earliest certain moment is past the deadline: fail now, not then.
		return fail(FailDeadlineExceeded, hint)
	}
	// DESIGN's formula, with the stall budget as the bound of an uncertain
	// wait (see OnNoRunnable).
	jitter := time.Duration(float64(cfg.PollInterval) * (0.5 + 0.5*s.rand()))
	budget := cfg.StallWindow - stalled + cfg.PollInterval
	sleep, uncertain := budget, hint == 0
	if hint > 0 {
		sleep = hint + jitter
	}
	sleep = max(jitter, min(sleep, budget))
	if left > 0 {
		sleep = min(sleep, left)
	}
	first = !c.waiting
	c.waiting = true
	return Decision{Sleep: ceilMs(sleep), Uncertain: uncertain}, circuit, first, nil
}

// watch registers a caller held without a certain time; the scope's poller
// runs while there is one. The returned function unregisters it.
func (s *Scope) watch() (unwatch func()) {
	s.pollMu.Lock()
	s.watchers++
	if !s.polling {
		s.polling = true
		go s.poll()
	}
	s.pollMu.Unlock()
	return func() {
		s.pollMu.Lock()
		s.watchers--
		if s.watchers == 0 {
			select {
			case s.idle <- struct{}{}: // the poller stops now, not at its next tick
			default:
			}
		}
		s.pollMu.Unlock()
	}
}

// poll reads the scope's sources every (jittered) poll_interval while callers
// are held, and wakes them when a source looks admissible: one backend read
// per interval for the whole scope, which notices what no local signal
// reports — a permit released or a lease expired on another replica, a probe
// lease that ran out.
func (s *Scope) poll() {
	for {
		cfg, srcs := s.snapshot()
		timer := time.NewTimer(time.Duration(float64(cfg.PollInterval) * (0.5 + 0.5*s.rand())))
		select {
		case <-timer.C:
		case <-s.idle:
		case <-s.closing:
		}
		timer.Stop()
		s.pollMu.Lock()
		if s.watchers == 0 || isClosed(s.closing) {
			s.polling = false
			s.pollMu.Unlock()
			return
		}
		s.pollMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), max(cfg.PollInterval, time.Second))
		snap, err := s.backend.Peek(ctx, gate.PeekRequest{Scope: s.name, Sources: s.specs(srcs)})
		cancel()
		if err == nil && s.admissible(srcs, snap, 0) {
			s.breakers.fire()
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// admissible reports whether some source would admit an attempt of tokens
// now, by the backend's own rules (the breaker's answer and the quota's
// Refusal) and the cooldown memo, which it refreshes from the snapshot.
func (s *Scope) admissible(srcs []*source, snap gate.Snapshot, tokens int64) bool {
	now := s.now()
	found := false
	for i, v := range snap.Sources {
		s.remember(v.Source, v.Breaker, now)
		if v.Breaker.Reason == gate.ReasonNone && v.Quota.Refusal(srcs[i].gate.Limits, srcs[i].pacer.Ceiling(), tokens) == gate.ReasonNone {
			found = true
		}
	}
	return found
}

// breakerWait is the earliest certain retry over a snapshot's breakers (the
// minimum of their waits), refreshing the cooldown memo from it.
func (s *Scope) breakerWait(snap gate.Snapshot, now time.Time) time.Duration {
	waits := make([]gate.Rejection, len(snap.Sources))
	for i, v := range snap.Sources {
		s.remember(v.Source, v.Breaker, now)
		waits[i] = gate.Rejection{RetryAfter: v.Breaker.RetryAfter}
	}
	return minRetryAfter(waits)
}

// minRetryAfter is the least retry_after of a list (0 for none).
func minRetryAfter(rs []gate.Rejection) time.Duration {
	var least time.Duration = -1
	for _, r := range rs {
		if least < 0 || r.RetryAfter < least {
			least = r.RetryAfter
		}
	}
	return max(least, 0)
}

// Attempt is an attempt's report.
type Attempt struct {
	PermitID string
	Source   string
	Outcome  Outcome
	// RetryAfter is the upstream's Retry-After (0 if none): a floor of the
	// backoff, and of the OPEN a dead source causes.
	RetryAfter time.Duration
	// ActualTokens settles the TPM charge; < 0 keeps the estimate.
	ActualTokens int64
	HTTPStatus   int
	Detail       string
	// Latency is the attempt's time from grant to report (filled in by RecordOutcome).
	Latency time.Duration
	// Number is the attempt's number in the call, from 1; Probe and Epoch
	// are its permit's (filled in by RecordOutcome, for observers).
	Number int
	Probe  bool
	Epoch  uint64
}

// Recorded is RecordOutcome's answer.
type Recorded struct {
	Next Action
	// Effect says what the outcome did to the breaker (stale outcomes change nothing).
	Effect  gate.Effect
	Breaker gate.BreakerView
	// Released: the permit still held its slot.
	Released bool
}

// RecordOutcome settles the call's permit with the attempt's outcome, feeds
// the breaker, pacer and the call's budgets, and returns the next action. It
// is idempotent per permit: reporting the same permit again returns the first
// answer.
func (s *Scope) RecordOutcome(ctx context.Context, c *Call, a Attempt) (Recorded, error) {
	rec, a, st, err := s.record(ctx, c, a)
	if err != nil || st == nil {
		return rec, err // an error, or a repeated report
	}
	s.absorb(st.Events)
	if st.Released {
		s.capacity.fire()
	}
	s.observer.Settled(c, a, rec)
	return rec, nil
}

func (s *Scope) record(ctx context.Context, c *Call, a Attempt) (Recorded, Attempt, *gate.Settlement, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.answers[a.PermitID]; ok {
		return prev, a, nil, nil
	}
	if c.permit == nil || c.permit.ID != a.PermitID {
		return Recorded{}, a, nil, fmt.Errorf("%w: %s", ErrPermitNotOfCall, a.PermitID)
	}
	r, ok := outcomes[a.Outcome]
	if !ok {
		return Recorded{}, a, nil, fmt.Errorf("%w: %d", ErrUnknownOutcome, a.Outcome)
	}
	// An upstream hint is a floor with a ceiling: a dead source's OPEN
	// lasts at least the hint, at most max_cooldown.
	var floor time.Duration
	if a.Outcome == SourceDead {
		floor = min(a.RetryAfter, c.permitSrc.Breaker.MaxCooldown)
	}
	p := c.permit
	st, err := s.backend.Settle(ctx, gate.SettleRequest{
		Scope: s.name, Source: &c.permitSrc, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe,
		Verdict: r.verdict, Floor: floor, ActualTokens: a.ActualTokens, Progress: a.Outcome == Success,
	})
	if err != nil {
		return Recorded{}, a, nil, err // the permit stays the call's; the report may be retried
	}
	now := s.now()
	cfg, _ := s.snapshot()
	a.Source, a.Latency = p.Source, now.Sub(c.grantedAt)
	a.Number, a.Probe, a.Epoch = c.attempts, p.Probe, p.Epoch
	s.remember(p.Source, st.Breaker, now)
	if src := s.source(p.Source); src != nil {
		switch a.Outcome {
		case Success:
			src.pacer.Success()
		case RateLimited:
			src.pacer.RateLimited()
		}
		if r.failed {
			src.markFailed(now)
		}
	}
	if !r.refunded {
		c.productive += a.Latency
	}
	if r.charged {
		c.charged++
	}
	if r.failed {
		c.failures++
		c.failedIn[p.Source]++
	}
	c.permit = nil

	rec := Recorded{Next: s.next(c, cfg, r, a, st.ProgressAge, now), Effect: st.Effect, Breaker: st.Breaker, Released: st.Released}
	c.answers[a.PermitID] = rec
	c.finish(rec.Next)
	return rec, a, &st, nil
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

// next is the outcome table's last column. Both budgets are checked at every
// failed attempt, so a call ends with whichever runs out first; a backoff is
// clamped to the rest of the stall budget (plus one poll interval) while
// there is some left, and is never shorter than an upstream Retry-After.
func (s *Scope) next(c *Call, cfg *config.Scope, r rule, a Attempt, progressAge time.Duration, now time.Time) Action {
	switch r.then {
	case thenDone:
		return Action{Done: true}
	case thenFailNonRetryable:
		return Action{Failure: &Failure{Reason: FailNonRetryable}}
	case thenClose:
		return Action{Failure: &Failure{Reason: FailCancelled}}
	case thenRetry:
		if c.charged >= cfg.MaxAttempts {
			return Action{Failure: &Failure{Reason: FailRetryExhausted}}
		}
	}
	stalled := c.stalledFor(now)
	if stalled > cfg.StallWindow && progressAge > cfg.StallWindow {
		return Action{Failure: &Failure{Reason: FailStalled, RetryAfter: ceilMs(a.RetryAfter)}}
	}
	backoff := Backoff(cfg.BackoffBase, cfg.BackoffMax, c.failures, 0, s.rand)
	if left := cfg.StallWindow - stalled + cfg.PollInterval; left > 0 {
		// Not past the stall budget: do not sleep beyond it. (Past it, the
		// scope is making progress, or the call would have failed stalled:
		// the full backoff applies.)
		backoff = min(backoff, left)
	}
	hint := a.RetryAfter
	switch {
	case a.Outcome == SourceDead:
		// The hint lengthened the source's OPEN (up to max_cooldown); the
		// retry may go to another source.
		hint = min(hint, c.permitSrc.Breaker.MaxCooldown, cfg.MaxRetryAfter)
	case hint > cfg.MaxRetryAfter:
		return Action{Failure: &Failure{Reason: FailRetryAfterTooLong, RetryAfter: ceilMs(hint)}}
	}
	backoff = max(backoff, ceilMs(hint))
	if !c.Deadline.IsZero() && now.Add(backoff).After(c.Deadline) {
		return Action{Failure: &Failure{Reason: FailDeadlineExceeded, RetryAfter: backoff}}
	}
	return Action{Retry: &backoff}
}

// RetryAfter is the earliest certain retry moment over the named sources (all
// when none are named), with each source's state.
func (s *Scope) RetryAfter(ctx context.Context, names []string) (time.Duration, []gate.SourceView, error) {
	_, srcs := s.snapshot()
	if len(names) > 0 {
		picked := make([]*source, 0, len(names))
		for _, n := range names {
			i := slices.IndexFunc(srcs, func(src *source) bool { return src.cfg.Name == n })
			if i < 0 {
				return 0, nil, fmt.Errorf("%w: %q in scope %s", ErrUnknownSource, n, s.name)
			}
			picked = append(picked, srcs[i])
		}
		srcs = picked
	}
	snap, err := s.backend.Peek(ctx, gate.PeekRequest{Scope: s.name, Sources: s.specs(srcs)})
	if err != nil {
		return 0, nil, err
	}
	return s.breakerWait(snap, s.now()), snap.Sources, nil
}

// SourceState is one source as DescribeScope shows it.
type SourceState struct {
	Config *config.Source
	View   gate.SourceView
	// Ceiling is the pacer's ceiling; Memo the cooldown memo's remaining time.
	Ceiling        int
	Memo           time.Duration
	FailedRecently bool
}

// Description is a scope's live state and effective configuration.
type Description struct {
	Config      *config.Scope
	Sources     []SourceState
	ProgressAge time.Duration
}

// Describe reads the scope; it never takes a probe.
func (s *Scope) Describe(ctx context.Context) (Description, error) {
	cfg, srcs := s.snapshot()
	snap, err := s.backend.Peek(ctx, gate.PeekRequest{Scope: s.name, Sources: s.specs(srcs)})
	if err != nil {
		return Description{}, err
	}
	now := s.now()
	d := Description{Config: cfg, ProgressAge: snap.ProgressAge}
	for i, src := range srcs {
		d.Sources = append(d.Sources, SourceState{
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
	s.remember(name, r.View.Breaker, s.now())
	s.absorb(r.Events)
	return r.View, nil
}
