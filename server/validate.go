package server

import (
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// maxDetail bounds RecordOutcomeRequest.detail; maxOperatorText bounds an
// override's actor and reason.
const (
	maxDetail       = 1024
	maxOperatorText = 256
)

// validate checks a request's fields before its handler runs; the
// validation interceptor calls it for every method of the service. Each
// error names the field, the value and what is allowed.
func validate(req any) error {
	switch r := req.(type) {
	case *admissionv1.PickRequest:
		if err := needScope(r.GetScope()); err != nil {
			return err
		}
		if r.GetEstimatedTokens() < 0 {
			return badField("estimated_tokens", "%d is not allowed; must be at least 0", r.GetEstimatedTokens())
		}
		return nonNegative("deadline", r.GetDeadline())
	case *admissionv1.OnNoRunnableRequest:
		return needCall(r.GetScope(), r.GetCallId())
	case *admissionv1.CancelCallRequest:
		return needCall(r.GetScope(), r.GetCallId())
	case *admissionv1.RecordOutcomeRequest:
		if err := needCall(r.GetScope(), r.GetCallId()); err != nil {
			return err
		}
		if r.GetPermitId() == "" {
			return badField("permit_id", "is empty; pass the permit_id of the call's Grant")
		}
		if _, ok := outcomes[r.GetOutcome()]; !ok {
			return badField("outcome", "%v is not allowed; one of SUCCESS, TRANSIENT, RATE_LIMITED, SOURCE_DEAD, CLIENT_ERROR, CANCELLED", r.GetOutcome())
		}
		if err := nonNegative("retry_after_hint", r.GetRetryAfterHint()); err != nil {
			return err
		}
		if r.ActualTokens != nil && r.GetActualTokens() < 0 {
			return badField("actual_tokens", "%d is not allowed; must be at least 0 (leave it unset to keep the estimate)", r.GetActualTokens())
		}
		if s := r.GetHttpStatus(); s != 0 && (s < 100 || s > 599) {
			return badField("http_status", "%d is not allowed; 0 (none) or 100..599", s)
		}
		if len(r.GetDetail()) > maxDetail {
			return badField("detail", "is %d bytes; at most %d are allowed", len(r.GetDetail()), maxDetail)
		}
	case *admissionv1.RetryAfterRequest:
		return needScope(r.GetScope())
	case *admissionv1.DescribeScopeRequest:
		return needScope(r.GetScope())
	case *admissionv1.OverrideBreakerRequest:
		if err := needScope(r.GetScope()); err != nil {
			return err
		}
		if r.GetSource() == "" {
			return badField("source", "is empty; name a source of the scope")
		}
		if _, ok := actions[r.GetAction()]; !ok {
			return badField("action", "%v is not allowed; one of FORCE_OPEN, FORCE_CLOSED, DISABLE, CLEAR, RESET", r.GetAction())
		}
		for field, v := range map[string]string{"actor": r.GetActor(), "reason": r.GetReason()} {
			if v == "" || len(v) > maxOperatorText {
				return badField(field, "%q is not allowed; say who and why in 1 to %d bytes", v, maxOperatorText)
			}
		}
	}
	return nil
}

func needScope(scope string) error {
	if scope == "" {
		return badField("scope", "is empty; name a configured scope")
	}
	return nil
}

func needCall(scope, id string) error {
	if err := needScope(scope); err != nil {
		return err
	}
	if id == "" {
		return badField("call_id", "is empty; pass the call_id of the call's first Pick")
	}
	return nil
}

func nonNegative(field string, d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return badField(field, "%v", err)
	}
	if d.AsDuration() < 0 {
		return badField(field, "%v is not allowed; must be at least 0", d.AsDuration())
	}
	return nil
}
