package polygate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers that carry polygate's verdict on a response Transport returns for
// a call that ended on one; Polygate-Call-Id is on every governed response.
const (
	HeaderFailureReason = "Polygate-Failure-Reason"
	HeaderRetryAfter    = "Polygate-Retry-After"
	HeaderCallID        = "Polygate-Call-Id"
)

// ErrorType is the "type" of the JSON error of a synthesized response.
const ErrorType = "polygate_error"

type failureKey struct{}

// FailureOf returns the sidecar's verdict that a response of Transport stands
// for: the call ended on it, with the upstream's own response or, when no
// upstream answered, a synthesized one. ok is false for any other response
// (a success, an ungoverned attempt's). With openai-go, the response is the
// *openai.Error's Response.
func FailureOf(resp *http.Response) (failure *FailureError, ok bool) {
	if resp == nil || resp.Request == nil {
		return nil, false
	}
	failure, ok = resp.Request.Context().Value(failureKey{}).(*FailureError)
	return failure, ok
}

// withFailure marks resp as standing for failure: its verdict headers, and
// the verdict for FailureOf.
func withFailure(resp *http.Response, req *http.Request, failure *FailureError) *http.Response {
	if resp.Header == nil {
		resp.Header = make(http.Header)
	}
	resp.Header.Set(HeaderFailureReason, failure.reasonName())
	resp.Header.Set(HeaderRetryAfter, secondsText(millis(failure.RetryAfter)))
	if failure.CallID != "" {
		resp.Header.Set(HeaderCallID, failure.CallID)
	}
	if resp.Request != nil {
		req = resp.Request
	}
	resp.Request = req.WithContext(context.WithValue(req.Context(), failureKey{}, failure))
	return resp
}

// synthesized is the response that stands for a verdict no upstream
// answered: 503 (429 for a quota or budget reason) with an OpenAI-style
// JSON error that names polygate's reason and when to retry, so that a
// provider SDK raises its usual status error, never a connection error.
func synthesized(req *http.Request, failure *FailureError) *http.Response {
	reason := failure.reasonName()
	ms := millis(failure.RetryAfter)
	type source struct {
		Source      string  `json:"source"`
		Reason      string  `json:"reason"`
		RetryAfterS float64 `json:"retry_after_s"`
	}
	per := make([]source, 0, len(failure.PerSource))
	for _, s := range failure.PerSource {
		per = append(per, source{s.Source, s.Reason, float64(millis(s.RetryAfter)) / 1000})
	}
	var doc struct {
		Error struct {
			Message  string  `json:"message"`
			Type     string  `json:"type"`
			Code     string  `json:"code"`
			Param    *string `json:"param"`
			Polygate struct {
				Reason      string   `json:"reason"`
				RetryAfterS float64  `json:"retry_after_s"`
				Scope       string   `json:"scope"`
				CallID      string   `json:"call_id"`
				Attempts    int      `json:"attempts"`
				PerSource   []source `json:"per_source"`
			} `json:"polygate"`
		} `json:"error"`
	}
	e := &doc.Error
	e.Message, e.Type, e.Code = failure.message(), ErrorType, reason
	e.Polygate.Reason, e.Polygate.RetryAfterS, e.Polygate.Scope = reason, float64(ms)/1000, failure.Scope
	e.Polygate.CallID, e.Polygate.Attempts, e.Polygate.PerSource = failure.CallID, failure.Attempts, per
	body, _ := json.Marshal(doc) // strings, numbers and slices of them: no error
	code := statusFor(reason)
	resp := &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
	}
	if ms > 0 {
		resp.Header.Set("Retry-After", strconv.FormatInt((ms+999)/1000, 10))
	}
	return withFailure(resp, req, failure)
}

// statusFor is a synthesized response's status: 429 when the scope's or a
// tenant's capacity said no (quota_exhausted, or a budget), else 503.
func statusFor(reason string) int {
	if reason == "quota_exhausted" || strings.Contains(reason, "budget") {
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable
}

// reasonName is the reason as the API names it, "unknown" for none.
func (e *FailureError) reasonName() string {
	if s, ok := failureNames[e.Reason]; ok {
		return s
	}
	return "unknown"
}

// message is a synthesized response's error message: the reason, the
// scope, when to retry (when there is a certain time), the call and each
// source's refusal.
func (e *FailureError) message() string {
	var b strings.Builder
	fmt.Fprintf(&b, "polygate: %s in scope %s", e.reasonName(), e.Scope)
	if ms := millis(e.RetryAfter); ms > 0 {
		fmt.Fprintf(&b, ", retry after %ss", secondsText(ms))
	}
	if e.CallID != "" {
		fmt.Fprintf(&b, " (call %s)", e.CallID)
	}
	for i, s := range e.PerSource {
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s %s", sep, s.Source, s.Reason)
		if ms := millis(s.RetryAfter); ms > 0 {
			fmt.Fprintf(&b, " %ss", secondsText(ms))
		}
	}
	return b.String()
}

// millis is d in whole milliseconds, rounded up (never early), never
// negative.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// secondsText is ms as seconds with exactly three decimals: 2 ms is 0.002.
func secondsText(ms int64) string {
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}
