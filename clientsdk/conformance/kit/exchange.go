// Package kit is polygate's SDK conformance kit: the format of its scripted
// exchanges (README.md beside this package's directory), their loading and
// validation, and the scripted fake sidecar that serves one exchange at a
// time (Fake), which each SDK's runner drives.
package kit

import "encoding/json"

// Exchange is one scripted conversation between an SDK and the sidecar.
type Exchange struct {
	Name  string `json:"name"`
	About string `json:"about"`
	// Scope of every call (default "chat").
	Scope  string     `json:"scope,omitempty"`
	Client ClientSpec `json:"client,omitzero"`
	// Calls are what the application does, in order, with one client.
	Calls []Call `json:"calls"`
	// Script is every event the fake expects, in order: the SDK's RPCs and
	// the attempts that reach the upstream, with the fake's replies.
	Script []Step `json:"script"`
}

// ClientSpec configures the SDK's client.
type ClientSpec struct {
	// OnSidecarUnavailable is "fail" (the default) or "allow".
	OnSidecarUnavailable string `json:"on_sidecar_unavailable,omitempty"`
	// Fallback is the source an "allow" client calls for the scope before any grant.
	Fallback *FallbackSpec `json:"fallback,omitempty"`
	// Priority and Tenant are the client's defaults.
	Priority int32  `json:"priority,omitempty"`
	Tenant   string `json:"tenant,omitempty"`
	// Token is the client's bearer token: every RPC must carry
	// "authorization: Bearer <token>" (none when empty).
	Token string `json:"token,omitempty"`
	// TLS: "tls" serves the sidecar over TLS, "mtls" also requires a client
	// certificate; the runner gives its client the PEMs of Endpoints.TLS.
	TLS string `json:"tls,omitempty"`
}

// FallbackSpec names the fallback source; its base_url is the fake upstream's
// route of that name.
type FallbackSpec struct {
	Source string `json:"source"`
}

// Call is one request of the application and what it must see.
type Call struct {
	// SidecarDown: the runner stops the fake's sidecar before this call.
	SidecarDown bool       `json:"sidecar_down,omitempty"`
	Request     AppRequest `json:"request"`
	Options     AppOptions `json:"options,omitzero"`
	// AbortAfter: the application gives the call up (aborts, cancels) once
	// the fake has seen this many events of the exchange; 0: never.
	AbortAfter int     `json:"abort_after,omitempty"`
	AppSees    AppSees `json:"app_sees"`
}

// AppRequest is the application's HTTP request, against the placeholder
// http://polygate.invalid (the SDK points each attempt at the granted source).
type AppRequest struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
}

// AppOptions are the call's options.
type AppOptions struct {
	EstimatedTokens int64   `json:"estimated_tokens,omitempty"`
	DeadlineMs      int64   `json:"deadline_ms,omitempty"`
	Priority        *int32  `json:"priority,omitempty"`
	Tenant          *string `json:"tenant,omitempty"`
}

// AppSees is what the application finally sees: a response, or an error.
type AppSees struct {
	// Error: "aborted" (the application's own abort or cancellation) or
	// "unavailable" (the SDK's error for a sidecar that cannot be reached or
	// answers UNAVAILABLE); empty when the application gets a response.
	Error  string `json:"error,omitempty"`
	Status int    `json:"status,omitempty"`
	// Headers the response must carry with these values; null: must not carry.
	Headers map[string]*string `json:"headers,omitempty"`
	// Body is the exact body; BodyJSON values at dotted paths of a JSON body.
	Body     *string        `json:"body,omitempty"`
	BodyJSON map[string]any `json:"body_json,omitempty"`
}

// Step is one event the fake expects: an RPC (RPC set) or an attempt that
// reaches the upstream (Upstream set: the source's route), the request the
// SDK must send and the fake's reply. AfterMs is the least time since the
// previous step's reply (or, for one that hangs, its arrival): a sleep the
// SDK must have made.
type Step struct {
	RPC      string          `json:"rpc,omitempty"`
	Upstream string          `json:"upstream,omitempty"`
	AfterMs  int64           `json:"after_ms,omitempty"`
	Request  json.RawMessage `json:"request,omitempty"`
	Reply    json.RawMessage `json:"reply,omitempty"`

	want  any // *PickWant, *RecordWant, *UpstreamWant or nil
	reply any // *PickReply, *OnNoRunnableReply, *RecordReply, *CancelReply or *UpstreamReply
}

// PickWant is what a Pick must carry. Opens: it opens the call (call_id
// empty); otherwise it carries the call's id and nothing else.
type PickWant struct {
	Opens           bool   `json:"opens,omitempty"`
	EstimatedTokens int64  `json:"estimated_tokens,omitempty"`
	Priority        int32  `json:"priority,omitempty"`
	Tenant          string `json:"tenant,omitempty"`
	// DeadlineMsAtMost: the deadline is set, above 0 and at most this; 0:
	// no deadline.
	DeadlineMsAtMost int64 `json:"deadline_ms_at_most,omitempty"`
}

// RecordWant is what a RecordOutcome must carry besides the call's id and
// the last grant's permit id.
type RecordWant struct {
	Outcome          string `json:"outcome"`
	HTTPStatus       int32  `json:"http_status,omitempty"`
	RetryAfterHintMs int64  `json:"retry_after_hint_ms,omitempty"`
	// ActualTokens: set to this; null or absent: unset.
	ActualTokens *int64 `json:"actual_tokens,omitempty"`
}

// UpstreamWant is what an attempt's HTTP request must be, where given.
type UpstreamWant struct {
	Method string `json:"method,omitempty"`
	// Path is the path and query after the source's route.
	Path    string            `json:"path,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    *string           `json:"body,omitempty"`
}

// ErrorReply is a gRPC error; Reason, when set, is attached as the
// sidecar's google.rpc.ErrorInfo (an UNAVAILABLE without one is what an
// SDK sees of a sidecar it cannot reach).
type ErrorReply struct {
	Code    string `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Reason is one source's refusal.
type Reason struct {
	Source       string `json:"source"`
	Reason       string `json:"reason"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// FailureReply is a verdict.
type FailureReply struct {
	Reason       string   `json:"reason"`
	RetryAfterMs int64    `json:"retry_after_ms,omitempty"`
	Reasons      []Reason `json:"reasons,omitempty"`
}

// GrantReply is a permit; the fake numbers permits and attempts, and the
// base_url attribute is the fake upstream's route of the source unless
// Attributes sets it.
type GrantReply struct {
	Source     string            `json:"source"`
	Attributes map[string]string `json:"attributes,omitempty"`
	TimeoutMs  int64             `json:"timeout_ms,omitempty"`
	Probe      bool              `json:"probe,omitempty"`
}

// ErrorOrHang are the replies every RPC may have instead of its answers: a
// gRPC error, or none at all until the client gives up (Hang).
type ErrorOrHang struct {
	Error *ErrorReply `json:"error,omitempty"`
	Hang  bool        `json:"hang,omitempty"`
}

func (e *ErrorOrHang) errorOrHang() *ErrorOrHang { return e }

// rpcReply is an RPC step's reply, each of which embeds ErrorOrHang.
type rpcReply interface{ errorOrHang() *ErrorOrHang }

// PickReply is a Pick's answer: exactly one of its fields.
type PickReply struct {
	Grant      *GrantReply `json:"grant,omitempty"`
	NoRunnable *struct {
		GateRejections int32    `json:"gate_rejections,omitempty"`
		Reasons        []Reason `json:"reasons,omitempty"`
	} `json:"no_runnable,omitempty"`
	Failure *FailureReply `json:"failure,omitempty"`
	ErrorOrHang
}

// OnNoRunnableReply is an OnNoRunnable's answer: exactly one of its fields.
type OnNoRunnableReply struct {
	Wait *struct {
		SleepMs int64 `json:"sleep_ms,omitempty"`
	} `json:"wait,omitempty"`
	Failure *FailureReply `json:"failure,omitempty"`
	ErrorOrHang
}

// RecordReply is a RecordOutcome's answer: exactly one of its fields.
type RecordReply struct {
	Done  *struct{} `json:"done,omitempty"`
	Retry *struct {
		BackoffMs int64 `json:"backoff_ms,omitempty"`
	} `json:"retry,omitempty"`
	Failure *FailureReply `json:"failure,omitempty"`
	ErrorOrHang
}

// CancelReply is a CancelCall's answer (default: ended_now true).
type CancelReply struct {
	NotEnded bool `json:"not_ended,omitempty"`
	ErrorOrHang
}

// UpstreamReply is the upstream's answer. Body defaults to an OpenAI-style
// completion ("ok from SOURCE", usage.total_tokens 8) for a 2xx and an
// OpenAI-style error otherwise, as application/json; Stream sends its chunks
// one by one as text/event-stream instead.
type UpstreamReply struct {
	Status  int               `json:"status,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    *string           `json:"body,omitempty"`
	Stream  []string          `json:"stream,omitempty"`
	Hang    bool              `json:"hang,omitempty"`
}
