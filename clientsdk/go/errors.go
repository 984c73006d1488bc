package polygate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// FailureReason says why the sidecar ended a call.
type FailureReason int

const (
	// CircuitOpen: every source was refused by its breaker and the scope's
	// circuit_open policy is fail_fast.
	CircuitOpen FailureReason = iota + 1
	// QuotaExhausted: a source was refused by quota or pacer and the scope's
	// quota_full policy is fail_fast.
	QuotaExhausted
	// Stalled: the call waited longer than the stall window while its scope
	// made no progress.
	Stalled
	// RetryExhausted: max_attempts real attempts failed (429s not counted).
	RetryExhausted
	// NonRetryable: the upstream refused the request itself (CLIENT_ERROR).
	NonRetryable
	// DeadlineExceeded: the call's deadline passed, or the earliest certain
	// retry is after it.
	DeadlineExceeded
	// CallCancelled: the call reported CANCELLED.
	CallCancelled
	// RetryAfterTooLong: an upstream Retry-After was longer than the scope's
	// backoff.max_retry_after.
	RetryAfterTooLong
	// DeadSource: every source was OPEN because it is dead (auth or quota
	// death) and the scope's source_dead policy is fail_fast.
	DeadSource
	// ScopeRemoved: a reload removed the call's scope.
	ScopeRemoved
	// BudgetExhausted: the call's tenant spent its token budget; RetryAfter
	// is the time until the budget's window frees enough.
	BudgetExhausted
)

var failureNames = map[FailureReason]string{
	CircuitOpen: "circuit_open", QuotaExhausted: "quota_exhausted", Stalled: "stalled",
	RetryExhausted: "retry_exhausted", NonRetryable: "non_retryable",
	DeadlineExceeded: "deadline_exceeded", CallCancelled: "cancelled",
	RetryAfterTooLong: "retry_after_too_long", DeadSource: "source_dead", ScopeRemoved: "scope_removed",
	BudgetExhausted: "budget_exhausted",
}

// String is the reason as the sidecar's API names it, e.g. "circuit_open".
func (r FailureReason) String() string {
	if s, ok := failureNames[r]; ok {
		return s
	}
	return fmt.Sprintf("FailureReason(%d)", int(r))
}

var failureFromProto = map[admissionv1.FailureReason]FailureReason{
	admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN:         CircuitOpen,
	admissionv1.FailureReason_FAILURE_REASON_QUOTA_EXHAUSTED:      QuotaExhausted,
	admissionv1.FailureReason_FAILURE_REASON_STALLED:              Stalled,
	admissionv1.FailureReason_FAILURE_REASON_RETRY_EXHAUSTED:      RetryExhausted,
	admissionv1.FailureReason_FAILURE_REASON_NON_RETRYABLE:        NonRetryable,
	admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED:    DeadlineExceeded,
	admissionv1.FailureReason_FAILURE_REASON_CANCELLED:            CallCancelled,
	admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG: RetryAfterTooLong,
	admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD:          DeadSource,
	admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED:        ScopeRemoved,
	admissionv1.FailureReason_FAILURE_REASON_BUDGET_EXHAUSTED:     BudgetExhausted,
}

// Verdicts, for errors.Is on a *FailureError.
var (
	ErrCircuitOpen      = errors.New("polygate: circuit open")
	ErrQuotaExhausted   = errors.New("polygate: quota exhausted")
	ErrStalled          = errors.New("polygate: stalled")
	ErrRetryExhausted   = errors.New("polygate: retry budget exhausted")
	ErrNonRetryable     = errors.New("polygate: non-retryable upstream error")
	ErrDeadlineExceeded = errors.New("polygate: call deadline exceeded")
	ErrCancelled        = errors.New("polygate: call cancelled")
	ErrSourceDead       = errors.New("polygate: every source is dead")
	ErrScopeRemoved     = errors.New("polygate: scope removed by a reload")
	ErrBudgetExhausted  = errors.New("polygate: the tenant's token budget is spent")
	// ErrAllSourcesExhausted matches the verdicts that end a call refused by
	// every source: CircuitOpen, DeadSource, QuotaExhausted and Stalled.
	ErrAllSourcesExhausted = errors.New("polygate: every source refused the call")
)

var failureSentinels = map[FailureReason]error{
	CircuitOpen: ErrCircuitOpen, QuotaExhausted: ErrQuotaExhausted, Stalled: ErrStalled,
	RetryExhausted: ErrRetryExhausted, NonRetryable: ErrNonRetryable,
	DeadlineExceeded: ErrDeadlineExceeded, CallCancelled: ErrCancelled,
	DeadSource: ErrSourceDead, ScopeRemoved: ErrScopeRemoved, BudgetExhausted: ErrBudgetExhausted,
}

// SourceReason is one source's refusal of the call's last Pick.
type SourceReason struct {
	Source string
	// Reason is the refusal as the sidecar's API names it: "cooldown", "circuit_open",
	// "probe_in_flight", "forced_open", "adaptive_paced", "rate_limited", "queued",
	// "tenant_limit" or "tenant_budget".
	Reason string
	// RetryAfter is the time until this source's earliest certain retry (0
	// when there is none).
	RetryAfter time.Duration
}

// FailureError is the sidecar's verdict that ends a call. errors.Is matches
// it against the sentinel of its reason (ErrCircuitOpen...), against
// ErrAllSourcesExhausted for the refusal verdicts, and against
// context.DeadlineExceeded for DeadlineExceeded.
type FailureError struct {
	Scope  string
	CallID string
	Reason FailureReason
	// RetryAfter is the time until the earliest certain moment a new call
	// could do better (0 when there is none), e.g. the remaining cooldown.
	RetryAfter time.Duration
	// PerSource are the sources' reasons of the last refusal, when the call
	// failed waiting for a source.
	PerSource []SourceReason
	// Attempts is how many attempts the call made; Last is the last one's
	// result (nil if none).
	Attempts int
	Last     *Result
}

func (e *FailureError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "polygate: call %s of scope %s failed: %s", e.CallID, e.Scope, e.Reason)
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, ", retry after %v", e.RetryAfter)
	}
	fmt.Fprintf(&b, " (%d attempts", e.Attempts)
	if e.Last != nil {
		fmt.Fprintf(&b, ", last %s", e.Last.Outcome)
		if e.Last.HTTPStatus != 0 {
			fmt.Fprintf(&b, " %d", e.Last.HTTPStatus)
		}
	}
	b.WriteString(")")
	for i, s := range e.PerSource {
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s %s", sep, s.Source, s.Reason)
		if s.RetryAfter > 0 {
			fmt.Fprintf(&b, " %v", s.RetryAfter)
		}
	}
	return b.String()
}

// Is matches the verdict's sentinels.
func (e *FailureError) Is(target error) bool {
	switch target {
	case failureSentinels[e.Reason]:
		return true
	case ErrAllSourcesExhausted:
		return e.Reason == CircuitOpen || e.Reason == DeadSource || e.Reason == QuotaExhausted || e.Reason == Stalled
	case context.DeadlineExceeded:
		return e.Reason == DeadlineExceeded
	}
	return false
}

// Errors of the sidecar (gRPC statuses), for errors.Is on a *StatusError.
var (
	ErrInvalidArgument    = errors.New("polygate: invalid argument")
	ErrNotFound           = errors.New("polygate: not found (unknown scope, or unknown or expired call)")
	ErrFailedPrecondition = errors.New("polygate: failed precondition")
	ErrResourceExhausted  = errors.New("polygate: too many live calls")
	ErrUnavailable        = errors.New("polygate: sidecar or its backend unavailable")
	ErrUnauthenticated    = errors.New("polygate: unauthenticated")
	ErrInternal           = errors.New("polygate: sidecar internal error")
	ErrSidecar            = errors.New("polygate: sidecar error")
)

// statusErrors is the one table from gRPC codes to the SDK's errors; codes
// not in it are ErrSidecar.
var statusErrors = map[codes.Code]error{
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.NotFound:           ErrNotFound,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.ResourceExhausted:  ErrResourceExhausted,
	codes.Unavailable:        ErrUnavailable,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.Internal:           ErrInternal,
}

// StatusError is a gRPC error of the sidecar: misuse or infrastructure, never
// an admission verdict. errors.Is matches the sentinel of its code
// (ErrNotFound...); status.Code works on it too.
type StatusError struct {
	// Op is the RPC that failed, e.g. "Pick".
	Op   string
	Code codes.Code
	// Reason is the google.rpc.ErrorInfo reason, an admissionv1.ErrorReason
	// name such as "ERROR_REASON_UNKNOWN_SCOPE" ("" if the sidecar sent none);
	// Metadata its metadata (e.g. "field" for a bad field).
	Reason   string
	Metadata map[string]string
	Message  string
	status   *status.Status
}

func (e *StatusError) Error() string {
	reason := ""
	if e.Reason != "" {
		reason = " " + e.Reason
	}
	return fmt.Sprintf("polygate: %s: %s%s: %s", e.Op, e.Code, reason, e.Message)
}

// Is matches the sentinel of the error's code.
func (e *StatusError) Is(target error) bool {
	s, ok := statusErrors[e.Code]
	if !ok {
		s = ErrSidecar
	}
	return target == s
}

// GRPCStatus returns the sidecar's status, details included.
func (e *StatusError) GRPCStatus() *status.Status { return e.status }

// rpcError turns an RPC's error into the SDK's: the caller's context error
// when ctx ended, else a *StatusError.
func rpcError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("polygate: %s: %w", op, ctx.Err())
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("polygate: %s: %w", op, err)
	}
	e := &StatusError{Op: op, Code: st.Code(), Message: st.Message(), status: st}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return e
}
