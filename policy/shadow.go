package policy

import (
	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
)

// Shadow mode (scope key mode: shadow) grants every Pick. The walk, the
// backend's admission, the breakers, quotas, pacer, budgets and telemetry run
// exactly as when enforcing; only the answer differs:
//
//   - when enforcement grants, the grant is the same (it holds its slot,
//     counts in in_flight, and its outcome feeds the breaker), with the
//     sources enforcement refused before it as ShadowRefusals;
//   - when enforcement refuses, the grant is for the first source in walk
//     order, with a permit the backend never issued: it takes no slot (it is
//     not in in_flight, RPM or TPM, which count only what enforcement
//     admits), and its outcome is stale to the breaker (an attempt that
//     enforcement would not have made neither opens nor closes a breaker).
//     ShadowRefusals lists every source's refusal;
//   - when enforcement answers an error instead, the grant is the same as
//     for a refusal, and ShadowError is that error: ErrEstimateTooLarge
//     (the estimate exceeds every source's tpm: ShadowRefusals has each
//     source's rate_limited), or the backend's gate.ErrUnavailable when it
//     could not be reached and does not fall back to a local gate
//     (on_unavailable: fail_closed). Shadow mode never refuses for a limit
//     nor for the backend; misuse is refused as when enforcing.
//
// Ordered admission (the line) does not apply in shadow mode. Switching
// modes by reload keeps every state: the mode is read at each Pick.

// shadowPermit is the grant of a Pick that enforcement refused: the first
// source in walk order, with a permit that holds no slot.
func (s *Scope) shadowPermit(order []*source, cfg *config.Scope, tokens int64) (*source, gate.Permit) {
	src := order[0]
	return src, gate.Permit{ID: NewID("p"), Source: src.cfg.Name, Tokens: tokens, Lease: src.cfg.Lease(cfg.LeaseGrace)}
}

// freed is a released permit: the waiter the backend handed the slot to is
// woken if this replica holds it, and callers held outside the line re-ask.
func (s *Scope) freed(handoff string) {
	if handoff != "" {
		s.line.wake(handoff)
	}
	s.wait.freed()
}
