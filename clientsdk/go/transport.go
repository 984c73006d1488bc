package polygate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Bounds of what Transport reads into memory.
const (
	// DefaultMaxRequestBody bounds a request body Transport buffers to replay
	// it on another attempt (when the request has no GetBody).
	DefaultMaxRequestBody = 32 << 20
	// maxErrorBody is how much of a non-2xx body is read to classify it
	// (insufficient_quota, retryDelay); the caller still gets all of it.
	maxErrorBody = 64 << 10
	// maxUsageBody is the largest JSON 2xx body read to find its token usage;
	// a larger one is passed through and its attempt keeps the estimate.
	maxUsageBody = 4 << 20
)

// ErrProviderRetry is returned by Transport for a request that a provider
// SDK retried on its own (it says so in X-Stainless-Retry-Count): polygate is
// the one retry layer, so the provider SDK's retries must be off.
var ErrProviderRetry = errors.New("polygate: the provider SDK retried a request itself; turn its retries off (openai-go: option.WithMaxRetries(0)), the sidecar decides every retry")

// Transport is an http.RoundTripper that governs every request of an
// http.Client as one call of Scope: for each attempt it asks the sidecar for
// a source, points the request at it, sends it with Base, classifies the
// response (Classify), reports the outcome with the token usage of an
// OpenAI-style JSON body (usage.total_tokens), and retries, fails over or
// waits as the sidecar answers. One client.Do(req) may thus be several
// upstream requests: a 503 from one source fails over to another inside it.
//
// The request contract: write requests against any host (by convention
// http://polygate.invalid) with the path relative to the provider's base URL,
// e.g. POST http://polygate.invalid/chat/completions. For each attempt the
// granted source's base_url attribute (an absolute URL, e.g.
// https://api.openai.com/v1) replaces the scheme and host, and its path is
// joined in front of the request's: https://api.openai.com/v1/chat/completions.
// The query, headers and body are kept; Prepare then sets what differs per
// source (its API key, from the application's own secrets). A source without
// a usable base_url fails the call as CLIENT_ERROR.
//
// Bodies: a request body is replayed for each attempt with GetBody (set by
// http.NewRequest for bytes, strings and bytes.Buffer readers); without
// GetBody it is read into memory once, up to MaxRequestBody bytes. The
// response the caller gets is the attempt's own, its body unread: Transport
// reads at most 64 KiB of a non-2xx body and up to 4 MiB of a JSON 2xx body
// (not of a stream such as text/event-stream) and gives the caller the same
// bytes. The request's context bounds the call and its waits, and each
// attempt also ends after the source's timeout (until its response headers
// and the part of the body Transport reads).
//
// Answers: the client gets a response whenever the call ended on an upstream
// answer or on a verdict, so a provider SDK raises its own status error:
// a 2xx (with Polygate-Call-Id); for a verdict, the last attempt's own
// response (a dead key's 401, a 400, the last 5xx or 429 when retries are
// spent) with the verdict's headers (Polygate-Failure-Reason,
// Polygate-Retry-After, Polygate-Call-Id); and when no upstream answered
// (every source open, stalled, a quota), a synthesized 503, or 429 for a
// quota or budget reason, whose OpenAI-style JSON error names polygate's
// reason and when to retry. FailureOf reads the verdict back from either.
// An error is returned only when there is no answer at all: the sidecar's
// gRPC errors (*StatusError), the request's context, a body that cannot be
// replayed. Under SidecarAllow, an attempt made without the sidecar returns
// the upstream's answer as it came.
//
// Warning: turn the provider SDK's own retries off (openai-go:
// option.WithMaxRetries(0); openai-python: max_retries=0), so that the
// sidecar is the one retry layer: a request retried by the SDK is refused
// with ErrProviderRetry.
type Transport struct {
	// Client is the sidecar's client and Scope the scope of every request.
	Client *Client
	Scope  string
	// Base sends each attempt's request; http.DefaultTransport when nil. It
	// must not retry on its own.
	Base http.RoundTripper
	// Prepare, when set, adjusts each attempt's request after it was pointed
	// at the granted source, e.g. to set that source's API key. An error
	// ends the call as CLIENT_ERROR.
	Prepare func(req *http.Request, a Attempt) error
	// Options are the CallOptions of every call, e.g. WithEstimatedTokens.
	Options []CallOption
	// MaxRequestBody bounds a request body buffered for replay (one without
	// GetBody); DefaultMaxRequestBody when 0.
	MaxRequestBody int64
}

// RoundTrip governs req as one call of t.Scope (see Transport).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeReqBody := func() {
		if req.Body != nil {
			req.Body.Close()
		}
	}
	if n := req.Header.Get("X-Stainless-Retry-Count"); n != "" && n != "0" {
		closeReqBody()
		return nil, ErrProviderRetry
	}
	getBody, err := t.replayable(req)
	if err != nil {
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	var last *sent // the previous attempt's response, closed when superseded
	resp, err := Do(req.Context(), t.Client, t.Scope, func(ctx context.Context, a Attempt) (*sent, Result) {
		if last != nil {
			last.close()
			last = nil
		}
		last = t.attempt(ctx, base, req, getBody, a)
		return last, last.result
	}, t.Options...)
	var failure *FailureError
	switch {
	case resp != nil && resp.resp != nil && (err == nil || resp.result.Outcome == Success):
		// A success is the caller's even when its report failed: the
		// upstream did the work.
		if resp.callID != "" {
			resp.resp.Header.Set(HeaderCallID, resp.callID)
		}
		return resp.resp, nil
	case errors.As(err, &failure) && (resp == nil || resp.unsent == nil):
		if resp != nil && resp.resp != nil {
			return withFailure(resp.resp, req, failure), nil // the upstream's own words
		}
		if resp != nil {
			resp.close()
		}
		return synthesized(req, failure), nil
	case resp != nil && resp.resp != nil && t.Client.watch.mode == SidecarAllow && unreachable(err):
		return resp.resp, nil // an ungoverned attempt's answer, as it came
	}
	if resp != nil {
		resp.close()
		if resp.unsent != nil {
			err = fmt.Errorf("polygate: %w (%w)", resp.unsent, err)
		}
	}
	if err == nil {
		err = fmt.Errorf("polygate: call of scope %s ended without a response: %s", t.Scope, resp.result.Detail)
	}
	return nil, err
}

// replayable returns a function that gives a fresh copy of req's body for
// each attempt, buffering the body when req has no GetBody.
func (t *Transport) replayable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return func() (io.ReadCloser, error) { return http.NoBody, nil }, nil
	}
	if req.GetBody != nil {
		req.Body.Close() // every attempt reads its own copy
		return req.GetBody, nil
	}
	limit := t.MaxRequestBody
	if limit <= 0 {
		limit = DefaultMaxRequestBody
	}
	defer req.Body.Close()
	body, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("polygate: reading the request body to replay it: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("polygate: request body larger than Transport.MaxRequestBody (%d bytes) and not replayable (no GetBody); raise the limit or use a bytes or strings reader", limit)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }, nil
}

// sent is one attempt's response and its classification. The request ends
// with the attempt's context (the source's timeout) until the attempt has
// its response; from then on it lives until the response is closed, so that
// the caller can read the rest of the body after the attempt returned.
type sent struct {
	resp   *http.Response
	result Result
	cancel context.CancelFunc // cancels the request
	callID string
	// unsent is why the request could not be made (no usable base_url,
	// Prepare's error, the body's): the call's end is then an error, not a
	// response standing for a verdict.
	unsent error
}

func (s *sent) close() {
	if s.resp != nil {
		s.resp.Body.Close()
	}
	s.cancel()
}

// attempt sends one copy of req to the granted source.
func (t *Transport) attempt(ctx context.Context, base http.RoundTripper, orig *http.Request, getBody func() (io.ReadCloser, error), a Attempt) *sent {
	// The request lives on the caller's context, and ends with the attempt's
	// only until it is handed over (detach).
	rctx, cancel := context.WithCancel(orig.Context())
	detach := context.AfterFunc(ctx, cancel)
	defer detach()
	s := &sent{cancel: cancel, callID: a.CallID}
	fail := func(outcome Outcome, err error) *sent {
		cancel()
		s.result = Result{Outcome: outcome, Detail: err.Error()}
		return s
	}
	unsent := func(err error) *sent {
		s.unsent = err
		return fail(ClientError, err)
	}
	req := orig.Clone(rctx)
	if err := pointAt(req, a); err != nil {
		return unsent(err)
	}
	body, err := getBody()
	if err != nil {
		return unsent(fmt.Errorf("request body: %w", err))
	}
	req.Body = body
	if t.Prepare != nil {
		if err := t.Prepare(req, a); err != nil {
			req.Body.Close()
			return unsent(fmt.Errorf("Transport.Prepare for source %s: %w", a.Source, err))
		}
	}
	resp, err := base.RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil && orig.Context().Err() == nil {
			err = fmt.Errorf("source %s timed out after %v: %w", a.Source, a.Timeout, err)
			return fail(Transient, err)
		}
		cancel()
		s.result = ResultOf(nil, nil, err)
		return s
	}
	s.resp = resp
	// The body closes the request's context with it.
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	success := resp.StatusCode >= 200 && resp.StatusCode <= 299
	limit := int64(maxErrorBody)
	if success {
		limit = 0
		if isJSON(resp.Header.Get("Content-Type")) && resp.ContentLength <= maxUsageBody {
			limit = maxUsageBody
		}
	}
	head, complete, err := peek(resp, limit)
	if err != nil { // peek closed the body: there is no response to hand over
		s.resp = nil
		s.result = ResultOf(nil, nil, fmt.Errorf("reading the response of source %s: %w", a.Source, err))
		s.result.HTTPStatus = resp.StatusCode
		return s
	}
	s.result = ResultOf(resp, head, nil)
	if success && complete {
		s.result.ActualTokens = usage(head)
	}
	return s
}

// pointAt rewrites req's URL to the source's base_url (see Transport).
func pointAt(req *http.Request, a Attempt) error {
	raw, ok := a.Attributes["base_url"]
	if !ok {
		return fmt.Errorf("source %s has no base_url attribute", a.Source)
	}
	base, err := url.Parse(raw)
	if err != nil || base.Scheme == "" || base.Host == "" {
		return fmt.Errorf("source %s: base_url %q is not an absolute URL", a.Source, truncate(raw, 200))
	}
	u := *req.URL
	u.Scheme, u.Host, u.User = base.Scheme, base.Host, base.User
	escaped := strings.TrimSuffix(base.EscapedPath(), "/") + "/" + strings.TrimPrefix(u.EscapedPath(), "/")
	if u.Path, err = url.PathUnescape(escaped); err != nil {
		return fmt.Errorf("source %s: joining base_url and the request's path: %w", a.Source, err)
	}
	u.RawPath = escaped
	if base.RawQuery != "" {
		u.RawQuery = joinQuery(base.RawQuery, u.RawQuery)
	}
	req.URL = &u
	req.Host = "" // the URL's host
	return nil
}

func joinQuery(a, b string) string {
	if b == "" {
		return a
	}
	return a + "&" + b
}

// peek reads up to limit bytes of resp's body and puts them back in front of
// the rest, so the caller reads the whole body. complete says the whole body
// was read.
func peek(resp *http.Response, limit int64) (head []byte, complete bool, err error) {
	if limit <= 0 || resp.Body == nil {
		return nil, false, nil
	}
	head, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		resp.Body.Close()
		return nil, false, err
	}
	if int64(len(head)) <= limit {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{bytes.NewReader(head), resp.Body}
		return head, true, nil
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return head[:limit], false, nil
}

// cancelOnClose cancels the request's context when the body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// usage is an OpenAI-style body's usage.total_tokens, nil when absent or not
// a non-negative integer.
func usage(body []byte) *int64 {
	var doc struct {
		Usage *struct {
			TotalTokens json.Number `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &doc) != nil || doc.Usage == nil {
		return nil
	}
	n, err := strconv.ParseInt(doc.Usage.TotalTokens.String(), 10, 64)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}
