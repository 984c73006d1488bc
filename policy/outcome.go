package policy

import (
	"fmt"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/internal/enum"
)

// Outcome classifies one attempt's upstream result.
type Outcome uint8

const (
	// Success: 2xx.
	Success Outcome = iota + 1
	// Transient: 5xx, 408, timeout, connection error.
	Transient
	// RateLimited: 429 that is not a quota exhaustion.
	RateLimited
	// SourceDead: 401, 403, 429 insufficient_quota.
	SourceDead
	// ClientError: any other 4xx.
	ClientError
	// Cancelled: the caller gave up.
	Cancelled
)

var outcomeNames = []string{
	Success:     "success",
	Transient:   "transient",
	RateLimited: "rate_limited",
	SourceDead:  "source_dead",
	ClientError: "client_error",
	Cancelled:   "cancelled",
}

func (o Outcome) String() string { return enum.String(o, outcomeNames) }

// then is what an outcome leads to.
type then uint8

const (
	thenDone then = iota
	thenRetry
	thenRetryUnlessStalled
	thenFailNonRetryable
	thenClose
)

// rule is one row of the outcome table (docs/design.md, Outcomes).
type rule struct {
	verdict gate.Verdict
	// charged: the attempt counts against max_attempts.
	charged bool
	// refunded: the attempt's time counts as waiting (stall budget), not as
	// productive time.
	refunded bool
	// failed: the attempt failed the source, which moves it back in this
	// call's order and demotes it for the scope for a while.
	failed bool
	then   then
}

// outcomes is the outcome table of docs/design.md, the only copy of it in the code.
var outcomes = map[Outcome]rule{
	Success:     {verdict: gate.VerdictSuccess, then: thenDone},
	Transient:   {verdict: gate.VerdictFailure, charged: true, failed: true, then: thenRetry},
	RateLimited: {verdict: gate.VerdictNone, refunded: true, then: thenRetryUnlessStalled},
	SourceDead:  {verdict: gate.VerdictForceOpen, charged: true, failed: true, then: thenRetry},
	ClientError: {verdict: gate.VerdictNone, then: thenFailNonRetryable},
	Cancelled:   {verdict: gate.VerdictNone, then: thenClose},
}

// FailureReason says why a call failed.
type FailureReason uint8

const (
	// FailCircuitOpen: every source refused by its breaker, circuit_open = fail_fast.
	FailCircuitOpen FailureReason = iota + 1
	// FailQuotaExhausted: a source refused by quota or pacer, quota_full = fail_fast.
	FailQuotaExhausted
	// FailStalled: the stall budget ran out while the scope made no progress.
	FailStalled
	// FailRetryExhausted: max_attempts real attempts failed.
	FailRetryExhausted
	// FailNonRetryable: the upstream refused the request itself (a 4xx).
	FailNonRetryable
	// FailDeadlineExceeded: the call's deadline passed, or waiting would pass it.
	FailDeadlineExceeded
	// FailCancelled: the caller reported CANCELLED.
	FailCancelled
	// FailRetryAfterTooLong: an upstream Retry-After is longer than the
	// scope's backoff.max_retry_after.
	FailRetryAfterTooLong
	// FailSourceDead: every source refused by a breaker OPEN because of a
	// SOURCE_DEAD outcome, source_dead = fail_fast.
	FailSourceDead
	// FailScopeRemoved: a reload removed the call's scope.
	FailScopeRemoved
	// FailBudgetExhausted: the call's tenant spent its token budget, and
	// waiting for the window to free enough is not the scope's policy.
	FailBudgetExhausted
)

var failureReasonNames = []string{
	FailCircuitOpen:       "circuit_open",
	FailQuotaExhausted:    "quota_exhausted",
	FailStalled:           "stalled",
	FailRetryExhausted:    "retry_exhausted",
	FailNonRetryable:      "non_retryable",
	FailDeadlineExceeded:  "deadline_exceeded",
	FailCancelled:         "cancelled",
	FailRetryAfterTooLong: "retry_after_too_long",
	FailSourceDead:        "source_dead",
	FailScopeRemoved:      "scope_removed",
	FailBudgetExhausted:   "budget_exhausted",
}

func (r FailureReason) String() string { return enum.String(r, failureReasonNames) }

// Failure ends a call.
type Failure struct {
	Reason FailureReason
	// RetryAfter is the earliest certain moment a new call could do better
	// (0 when there is none).
	RetryAfter time.Duration
	// Sources are the per-source reasons of the last refusal, when the call
	// failed waiting for a source.
	Sources []gate.Rejection
}

// Action is what the caller does after an outcome: exactly one field is set
// or Done is true.
type Action struct {
	Done bool
	// Retry: sleep this long, then Pick again.
	Retry   *time.Duration
	Failure *Failure
}

func (a Action) String() string {
	switch {
	case a.Done:
		return "done"
	case a.Retry != nil:
		return fmt.Sprintf("retry(%v)", *a.Retry)
	case a.Failure != nil:
		return fmt.Sprintf("failure(%v)", a.Failure.Reason)
	}
	return "none"
}
