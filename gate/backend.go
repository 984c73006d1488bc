package gate

import (
	"context"
	"errors"
	"math"
	"time"
)

// Never is the progress age of a scope that has never had a successful attempt.
const Never = time.Duration(math.MaxInt64)

// Source is what the backends need to know of a configured source.
type Source struct {
	Name    string
	Limits  Limits
	Breaker BreakerPolicy
}

// Candidate is a source offered to Admit, in the order the selector chose.
type Candidate struct {
	Source *Source
	// Ceiling is the pacer's concurrency ceiling, 1..Limits.MaxConcurrency.
	Ceiling int
}

// AdmitRequest asks for one permit from the first candidate that can give one.
type AdmitRequest struct {
	Scope    string
	PermitID string
	// Tokens is the attempt's estimated token count, charged to TPM.
	Tokens     int64
	Candidates []Candidate
	// Line, when set, orders the Pick in each candidate's line (see
	// line.go): a candidate whose line has the Pick behind its head is
	// refused as queued without asking its quota or breaker.
	Line *Waiter
	// Tenant, when set, is the call's tenant: it is asked before the walk,
	// and when it refuses (ReasonTenantLimit, ReasonTenantBudget), every
	// candidate is refused with its reason and wait, nothing is taken, and a
	// Line waiter leaves the candidates' lines (it waits for its tenant, not
	// for a source). A grant is counted in the tenant too.
	Tenant *TenantCall
}

// Rejection is why one candidate was refused.
type Rejection struct {
	Source     string
	Reason     Reason
	RetryAfter time.Duration
}

// Permit is the right to make one attempt on one source now.
type Permit struct {
	ID     string
	Source string
	// Probe: the attempt is its breaker's HALF_OPEN probe.
	Probe bool
	// Epoch fences the outcome: an outcome of an ended round is stale.
	Epoch  uint64
	Tokens int64
	// Lease is how long the permit holds its slot without an outcome.
	Lease time.Duration
}

// Admission is the result of one Admit walk.
type Admission struct {
	Granted bool
	Permit  Permit
	// Rejections lists the candidates refused, in walk order: those before
	// the granted one, or all of them.
	Rejections []Rejection
	Events     []Event
	// ProgressAge is the time since the scope's last successful attempt (Never if none).
	ProgressAge time.Duration
	// Places are the Line waiter's places after the Pick, by source (none
	// when it is in no line).
	Places map[string]string
}

// SettleRequest reports the outcome of one permit's attempt.
type SettleRequest struct {
	Scope    string
	Source   *Source
	PermitID string
	Epoch    uint64
	Probe    bool
	Verdict  Verdict
	// Floor is an upstream Retry-After that an OPEN this causes must respect.
	Floor time.Duration
	// ActualTokens settles the TPM charge; < 0 keeps the estimate.
	ActualTokens int64
	// Progress: the attempt succeeded, so the scope made progress.
	Progress bool
	// Line, when set, hands a released slot to the scope's line.
	Line *LineHandoff
	// Tenant, when set, is the permit's tenant: its slot is freed and its
	// tokens settled there too.
	Tenant *TenantCall
}

// Settlement is the result of one Settle.
type Settlement struct {
	// Released: the permit still held its slot (false when its lease had
	// expired, or it was settled before).
	Released bool
	Effect   Effect
	Events   []Event
	// Breaker is the source's breaker after the outcome.
	Breaker     BreakerView
	ProgressAge time.Duration
	// Handoff is the waiter handed the released slot ("" none).
	Handoff string
}

// PeekRequest reads sources without changing them, and asks the backend
// what Admit would answer for each of them now, for an attempt of Tokens.
type PeekRequest struct {
	Scope   string
	Sources []*Source
	// Ceilings are the pacer ceilings of Sources, index by index; a missing
	// or non-positive one is the source's MaxConcurrency (no pacer).
	Ceilings []int
	// Tokens is the estimate of the attempt the verdicts are for.
	Tokens int64
	// Line, when set, reads the line of each source (and may join some).
	Line *LineRead
	// Tenants are read too, each with Admit's verdict for an attempt of
	// Tokens.
	Tenants []TenantCall
}

// Candidate is source i of the request, as Admit would be offered it.
func (r PeekRequest) Candidate(i int) Candidate {
	src := r.Sources[i]
	ceiling := src.Limits.MaxConcurrency
	if i < len(r.Ceilings) && r.Ceilings[i] > 0 {
		ceiling = min(r.Ceilings[i], ceiling)
	}
	return Candidate{Source: src, Ceiling: ceiling}
}

// SourceView is a read of one source.
type SourceView struct {
	Source  string
	Breaker BreakerView
	Quota   QuotaView
	// Verdict is what Admit would answer for this source now, with the limits
	// the backend enforces (a degraded local gate's share included): Reason
	// is ReasonNone when it would grant (a HALF_OPEN breaker whose probe is
	// free counts as granting), else the rejection Admit would return.
	Verdict Rejection
	// Line is the source's line, when the Peek read it.
	Line LineView
}

// Snapshot is the result of one Peek.
type Snapshot struct {
	Sources     []SourceView
	ProgressAge time.Duration
	// Tenants are the request's Tenants, index by index (none from a
	// backend that keeps no tenants).
	Tenants []TenantView
}

// OverrideRequest carries an operator's action on one source's breaker.
type OverrideRequest struct {
	Scope  string
	Source *Source
	Action Action
	Actor  string
	Why    string
}

// OverrideResult is the source after the action, and the events it caused.
type OverrideResult struct {
	View   SourceView
	Events []Event
}

// ErrUnavailable wraps every error of a backend that cannot be reached; the
// server maps it to UNAVAILABLE.
var ErrUnavailable = errors.New("gate: backend unavailable")

// Backend stores breakers and quotas. Each method is one decision and, on a
// shared backend, one round trip. Implementations pass gatetest's contract suite.
type Backend interface {
	// Admit walks the candidates in order: for each, the pacer ceiling and the
	// quota (all dimensions or none), then the breaker; the first candidate
	// that passes all of them gets the permit. A quota taken for a candidate
	// that the breaker refuses is never kept.
	Admit(ctx context.Context, req AdmitRequest) (Admission, error)
	// Settle releases a permit and feeds its outcome to the breaker.
	Settle(ctx context.Context, req SettleRequest) (Settlement, error)
	// Peek reads sources and gives Admit's verdict for each; it never takes
	// a probe or changes a state.
	Peek(ctx context.Context, req PeekRequest) (Snapshot, error)
	// Override carries out an operator's action on a breaker.
	Override(ctx context.Context, req OverrideRequest) (OverrideResult, error)
	// Leave takes a waiter out of the lines of the sources named.
	Leave(ctx context.Context, req LeaveRequest) error
}

// SourceState is one source's breaker and quota, as the memory backend keeps
// it. Its methods are the per-source halves of Admit, Settle and Peek, so the
// Lua scripts of the Redis backend have one Go text to follow.
type SourceState struct {
	Breaker Breaker
	Quota   Quota
}

// Admit tries one candidate. On success the permit's slot is held; on refusal
// nothing is held.
func (s *SourceState) Admit(c Candidate, permitID string, tokens, now int64) (Permit, Rejection, []Event) {
	src := c.Source
	if r := s.quotaVerdict(c, tokens, now); r.Reason != ReasonNone {
		return Permit{}, r, nil
	}
	entry, events := s.Breaker.Enter(src.Breaker, permitID, now)
	if !entry.Allowed {
		return Permit{}, Rejection{Source: src.Name, Reason: entry.Reason, RetryAfter: entry.RetryAfter}, events
	}
	s.Quota.take(src.Limits, permitID, tokens, now)
	return Permit{
		ID: permitID, Source: src.Name, Probe: entry.Probe, Epoch: entry.Epoch,
		Tokens: tokens, Lease: src.Limits.Lease,
	}, Rejection{}, events
}

// Verdict is what Admit would answer for c now, without taking anything:
// the quota's refusal first, then the breaker's (as in Admit's walk).
func (s *SourceState) Verdict(c Candidate, tokens, now int64) Rejection {
	if r := s.quotaVerdict(c, tokens, now); r.Reason != ReasonNone {
		return r
	}
	reason, wait := s.Breaker.check(now)
	return Rejection{Source: c.Source.Name, Reason: reason, RetryAfter: Millis(wait)}
}

func (s *SourceState) quotaVerdict(c Candidate, tokens, now int64) Rejection {
	reason, wait := s.Quota.check(c.Source.Limits, c.Ceiling, tokens, now)
	return Rejection{Source: c.Source.Name, Reason: reason, RetryAfter: Millis(wait)}
}

// Settle releases the permit's slot and applies its outcome. The outcome of
// an ordinary permit that no longer held its slot (settled before, or its
// lease expired and the slot went to someone else) is stale, which makes
// Settle idempotent; a probe is fenced by its own lease and epoch. A
// give-back without a verdict that knows neither probe flag nor epoch (a
// shared backend's, for an Admit whose reply was lost) of the permit that
// holds the probe ends the probe: permit ids are unique, so the permit names
// the probe's round as surely as its epoch would.
func (s *SourceState) Settle(req SettleRequest, now int64) (Settlement, []Event) {
	released := s.Quota.release(req.PermitID, req.ActualTokens, now)
	if !req.Probe && req.Verdict == VerdictNone && s.Breaker.State == HalfOpen && s.Breaker.Probe == req.PermitID {
		req.Probe, req.Epoch = true, s.Breaker.Epoch
	}
	o := Outcome{PermitID: req.PermitID, Epoch: req.Epoch, Probe: req.Probe, Verdict: req.Verdict, Floor: req.Floor}
	var effect Effect
	var events []Event
	if released || req.Probe {
		effect, events = s.Breaker.Settle(req.Source.Breaker, o, now)
	} else {
		effect, events = s.Breaker.stale(o)
	}
	return Settlement{Released: released, Effect: effect, Breaker: s.Breaker.View(req.Source.Breaker, now)}, events
}

// View reads the source.
func (s *SourceState) View(src *Source, now int64) SourceView {
	return SourceView{Source: src.Name, Breaker: s.Breaker.View(src.Breaker, now), Quota: s.Quota.view(now)}
}
