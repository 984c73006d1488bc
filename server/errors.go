package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
)

// ErrorDomain is the domain of every google.rpc.ErrorInfo the sidecar sends.
const ErrorDomain = "polygate.dev"

// Errors of this package; policy and gate errors are mapped beside them.
var (
	errUnknownScope    = errors.New("unknown scope")
	errUnknownCall     = errors.New("unknown or expired call")
	errTooManyCalls    = errors.New("too many live calls")
	errTooManyWatchers = errors.New("too many WatchEvents streams")
	errUnauthenticated = errors.New("missing or wrong bearer token")
	// errTenantMismatch and errTenantTooManyCalls come as a tenantError.
	errTenantMismatch     = errors.New("the tenant is not the credential's")
	errTenantTooManyCalls = errors.New("too many live calls of the tenant")
	// errPanic is a handler's panic, recovered and logged with its stack
	// where it was recovered (panicked).
	errPanic = errors.New("panic in handler")
)

// tenantError is a tenant's refusal: its sentinel, the credential's tenant
// and, for a mismatch, the one requested and by what.
type tenantError struct {
	err               error
	tenant, requested string
	by                string
	limit             int
}

func (e *tenantError) Error() string {
	if e.err == errTenantTooManyCalls {
		return fmt.Sprintf("%v: tenant %s has %d calls open in the scope (max_live_calls)", e.err, clip(e.tenant), e.limit)
	}
	return fmt.Sprintf("%v: the credential is tenant %s's; %s names tenant %s", e.err, clip(e.tenant), e.by, clip(e.requested))
}

func (e *tenantError) Unwrap() error { return e.err }

// tenantMeta is a tenant error's ErrorInfo metadata: "tenant", and
// "requested" for a mismatch (each at most a tenant name's length: the
// request's was validated, the certificate's checked).
func tenantMeta(err error) map[string]string {
	var te *tenantError
	if !errors.As(err, &te) {
		return nil
	}
	m := map[string]string{"tenant": te.tenant}
	if te.requested != "" {
		m["requested"] = te.requested
	}
	return m
}

// fieldError is a request field that is not allowed.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func badField(field, format string, args ...any) error {
	return &fieldError{field: field, msg: fmt.Sprintf(format, args...)}
}

// toStatus is the one place where errors become gRPC statuses. Clients branch
// on the ErrorInfo reason, never on the message. A backend that could not be
// reached is UNAVAILABLE (BACKEND_UNAVAILABLE) even when its error wraps the
// context error of its own timeout; a context error passes through as its
// code when it is the caller's (ctx has ended) or has no other cause; anything
// unexpected is logged and becomes a generic INTERNAL.
func toStatus(ctx context.Context, log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	var (
		code   codes.Code
		reason admissionv1.ErrorReason
		fe     *fieldError
		meta   map[string]string
	)
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err // already a status: gRPC's own, from a stream's Send or Recv
	}
	switch {
	case errors.Is(err, gate.ErrUnavailable) && (ctx.Err() == nil || !contextError(err)):
		// Before the context errors: a deadline of the backend's own is not
		// the caller's while the caller's context lives.
		log.WarnContext(ctx, "backend unavailable", "err", err)
		code, reason = codes.Unavailable, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE
	case contextError(err):
		return status.FromContextError(err).Err()
	case errors.As(err, &fe):
		code, reason, meta = codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_INVALID_FIELD, map[string]string{"field": fe.field}
	case errors.Is(err, errUnknownScope):
		code, reason = codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_SCOPE
	case errors.Is(err, errUnknownCall):
		code, reason = codes.NotFound, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_CALL
	case errors.Is(err, errTooManyCalls):
		code, reason = codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TOO_MANY_CALLS
	case errors.Is(err, errTooManyWatchers):
		code, reason = codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TOO_MANY_WATCHERS
	case errors.Is(err, errUnauthenticated):
		code, reason = codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED
	case errors.Is(err, errPermissionDenied):
		code, reason = codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED
	case errors.Is(err, errTenantMismatch):
		code, reason, meta = codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_TENANT_MISMATCH, tenantMeta(err)
	case errors.Is(err, errTenantTooManyCalls):
		code, reason, meta = codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TENANT_TOO_MANY_CALLS, tenantMeta(err)
	case errors.Is(err, policy.ErrUnknownSource):
		code, reason = codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_UNKNOWN_SOURCE
	case errors.Is(err, policy.ErrEstimateTooLarge):
		code, reason, meta = codes.InvalidArgument, admissionv1.ErrorReason_ERROR_REASON_ESTIMATE_TOO_LARGE, map[string]string{"field": "estimated_tokens"}
	case errors.Is(err, policy.ErrCallEnded):
		code, reason = codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_CALL_ENDED
	case errors.Is(err, policy.ErrPermitOutstanding):
		code, reason = codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_PERMIT_OUTSTANDING
	case errors.Is(err, policy.ErrPermitNotOfCall):
		code, reason, meta = codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_PERMIT_NOT_OF_CALL, map[string]string{"field": "permit_id"}
	case errors.Is(err, policy.ErrNoRefusal):
		code, reason = codes.FailedPrecondition, admissionv1.ErrorReason_ERROR_REASON_NO_REFUSAL
	case errors.Is(err, errPanic):
		return withInfo(status.New(codes.Internal, "internal error"), admissionv1.ErrorReason_ERROR_REASON_INTERNAL, nil)
	default:
		log.ErrorContext(ctx, "internal error", "err", err)
		return withInfo(status.New(codes.Internal, "internal error"), admissionv1.ErrorReason_ERROR_REASON_INTERNAL, nil)
	}
	msg := message(err)
	st := status.New(code, msg)
	if field := meta["field"]; code == codes.InvalidArgument && field != "" {
		st = withDetails(st, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}})
	}
	return withInfo(st, reason, meta)
}

// reasonOf is the ErrorInfo reason toStatus gives err, for an answer that
// says which error enforcement would have answered (a shadow grant's
// shadow_error) without being that error.
func reasonOf(ctx context.Context, log *slog.Logger, err error) admissionv1.ErrorReason {
	st, _ := status.FromError(toStatus(ctx, log, err))
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return admissionv1.ErrorReason(admissionv1.ErrorReason_value[info.GetReason()])
		}
	}
	return admissionv1.ErrorReason_ERROR_REASON_UNSPECIFIED
}

func contextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func withInfo(st *status.Status, reason admissionv1.ErrorReason, meta map[string]string) error {
	return withDetails(st, &errdetails.ErrorInfo{Reason: reason.String(), Domain: ErrorDomain, Metadata: meta}).Err()
}

func withDetails(st *status.Status, d ...protoadapt.MessageV1) *status.Status {
	out, err := st.WithDetails(d...)
	if err != nil {
		return st
	}
	return out
}

// clipBytes is how much of an input a status message or a log line shows.
const clipBytes = 64

// clip shows an input in a status message or a log line: quoted and escaped,
// cut to its first clipBytes bytes with its length when longer, so that no
// answer or log line carries more than a short prefix of what a client sent.
func clip(s string) string {
	if len(s) <= clipBytes {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q…(%d bytes)", s[:clipBytes], len(s))
}

// maxMessage bounds a status message, whatever error it comes from.
const maxMessage = 512

func message(err error) string {
	msg := err.Error()
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
	}
	return msg
}

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
