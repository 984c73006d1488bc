package kit

import (
	"context"
	"fmt"
	"maps"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Proto names of the format's reasons and codes.
var (
	failureReasons = map[string]admissionv1.FailureReason{
		"circuit_open": admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN, "quota_exhausted": admissionv1.FailureReason_FAILURE_REASON_QUOTA_EXHAUSTED,
		"stalled": admissionv1.FailureReason_FAILURE_REASON_STALLED, "retry_exhausted": admissionv1.FailureReason_FAILURE_REASON_RETRY_EXHAUSTED,
		"non_retryable": admissionv1.FailureReason_FAILURE_REASON_NON_RETRYABLE, "deadline_exceeded": admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED,
		"cancelled": admissionv1.FailureReason_FAILURE_REASON_CANCELLED, "retry_after_too_long": admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG,
		"source_dead": admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD, "scope_removed": admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED,
		"budget_exhausted": admissionv1.FailureReason_FAILURE_REASON_BUDGET_EXHAUSTED,
	}
	refusalReasons = map[string]admissionv1.Reason{
		"cooldown": admissionv1.Reason_REASON_COOLDOWN, "circuit_open": admissionv1.Reason_REASON_CIRCUIT_OPEN,
		"probe_in_flight": admissionv1.Reason_REASON_PROBE_IN_FLIGHT, "forced_open": admissionv1.Reason_REASON_FORCED_OPEN,
		"adaptive_paced": admissionv1.Reason_REASON_ADAPTIVE_PACED, "rate_limited": admissionv1.Reason_REASON_RATE_LIMITED,
		"queued": admissionv1.Reason_REASON_QUEUED, "tenant_limit": admissionv1.Reason_REASON_TENANT_LIMIT,
		"tenant_budget": admissionv1.Reason_REASON_TENANT_BUDGET,
	}
	outcomeNames = map[admissionv1.Outcome]string{
		admissionv1.Outcome_OUTCOME_SUCCESS: "SUCCESS", admissionv1.Outcome_OUTCOME_TRANSIENT: "TRANSIENT",
		admissionv1.Outcome_OUTCOME_RATE_LIMITED: "RATE_LIMITED", admissionv1.Outcome_OUTCOME_SOURCE_DEAD: "SOURCE_DEAD",
		admissionv1.Outcome_OUTCOME_CLIENT_ERROR: "CLIENT_ERROR", admissionv1.Outcome_OUTCOME_CANCELLED: "CANCELLED",
	}
	statusCodes = map[string]codes.Code{
		"INVALID_ARGUMENT": codes.InvalidArgument, "NOT_FOUND": codes.NotFound, "FAILED_PRECONDITION": codes.FailedPrecondition,
		"RESOURCE_EXHAUSTED": codes.ResourceExhausted, "UNAVAILABLE": codes.Unavailable, "UNAUTHENTICATED": codes.Unauthenticated,
		"INTERNAL": codes.Internal, "PERMISSION_DENIED": codes.PermissionDenied, "DEADLINE_EXCEEDED": codes.DeadlineExceeded,
	}
)

// hang holds an RPC until the client gives up or the exchange ends.
func hang(ctx context.Context, done chan struct{}) error {
	select {
	case <-ctx.Done():
	case <-done:
	}
	return status.Error(codes.Canceled, "conformance: the script hangs here")
}

func rpcErr(e *ErrorReply) error {
	st := status.New(statusCodes[e.Code], e.Message)
	if e.Reason != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.Reason, Domain: "polygate.dev"}); err == nil {
			st = d
		}
	}
	return st.Err()
}

func ms(n int64) *durationpb.Duration { return durationpb.New(time.Duration(n) * time.Millisecond) }

func failure(r *FailureReply) *admissionv1.Failure {
	return &admissionv1.Failure{Reason: failureReasons[r.Reason], RetryAfter: ms(r.RetryAfterMs), PerSourceReasons: reasons(r.Reasons)}
}

func reasons(rs []Reason) []*admissionv1.SourceReason {
	out := make([]*admissionv1.SourceReason, 0, len(rs))
	for _, r := range rs {
		out = append(out, &admissionv1.SourceReason{Source: r.Source, Reason: refusalReasons[r.Reason], RetryAfter: ms(r.RetryAfterMs)})
	}
	return out
}

// unexpected answers an RPC the script does not have at this point.
var unexpected = status.Error(codes.FailedPrecondition, "conformance: this RPC is not the script's next step")

// serve answers an RPC that arrive matched to step s (nil: it is not the
// script's): the step's reply hangs, fails with its error, or is answered
// by answer; the moment the reply leaves is marked.
func serve[R rpcReply, Resp any](ctx context.Context, f *Fake, s *Step, done chan struct{}, answer func(R) *Resp) (*Resp, error) {
	if s == nil {
		return nil, unexpected
	}
	r := s.reply.(R)
	e := r.errorOrHang()
	if e.Hang {
		return nil, hang(ctx, done)
	}
	defer f.replied()
	if e.Error != nil {
		return nil, rpcErr(e.Error)
	}
	return answer(r), nil
}

// admission is the scripted AdmissionService.
type admission struct {
	admissionv1.UnimplementedAdmissionServiceServer
	f *Fake
}

func (a *admission) Pick(ctx context.Context, req *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	f := a.f
	var callID, permit, up string
	var attempt int32
	s, done := f.arrive("Pick", "Pick", "", func(s *Step) []string {
		w := s.want.(*PickWant)
		var m []string
		if w.Opens {
			m = append(m, differ("call_id", req.GetCallId(), "")...)
		} else {
			m = append(m, differ("call_id", req.GetCallId(), f.callID)...)
		}
		m = append(m, differ("scope", req.GetScope(), f.ex.Scope)...)
		m = append(m, differ("estimated_tokens", req.GetEstimatedTokens(), w.EstimatedTokens)...)
		m = append(m, differ("priority", req.GetPriority(), w.Priority)...)
		m = append(m, differ("tenant", req.GetTenant(), w.Tenant)...)
		// In milliseconds (rounded up), which do not overflow for any Duration.
		d := req.GetDeadline()
		deadline := d.GetSeconds()*1000 + (int64(d.GetNanos())+999_999)/1_000_000
		switch {
		case w.DeadlineMsAtMost == 0 && deadline != 0:
			m = append(m, fmt.Sprintf("deadline = %d ms, want none", deadline))
		case w.DeadlineMsAtMost > 0 && (deadline <= 0 || deadline > w.DeadlineMsAtMost):
			m = append(m, fmt.Sprintf("deadline = %d ms, want in (0, %d ms]", deadline, w.DeadlineMsAtMost))
		}
		r := s.reply.(*PickReply)
		if w.Opens && r.Error == nil && !r.Hang {
			f.calls++
			f.callID, f.attempt = fmt.Sprintf("call-%d", f.calls), 0
		}
		if r.Grant != nil {
			f.permits++
			f.attempt++
			f.permit = fmt.Sprintf("permit-%d", f.permits)
		}
		callID, permit, attempt, up = f.callID, f.permit, f.attempt, f.upstream.URL
		return m
	})
	return serve(ctx, f, s, done, func(r *PickReply) *admissionv1.PickResponse {
		switch {
		case r.Grant != nil:
			attrs := map[string]string{"base_url": up + "/" + r.Grant.Source}
			maps.Copy(attrs, r.Grant.Attributes)
			g := &admissionv1.Grant{Source: r.Grant.Source, Attributes: attrs, PermitId: permit, Attempt: attempt, Probe: r.Grant.Probe,
				Lease: ms(r.Grant.TimeoutMs + 5000), Epoch: 1}
			if r.Grant.TimeoutMs > 0 {
				g.Timeout = ms(r.Grant.TimeoutMs)
			}
			return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_Grant{Grant: g}}
		case r.NoRunnable != nil:
			return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_NoRunnable{NoRunnable: &admissionv1.NoRunnable{
				GateRejections: r.NoRunnable.GateRejections, PerSourceReasons: reasons(r.NoRunnable.Reasons)}}}
		default:
			return &admissionv1.PickResponse{CallId: callID, Result: &admissionv1.PickResponse_Failure{Failure: failure(r.Failure)}}
		}
	})
}

func (a *admission) OnNoRunnable(ctx context.Context, req *admissionv1.OnNoRunnableRequest) (*admissionv1.OnNoRunnableResponse, error) {
	f := a.f
	s, done := f.arrive("OnNoRunnable", "OnNoRunnable", "", func(*Step) []string {
		return append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
	})
	return serve(ctx, f, s, done, func(r *OnNoRunnableReply) *admissionv1.OnNoRunnableResponse {
		if r.Wait != nil {
			return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Wait{Wait: &admissionv1.Wait{Sleep: ms(r.Wait.SleepMs)}}}
		}
		return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Failure{Failure: failure(r.Failure)}}
	})
}

func (a *admission) RecordOutcome(ctx context.Context, req *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	f := a.f
	s, done := f.arrive("RecordOutcome", "RecordOutcome", "", func(s *Step) []string {
		w := s.want.(*RecordWant)
		m := append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
		m = append(m, differ("permit_id", req.GetPermitId(), f.permit)...)
		m = append(m, differ("outcome", outcomeNames[req.GetOutcome()], w.Outcome)...)
		m = append(m, differ("http_status", req.GetHttpStatus(), w.HTTPStatus)...)
		hint := req.GetRetryAfterHint().AsDuration().Round(time.Millisecond).Milliseconds()
		m = append(m, differ("retry_after_hint_ms", hint, w.RetryAfterHintMs)...)
		switch {
		case w.ActualTokens == nil && req.ActualTokens != nil:
			m = append(m, fmt.Sprintf("actual_tokens = %d, want unset", req.GetActualTokens()))
		case w.ActualTokens != nil && req.ActualTokens == nil:
			m = append(m, fmt.Sprintf("actual_tokens unset, want %d", *w.ActualTokens))
		case w.ActualTokens != nil:
			m = append(m, differ("actual_tokens", req.GetActualTokens(), *w.ActualTokens)...)
		}
		f.permit = ""
		return m
	})
	return serve(ctx, f, s, done, func(r *RecordReply) *admissionv1.RecordOutcomeResponse {
		switch {
		case r.Done != nil:
			return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}
		case r.Retry != nil:
			return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Retry{Retry: &admissionv1.Retry{Backoff: ms(r.Retry.BackoffMs)}}}
		default:
			return &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Failure{Failure: failure(r.Failure)}}
		}
	})
}

func (a *admission) CancelCall(ctx context.Context, req *admissionv1.CancelCallRequest) (*admissionv1.CancelCallResponse, error) {
	f := a.f
	s, done := f.arrive("CancelCall", "CancelCall", "", func(*Step) []string {
		m := append(differ("scope", req.GetScope(), f.ex.Scope), differ("call_id", req.GetCallId(), f.callID)...)
		f.permit = ""
		return m
	})
	return serve(ctx, f, s, done, func(r *CancelReply) *admissionv1.CancelCallResponse {
		return &admissionv1.CancelCallResponse{EndedNow: !r.NotEnded}
	})
}
