package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

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
	// Shadow: the scope is in shadow mode; ShadowRefusals is what
	// enforcement would have refused and why, ShadowError the error it
	// would have answered instead of any answer (ErrEstimateTooLarge, or
	// the backend's gate.ErrUnavailable), nil for none (see shadow.go).
	Shadow         bool
	ShadowRefusals []gate.Rejection
	ShadowError    error
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
	now := time.Now()
	if !c.Deadline.IsZero() && !now.Before(c.Deadline) {
		f := &Failure{Reason: FailDeadlineExceeded}
		c.finish(Action{Failure: f})
		s.leave(c)
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
	shadow := cfg.Mode == config.Shadow
	var shadowErr error // what enforcement would have answered instead (shadow mode)
	if !fits {
		err := fmt.Errorf("%w: %d tokens exceed the tpm of every source of scope %s", ErrEstimateTooLarge, c.Tokens, cfg.Name)
		if !shadow {
			return Pick{}, nil, err
		}
		shadowErr = err
	}
	tc := s.tenant(c.Tenant)
	if err := tooBigForTenant(tc, c.Tokens); err != nil {
		if !shadow {
			return Pick{}, nil, err
		}
		shadowErr = cmp.Or(shadowErr, err)
	}

	var adm gate.Admission
	if len(cands) > 0 {
		var w *gate.Waiter
		if !shadow {
			w = s.waiter(c, cfg)
			s.line.left(c.ID) // its places are the backend's once a leave in flight is
		}
		var err error
		adm, err = s.backend.Admit(context.WithoutCancel(ctx), gate.AdmitRequest{Scope: s.name, PermitID: NewID("p"), Tokens: c.Tokens, Candidates: cands, Line: w, Tenant: tc})
		if shadow && errors.Is(err, gate.ErrUnavailable) {
			// Enforcement answers UNAVAILABLE here (a backend that falls
			// back to a local gate answers instead of failing).
			adm, shadowErr, err = gate.Admission{}, err, nil
		}
		if err != nil {
			return Pick{}, nil, err
		}
		if w != nil {
			s.admitted(c, cands, adm)
		}
		if adm.Granted && ctx.Err() != nil {
			i := slices.IndexFunc(cands, func(c gate.Candidate) bool { return c.Source.Name == adm.Permit.Source })
			events, err := s.giveBack(ctx, adm.Permit, cands[i].Source, tc)
			return Pick{}, append(adm.Events, events...), errors.Join(ctx.Err(), err)
		}
		now = time.Now()
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

	if shadow || (len(cands) == 0 && !gate.CapacityRefused(reasons)) {
		// In line from before a reload to shadow mode, or refused by every
		// breaker without asking the backend.
		s.leave(c)
	}
	if shadow {
		if granted == nil {
			granted, adm.Permit = s.shadowPermit(order, cfg, c.Tokens)
		}
	}
	var p Pick
	if granted != nil {
		c.attempts++
		c.waiting, c.last = false, nil
		p.Grant = &Grant{Permit: adm.Permit, Source: granted.cfg, Attempt: c.attempts, Skipped: reasons}
		// The call points at the grant's permit: neither is written again.
		c.permit, c.permitSrc, c.grantedAt = &p.Grant.Permit, &granted.gate, now
		if shadow {
			p.Grant.Skipped, p.Grant.Shadow, p.Grant.ShadowRefusals, p.Grant.ShadowError = nil, true, reasons, shadowErr
		}
	} else {
		c.last = &NoRunnable{GateRejections: gateN, Sources: reasons}
		p.NoRunnable = c.last
	}
	return p, adm.Events, nil
}

// giveBack releases a permit of src (and of tenant tc) nobody will report,
// without a verdict (a probe's lease ends, the next entrant may probe).
func (s *Scope) giveBack(ctx context.Context, p gate.Permit, src *gate.Source, tc *gate.TenantCall) ([]gate.Event, error) {
	st, err := s.backend.Settle(context.WithoutCancel(ctx), gate.SettleRequest{
		Scope: s.name, Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: gate.VerdictNone, ActualTokens: -1,
		Line: s.lineHandoff(), Tenant: tc,
	})
	if err == nil && st.Released {
		s.freed(st.Handoff)
		s.tenantFreed(tc, true)
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
	events, err := s.giveBack(ctx, *p, src, s.tenant(c.Tenant))
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
		s.leave(c)
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
