package polygate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// scripted is a sidecar whose answers the test sets: pick answers every
// Pick (grant or verdict), record every RecordOutcome; err, when set, is
// every RPC's error.
type scripted struct {
	admissionv1.UnimplementedAdmissionServiceServer
	mu      sync.Mutex
	pick    *admissionv1.PickResponse
	record  *admissionv1.RecordOutcomeResponse
	err     error
	cancels int // CancelCalls received
}

func (s *scripted) Pick(context.Context, *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pick, s.err
}

func (s *scripted) RecordOutcome(context.Context, *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record, s.err
}

func (s *scripted) CancelCall(context.Context, *admissionv1.CancelCallRequest) (*admissionv1.CancelCallResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancels++
	return &admissionv1.CancelCallResponse{}, nil
}

func (s *scripted) set(pick *admissionv1.PickResponse, record *admissionv1.RecordOutcomeResponse, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pick, s.record, s.err = pick, record, err
}

// serveScripted starts s on a loopback port; stop ends it (a sidecar that is down).
func serveScripted(t *testing.T, s *scripted) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	admissionv1.RegisterAdmissionServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv.Stop
}

func grantOn(source, baseURL string) *admissionv1.PickResponse {
	return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Grant{Grant: &admissionv1.Grant{
		Source: source, PermitId: "p1", Attempt: 1, Attributes: map[string]string{"base_url": baseURL}, Timeout: durationpb.New(5e9),
	}}}
}

func failure(reason admissionv1.FailureReason, retryAfterMs int64, per ...*admissionv1.SourceReason) *admissionv1.Failure {
	return &admissionv1.Failure{Reason: reason, RetryAfter: durationpb.New(time.Duration(retryAfterMs) * time.Millisecond), PerSourceReasons: per}
}

// upstreamAnswering answers every request with status and body, counting them.
func upstreamAnswering(t *testing.T, status int, body string) (*httptest.Server, *int) {
	t.Helper()
	var n int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func post(t *testing.T, c *polygate.Client) (*http.Response, error) {
	t.Helper()
	httpClient := &http.Client{Transport: &polygate.Transport{Client: c, Scope: "chat"}}
	req, err := http.NewRequest(http.MethodPost, "http://polygate.invalid/chat/completions", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return httpClient.Do(req)
}

func dial(t *testing.T, addr string, opts ...polygate.Option) *polygate.Client {
	t.Helper()
	c, err := polygate.Dial(addr, append([]polygate.Option{polygate.WithToken("")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// With no upstream answer, a verdict is a synthesized response: its status,
// headers and JSON error are the rules docs/quickstart.md writes down.
func TestTransport_SynthesizesAVerdictNoUpstreamAnswered(t *testing.T) {
	sc := &scripted{}
	addr, _ := serveScripted(t, sc)
	c := dial(t, addr)
	per := []*admissionv1.SourceReason{
		{Source: "a", Reason: admissionv1.Reason_REASON_CIRCUIT_OPEN, RetryAfter: durationpb.New(29871200000)},
		{Source: "b", Reason: admissionv1.Reason_REASON_PROBE_IN_FLIGHT},
	}
	for _, tt := range []struct {
		reason admissionv1.FailureReason
		name   string
		status int
	}{
		{admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN, "circuit_open", 503},
		{admissionv1.FailureReason_FAILURE_REASON_QUOTA_EXHAUSTED, "quota_exhausted", 429},
		{admissionv1.FailureReason_FAILURE_REASON_STALLED, "stalled", 503},
		{admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD, "source_dead", 503},
		{admissionv1.FailureReason_FAILURE_REASON_BUDGET_EXHAUSTED, "budget_exhausted", 429},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := failure(tt.reason, 0, per...)
			f.RetryAfter = durationpb.New(29871200000) // 29.8712 s: rounded up to 29.872
			sc.set(&admissionv1.PickResponse{CallId: "c9", Result: &admissionv1.PickResponse_Failure{Failure: f}}, nil, nil)
			resp, err := post(t, c)
			if err != nil {
				t.Fatalf("Do = %v; want a response", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("status %d; want %d", resp.StatusCode, tt.status)
			}
			for k, want := range map[string]string{
				"Content-Type": "application/json", "Polygate-Failure-Reason": tt.name,
				"Polygate-Retry-After": "29.872", "Polygate-Call-Id": "c9", "Retry-After": "30",
			} {
				if got := resp.Header.Get(k); got != want {
					t.Errorf("%s: %q; want %q", k, got, want)
				}
			}
			body, _ := io.ReadAll(resp.Body)
			var got, want any
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(`{"error":{
				"message":"polygate: `+tt.name+` in scope chat, retry after 29.872s (call c9): a circuit_open 29.872s; b probe_in_flight",
				"type":"polygate_error","code":"`+tt.name+`","param":null,
				"polygate":{"reason":"`+tt.name+`","retry_after_s":29.872,"scope":"chat","call_id":"c9","attempts":0,
					"per_source":[{"source":"a","reason":"circuit_open","retry_after_s":29.872},{"source":"b","reason":"probe_in_flight","retry_after_s":0}]}}}`), &want)
			if g, w := mustJSON(got), mustJSON(want); g != w {
				t.Errorf("body\n%s\nwant\n%s", g, w)
			}
			if f, ok := polygate.FailureOf(resp); !ok || f.Reason.String() != tt.name || len(f.PerSource) != 2 {
				t.Errorf("FailureOf = %v, %v; want the %s verdict", f, ok, tt.name)
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A verdict after an upstream answer returns that answer with the verdict's
// headers; a success carries the call's id and no verdict.
func TestTransport_PassesTheUpstreamsAnswerThrough(t *testing.T) {
	dead, _ := upstreamAnswering(t, 401, `{"error":{"message":"Incorrect API key provided"}}`)
	ok, _ := upstreamAnswering(t, 200, `{"usage":{"total_tokens":3}}`)
	sc := &scripted{}
	addr, _ := serveScripted(t, sc)
	c := dial(t, addr)

	sc.set(grantOn("a", dead.URL), &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Failure{
		Failure: failure(admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD, 2500)}}, nil)
	resp, err := post(t, c)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !bytes.Contains(body, []byte("Incorrect API key")) ||
		resp.Header.Get("Polygate-Failure-Reason") != "source_dead" || resp.Header.Get("Polygate-Retry-After") != "2.500" || resp.Header.Get("Retry-After") != "" {
		t.Errorf("response %d %s %v; want the upstream's 401 with the source_dead headers", resp.StatusCode, body, resp.Header)
	}
	if f, ok := polygate.FailureOf(resp); !ok || !errors.Is(f, polygate.ErrSourceDead) || f.Attempts != 1 {
		t.Errorf("FailureOf = %v, %v; want source_dead after 1 attempt", f, ok)
	}

	sc.set(grantOn("a", ok.URL), &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}, nil)
	resp, err = post(t, c)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, failed := polygate.FailureOf(resp); resp.StatusCode != 200 || resp.Header.Get("Polygate-Call-Id") != "c1" || failed || resp.Header.Get("Polygate-Failure-Reason") != "" {
		t.Errorf("response %d %v (failed %v); want the 200 with its call id, no verdict", resp.StatusCode, resp.Header, failed)
	}
}

// A sidecar that cannot be reached: SidecarFail is the error at once;
// SidecarAllow calls the upstream directly (the configured fallback, then the
// source the last governed call began on), passing its answer through; the
// sidecar's own UNAVAILABLE (a backend down) is never bypassed.
func TestSidecarUnavailable(t *testing.T) {
	a, aCount := upstreamAnswering(t, 200, `{}`)
	b, bCount := upstreamAnswering(t, 401, `{"error":{"message":"Incorrect API key provided"}}`)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))

	t.Run("fail", func(t *testing.T) {
		sc := &scripted{}
		addr, stop := serveScripted(t, sc)
		stop()
		_, err := post(t, dial(t, addr, polygate.WithOnSidecarUnavailable(polygate.SidecarFail)))
		var se *polygate.StatusError
		if !errors.As(err, &se) || !errors.Is(err, polygate.ErrUnavailable) || *aCount+*bCount != 0 {
			t.Errorf("Do = %v; want the sidecar's unavailable error and no upstream request", err)
		}
	})

	t.Run("allow", func(t *testing.T) {
		sc := &scripted{}
		addr, stop := serveScripted(t, sc)
		c := dial(t, addr, polygate.WithOnSidecarUnavailable(polygate.SidecarAllow), polygate.WithFallback("chat", "b", map[string]string{"base_url": b.URL}), polygate.WithLogger(logger))
		stop()
		for range 2 {
			resp, err := post(t, c)
			if err != nil {
				t.Fatalf("Do = %v; want b's answer", err)
			}
			resp.Body.Close()
			if _, failed := polygate.FailureOf(resp); resp.StatusCode != 401 || failed {
				t.Errorf("response %d (failed %v); want b's own 401, no verdict", resp.StatusCode, failed)
			}
		}
		if n := c.UngovernedAttempts(); n != 2 || *bCount != 2 {
			t.Errorf("%d ungoverned attempts, b received %d; want 2 each", n, *bCount)
		}
		if n := strings.Count(logs.String(), "sidecar is unreachable"); n != 1 {
			t.Errorf("the outage was logged %d times; want once:\n%s", n, logs.String())
		}
	})

	t.Run("allow after a governed call", func(t *testing.T) {
		sc := &scripted{}
		addr, _ := serveScripted(t, sc)
		c := dial(t, addr, polygate.WithOnSidecarUnavailable(polygate.SidecarAllow), polygate.WithFallback("chat", "b", map[string]string{"base_url": b.URL}))
		sc.set(grantOn("a", a.URL), &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}}, nil)
		if resp, err := post(t, c); err != nil {
			t.Fatal(err)
		} else {
			resp.Body.Close()
		}
		sc.set(nil, nil, status.Error(codes.Unavailable, "connection refused")) // as a proxy in front of it would say
		before := *aCount
		resp, err := post(t, c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || *aCount != before+1 {
			t.Errorf("response %d, a received %d more; want a's 200: the source the last call began on", resp.StatusCode, *aCount-before)
		}

		st, _ := status.New(codes.Unavailable, "redis down").WithDetails(&errdetails.ErrorInfo{Reason: "ERROR_REASON_BACKEND_UNAVAILABLE"})
		sc.set(nil, nil, st.Err())
		_, err = post(t, c)
		var se *polygate.StatusError
		if !errors.As(err, &se) || se.Reason != "ERROR_REASON_BACKEND_UNAVAILABLE" {
			t.Errorf("Do = %v; want the sidecar's own UNAVAILABLE, not bypassed", err)
		}
	})
}

// $POLYGATE_ADDR and $POLYGATE_TOKEN configure a client given neither.
func TestEnvironmentDefaults(t *testing.T) {
	addr, _ := tlsFreeSidecar(t, "s3cret")
	t.Setenv("POLYGATE_ADDR", addr)
	t.Setenv("POLYGATE_TOKEN", "s3cret")
	c, err := polygate.Dial("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = polygate.Do(context.Background(), c, "chat", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 0, polygate.Result{Outcome: polygate.Success}
	})
	if !errors.Is(err, polygate.ErrCircuitOpen) {
		t.Errorf("Do = %v; want the fake's circuit_open, past its token check", err)
	}

	t.Setenv("POLYGATE_ADDR", "")
	if _, err := polygate.Dial(""); err == nil || !strings.Contains(err.Error(), "$POLYGATE_ADDR") {
		t.Errorf("Dial(\"\") = %v; want an error naming $POLYGATE_ADDR", err)
	}
	t.Setenv("POLYGATE_ON_SIDECAR_UNAVAILABLE", "open")
	if _, err := polygate.Dial(addr); err == nil || !strings.Contains(err.Error(), `$POLYGATE_ON_SIDECAR_UNAVAILABLE: "open" is not allowed: fail or allow`) {
		t.Errorf("Dial = %v; want the bad mode named", err)
	}
	t.Setenv("POLYGATE_ON_SIDECAR_UNAVAILABLE", "allow")
	if c, err := polygate.Dial(addr); err != nil || c.OnSidecarUnavailable() != polygate.SidecarAllow {
		t.Errorf("Dial = %v; want a client that allows", err)
	}
}

// tlsFreeSidecar serves fakeSidecar (token-checking) in plaintext.
func tlsFreeSidecar(t *testing.T, token string) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	admissionv1.RegisterAdmissionServiceServer(srv, &fakeSidecar{token: token})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv.Stop
}

// A request that could not be made (a source without base_url) ends in an
// error naming why, not in a response standing for the verdict.
func TestTransport_AnUnsentRequestIsAnError(t *testing.T) {
	sc := &scripted{}
	addr, _ := serveScripted(t, sc)
	c := dial(t, addr)
	sc.set(grantOn("bare", ""), &admissionv1.RecordOutcomeResponse{Next: &admissionv1.RecordOutcomeResponse_Failure{
		Failure: failure(admissionv1.FailureReason_FAILURE_REASON_NON_RETRYABLE, 0)}}, nil)
	resp, err := post(t, c)
	var f *polygate.FailureError
	if resp != nil || err == nil || !strings.Contains(err.Error(), "not an absolute URL") || !errors.As(err, &f) {
		t.Errorf("Do = %v, %v; want an error naming the base_url, wrapping the verdict", resp, err)
	}
}

// An answer without its choice breaks the protocol: Do returns an error and,
// since the sidecar gave no verdict, ends the call with CancelCall.
func TestDo_AnAnswerWithoutItsChoiceEndsTheCall(t *testing.T) {
	side := &scripted{}
	side.set(grantOn("a", "http://a.invalid"), &admissionv1.RecordOutcomeResponse{}, nil)
	addr, _ := serveScripted(t, side)
	c, err := polygate.Dial(addr, polygate.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = polygate.Do(context.Background(), c, "chat", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 1, polygate.Result{Outcome: polygate.Success, HTTPStatus: 200}
	})
	side.mu.Lock()
	cancels := side.cancels
	side.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "answered no next action") || cancels != 1 {
		t.Errorf("Do = %v with %d CancelCalls; want the protocol error and one CancelCall", err, cancels)
	}
}
