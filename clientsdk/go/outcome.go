package polygate

import (
	"fmt"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Outcome classifies one attempt's upstream result (the outcome table in the polygate README).
type Outcome int

const (
	// Success: 2xx. The call is done.
	Success Outcome = iota + 1
	// Transient: 5xx, 408, timeout, connection error. Counts against the
	// breaker and the retry budget.
	Transient
	// RateLimited: 429 that is not quota exhaustion. Neutral for the
	// breaker, not charged to the retry budget.
	RateLimited
	// SourceDead: 401, 403, 429 insufficient_quota. Opens the source's
	// breaker at once.
	SourceDead
	// ClientError: any other 4xx. The call fails non_retryable.
	ClientError
	// Cancelled: the caller gave up. The call ends.
	Cancelled
)

var outcomeNames = map[Outcome]string{
	Success: "SUCCESS", Transient: "TRANSIENT", RateLimited: "RATE_LIMITED",
	SourceDead: "SOURCE_DEAD", ClientError: "CLIENT_ERROR", Cancelled: "CANCELLED",
}

// String is the outcome's name without the OUTCOME_ prefix, e.g. "RATE_LIMITED".
func (o Outcome) String() string {
	if s, ok := outcomeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

var outcomeProto = map[Outcome]admissionv1.Outcome{
	Success:     admissionv1.Outcome_OUTCOME_SUCCESS,
	Transient:   admissionv1.Outcome_OUTCOME_TRANSIENT,
	RateLimited: admissionv1.Outcome_OUTCOME_RATE_LIMITED,
	SourceDead:  admissionv1.Outcome_OUTCOME_SOURCE_DEAD,
	ClientError: admissionv1.Outcome_OUTCOME_CLIENT_ERROR,
	Cancelled:   admissionv1.Outcome_OUTCOME_CANCELLED,
}

// Result is what the application's attempt reports.
type Result struct {
	Outcome Outcome
	// RetryAfter is the upstream's retry hint (Retry-After and friends; see
	// Classify): a floor of the sidecar's backoff. It is sent capped at
	// MaxRetryHint, and the sidecar caps it again (backoff.max_retry_after,
	// breaker.max_cooldown).
	RetryAfter time.Duration
	// HTTPStatus is the upstream's status, for telemetry (0 if none).
	HTTPStatus int
	// Detail is a short note for the sidecar's logs (cut to 1024 bytes).
	Detail string
	// ActualTokens, when set, settles the attempt's TPM charge to the tokens
	// it really used (see Tokens); nil keeps the estimate.
	ActualTokens *int64
}

// Tokens returns a pointer to n, for Result.ActualTokens.
func Tokens(n int64) *int64 { return &n }

// Attempt is the sidecar's permit to make one attempt on one source now.
type Attempt struct {
	// CallID identifies the call in the sidecar's logs and telemetry.
	CallID string
	// Source is the granted source's name; Attributes its configured
	// attributes (base_url, model...), never secrets.
	Source     string
	Attributes map[string]string
	// Number is the attempt's number in the call, from 1.
	Number int
	// Probe: the attempt is the HALF_OPEN probe of the source's breaker.
	Probe bool
	// Timeout is the source's configured timeout for one attempt; the
	// context given to the attempt ends after it.
	Timeout time.Duration
	// PermitID identifies the permit the attempt holds.
	PermitID string
}
