package server

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Bounds of request fields, checked before anything is looked up (see
// docs/api.md, "Limits").
const (
	// maxDetail bounds RecordOutcomeRequest.detail; maxOperatorText bounds
	// an override's actor and reason.
	maxDetail       = 1024
	maxOperatorText = 256
	// maxID bounds call_id and permit_id: the sidecar mints ids far shorter.
	maxID = 64
	// MaxTokens bounds estimated_tokens and actual_tokens: far above any
	// model's context, far below where a minute's sum could wrap.
	MaxTokens = 1_000_000_000
	// maxDeadline bounds a call's deadline.
	maxDeadline = 365 * 24 * time.Hour
	// MaxRequestBytes is the largest request the sidecar decodes
	// (grpc.MaxRecvMsgSize): the largest valid request is a few KiB.
	MaxRequestBytes = 64 << 10
)

// validate checks a request's fields before its handler runs; the
// validation interceptor calls it for every method of the service. Each
// error names the field, the value (an escaped prefix of it) and what is
// allowed.
func validate(req any) error {
	if field, ok := undecodable(req); ok {
		return badField(field, "does not decode: a string that is not valid UTF-8, or malformed bytes")
	}
	switch r := req.(type) {
	case *admissionv1.PickRequest:
		if err := needScope(r.GetScope()); err != nil {
			return err
		}
		if id := r.GetCallId(); id != "" {
			if err := boundID("call_id", id); err != nil {
				return err
			}
		}
		if err := tokens("estimated_tokens", r.GetEstimatedTokens()); err != nil {
			return err
		}
		if err := nonNegative("deadline", r.GetDeadline()); err != nil {
			return err
		}
		if d := r.GetDeadline().AsDuration(); d > maxDeadline {
			return badField("deadline", "%v is not allowed; at most %v", d, maxDeadline)
		}
		if t := r.GetTenant(); t != "" && !config.ValidName(t) {
			return badField("tenant", "%s is not allowed; a tenant is 1 to %d bytes of a-z, 0-9, '_' or '-', starting with a letter or digit", clip(t), config.MaxName)
		}
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
		if err := boundID("permit_id", r.GetPermitId()); err != nil {
			return err
		}
		if _, ok := outcomes[r.GetOutcome()]; !ok {
			return badField("outcome", "%v is not allowed; one of SUCCESS, TRANSIENT, RATE_LIMITED, SOURCE_DEAD, CLIENT_ERROR, CANCELLED", r.GetOutcome())
		}
		// Any hint is taken; the scope's caps bound what it does.
		if err := nonNegative("retry_after_hint", r.GetRetryAfterHint()); err != nil {
			return err
		}
		if r.ActualTokens != nil {
			if err := tokens("actual_tokens", r.GetActualTokens()); err != nil {
				return err
			}
		}
		if s := r.GetHttpStatus(); s != 0 && (s < 100 || s > 599) {
			return badField("http_status", "%d is not allowed; 0 (none) or 100..599", s)
		}
		if len(r.GetDetail()) > maxDetail {
			return badField("detail", "is %d bytes; at most %d are allowed", len(r.GetDetail()), maxDetail)
		}
	case *admissionv1.RetryAfterRequest:
		if err := needScope(r.GetScope()); err != nil {
			return err
		}
		// The scope's own bound (its number of sources) is checked by the
		// handler; this one keeps a request from naming more than any scope
		// could have.
		if n := len(r.GetSources()); n > maxSourcesPerRequest {
			return badField("sources", "names %d sources; at most %d are allowed", n, maxSourcesPerRequest)
		}
		for _, name := range r.GetSources() {
			if err := boundName("sources", name); err != nil {
				return err
			}
		}
	case *admissionv1.DescribeScopeRequest:
		return needScope(r.GetScope())
	case *admissionv1.OverrideBreakerRequest:
		if err := needScope(r.GetScope()); err != nil {
			return err
		}
		if r.GetSource() == "" {
			return badField("source", "is empty; name a source of the scope")
		}
		if err := boundName("source", r.GetSource()); err != nil {
			return err
		}
		if _, ok := actions[r.GetAction()]; !ok {
			return badField("action", "%v is not allowed; one of FORCE_OPEN, FORCE_CLOSED, DISABLE, CLEAR, RESET", r.GetAction())
		}
		for field, v := range map[string]string{"actor": r.GetActor(), "reason": r.GetReason()} {
			if v == "" || len(v) > maxOperatorText {
				return badField(field, "%s is not allowed; say who and why in 1 to %d bytes", clip(v), maxOperatorText)
			}
		}
	case *admissionv1.WatchEventsRequest:
		if s := r.GetScope(); s != "" {
			return boundName("scope", s)
		}
	}
	return nil
}

// maxSourcesPerRequest bounds RetryAfterRequest.sources before the scope is
// known; the handler then bounds it by the scope's sources.
const maxSourcesPerRequest = 256

// checkSources refuses a RetryAfter source list that names a source twice or
// more sources than the scope has: a repeated name would make the sidecar
// (and a shared backend) read the same source again for each copy.
func checkSources(names []string, sources int) error {
	if len(names) > sources {
		return badField("sources", "names %d sources; the scope has %d", len(names), sources)
	}
	seen := make(map[string]struct{}, len(names))
	for _, n := range names {
		if _, dup := seen[n]; dup {
			return badField("sources", "names %s twice; name each source at most once", clip(n))
		}
		seen[n] = struct{}{}
	}
	return nil
}

func needScope(scope string) error {
	if scope == "" {
		return badField("scope", "is empty; name a configured scope")
	}
	return boundName("scope", scope)
}

func needCall(scope, id string) error {
	if err := needScope(scope); err != nil {
		return err
	}
	if id == "" {
		return badField("call_id", "is empty; pass the call_id of the call's first Pick")
	}
	return boundID("call_id", id)
}

// boundName refuses a scope or source name longer than any configured one.
func boundName(field, name string) error {
	if len(name) > config.MaxName {
		return badField(field, "%s is not allowed; names are at most %d bytes", clip(name), config.MaxName)
	}
	return nil
}

// boundID refuses an id longer than any the sidecar mints.
func boundID(field, id string) error {
	if len(id) > maxID {
		return badField(field, "%s is not allowed; ids are at most %d bytes", clip(id), maxID)
	}
	return nil
}

func tokens(field string, n int64) error {
	if n < 0 || n > MaxTokens {
		return badField(field, "%d is not allowed; 0 to %d", n, MaxTokens)
	}
	return nil
}

func nonNegative(field string, d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return badField(field, "is not a valid duration (seconds %d, nanos %d)", d.GetSeconds(), d.GetNanos())
	}
	if d.AsDuration() < 0 {
		return badField(field, "%v is not allowed; must be at least 0", d.AsDuration())
	}
	return nil
}
