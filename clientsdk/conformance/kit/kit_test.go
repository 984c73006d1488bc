package kit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

func TestExchangesLoad(t *testing.T) {
	exs, err := Load("../exchanges")
	if err != nil {
		t.Fatal(err)
	}
	if len(exs) < 15 {
		t.Fatalf("%d exchanges; the kit covers at least 15 paths of the loop", len(exs))
	}
	var rpcs []string
	for _, ex := range exs {
		for _, s := range ex.Script {
			if s.RPC != "" && !slices.Contains(rpcs, s.RPC) {
				rpcs = append(rpcs, s.RPC)
			}
		}
	}
	slices.Sort(rpcs)
	if !slices.Equal(rpcs, []string{"CancelCall", "OnNoRunnable", "Pick", "RecordOutcome"}) {
		t.Errorf("the exchanges script %v; want every RPC of the loop", rpcs)
	}
}

func TestParseNamesWhatIsWrong(t *testing.T) {
	const call = `"calls": [{"request": {"method": "POST", "path": "/x"}, "app_sees": {"status": 200}}]`
	tests := []struct{ name, json, want string }{
		{"unknown field", `{"name": "x", "colls": [], ` + call + `, "script": []}`, `unknown field "colls"`},
		{"rpc name", `{"name": "x", ` + call + `, "script": [{"rpc": "Pik", "reply": {"hang": true}}]}`, `script[0]: rpc: "Pik" is not allowed`},
		{"two replies", `{"name": "x", ` + call + `, "script": [{"rpc": "Pick", "reply": {"hang": true, "grant": {"source": "a"}}}]}`, "want exactly one answer of Pick, got 2"},
		{"outcome", `{"name": "x", ` + call + `, "script": [{"rpc": "RecordOutcome", "request": {"outcome": "OK"}, "reply": {"done": {}}}]}`, `request.outcome: "OK" is not allowed`},
		{"failure reason", `{"name": "x", ` + call + `, "script": [{"rpc": "OnNoRunnable", "reply": {"failure": {"reason": "down"}}}]}`, `reply.failure.reason: "down" is not a failure reason`},
		{"open-only field", `{"name": "x", ` + call + `, "script": [{"rpc": "Pick", "request": {"tenant": "t"}, "reply": {"hang": true}}]}`, "only on the Pick that opens the call"},
		{"app error", `{"name": "x", "calls": [{"request": {"method": "GET", "path": "/x"}, "app_sees": {"error": "boom"}}], "script": []}`, `calls[0].app_sees.error: "boom" is not allowed`},
		{"abort after", `{"name": "x", "calls": [{"request": {"method": "GET", "path": "/x"}, "abort_after": 3, "app_sees": {"error": "aborted"}}], "script": []}`, "abort_after: 3 is not within 0..0"},
		{"error code", `{"name": "x", ` + call + `, "script": [{"rpc": "Pick", "reply": {"error": {"code": "GONE"}}}]}`, `reply.error.code: "GONE" is not a gRPC code`},
		{"negative sleep", `{"name": "x", ` + call + `, "script": [{"rpc": "OnNoRunnable", "reply": {"wait": {"sleep_ms": -1}}}]}`, "reply.wait.sleep_ms: -1 is not within 0..86400000"},
		{"after_ms that would wrap", `{"name": "x", ` + call + `, "script": [{"rpc": "CancelCall", "after_ms": 9223372036854775807}]}`, "after_ms: 9223372036854775807 is not within 0..86400000"},
		{"lease that would wrap", `{"name": "x", ` + call + `, "script": [{"rpc": "Pick", "reply": {"grant": {"source": "a", "timeout_ms": 9223372036854775807}}}]}`, "reply.grant.timeout_ms: 9223372036854775807 is not within"},
		{"refusal's retry", `{"name": "x", ` + call + `, "script": [{"rpc": "OnNoRunnable", "reply": {"failure": {"reason": "stalled", "reasons": [{"source": "a", "reason": "queued", "retry_after_ms": -5}]}}}]}`, "reply.failure.reasons[0].retry_after_ms: -5 is not within"},
		{"call deadline", `{"name": "x", "calls": [{"request": {"method": "GET", "path": "/x"}, "options": {"deadline_ms": 86400001}, "app_sees": {"status": 200}}], "script": []}`, "calls[0].options.deadline_ms: 86400001 is not within"},
		{"deadline expected", `{"name": "x", ` + call + `, "script": [{"rpc": "Pick", "request": {"opens": true, "deadline_ms_at_most": 315576000000001}, "reply": {"hang": true}}]}`, "request.deadline_ms_at_most: 315576000000001 is not within 0..315576000000000"},
		{"size", `{"name": "` + strings.Repeat("x", maxExchange) + `"}`, "more than 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

// scripted is a hand-written client of one exchange, the reference a runner
// is measured against.
type scripted struct {
	t   *testing.T
	f   *Fake
	ep  Endpoints
	rpc admissionv1.AdmissionServiceClient
}

func begin(t *testing.T, name string) *scripted {
	t.Helper()
	exs, err := Load("../exchanges")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(exs, func(e *Exchange) bool { return e.Name == name })
	if i < 0 {
		t.Fatalf("no exchange %s", name)
	}
	f := &Fake{}
	t.Cleanup(f.End)
	ep, err := f.Begin(exs[i])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ep.Sidecar, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &scripted{t: t, f: f, ep: ep, rpc: admissionv1.NewAdmissionServiceClient(conn)}
}

func (s *scripted) post(baseURL string) int {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/chat/completions", strings.NewReader(`{"model":"gpt-x","messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (s *scripted) result(timeout time.Duration) []string {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.f.Result(ctx).Mismatches
}

// grantSuccess plays grant-success, reporting outcome.
func grantSuccess(t *testing.T, outcome admissionv1.Outcome) []string {
	s := begin(t, "grant-success")
	ctx := context.Background()
	pick, err := s.rpc.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 500, Priority: 3, Tenant: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	g := pick.GetGrant()
	if pick.GetCallId() != "call-1" || g.GetSource() != "a" || g.GetPermitId() != "permit-1" || g.GetAttempt() != 1 {
		t.Fatalf("Pick = %v; want call-1's grant of a, permit-1, attempt 1", pick)
	}
	if code := s.post(g.GetAttributes()["base_url"]); code != 200 {
		t.Fatalf("upstream answered %d, want 200", code)
	}
	tokens := int64(8)
	rec, err := s.rpc.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "call-1", PermitId: g.GetPermitId(),
		Outcome: outcome, HttpStatus: 200, ActualTokens: &tokens})
	if err != nil {
		t.Fatal(err)
	}
	if rec.GetDone() == nil {
		t.Fatalf("RecordOutcome = %v; want done", rec)
	}
	return s.result(10 * time.Second)
}

func TestFakePassesAConformingClient(t *testing.T) {
	if m := grantSuccess(t, admissionv1.Outcome_OUTCOME_SUCCESS); len(m) != 0 {
		t.Errorf("mismatches of a conforming client: %q", m)
	}
}

func TestFakeReportsAWrongField(t *testing.T) {
	m := grantSuccess(t, admissionv1.Outcome_OUTCOME_TRANSIENT)
	if !slices.Equal(m, []string{"step 2 (RecordOutcome): outcome = TRANSIENT, want SUCCESS"}) {
		t.Errorf("mismatches = %q", m)
	}
}

func TestFakeReportsAnRPCOutOfOrder(t *testing.T) {
	s := begin(t, "grant-success")
	ctx := context.Background()
	pick, err := s.rpc.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 500, Priority: 3, Tenant: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.rpc.CancelCall(ctx, &admissionv1.CancelCallRequest{Scope: "chat", CallId: pick.GetCallId()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("CancelCall out of the script = %v; want FAILED_PRECONDITION", err)
	}
	if m := s.result(10 * time.Second); !slices.Equal(m, []string{"step 1: got CancelCall, want upstream a"}) {
		t.Errorf("mismatches = %q", m)
	}
}

func TestFakeReportsASleepTooShortAndStepsThatNeverCame(t *testing.T) {
	s := begin(t, "retry-backoff")
	ctx := context.Background()
	pick, err := s.rpc.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Priority: 2, Tenant: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	if code := s.post(pick.GetGrant().GetAttributes()["base_url"]); code != 503 {
		t.Fatalf("upstream answered %d, want 503", code)
	}
	rec, err := s.rpc.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "call-1", PermitId: "permit-1",
		Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, HttpStatus: 503})
	if err != nil || rec.GetRetry().GetBackoff().AsDuration() != 200*time.Millisecond {
		t.Fatalf("RecordOutcome = %v, %v; want Retry(200ms)", rec, err)
	}
	// No sleep: the Pick comes at once.
	if _, err := s.rpc.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", CallId: "call-1"}); err != nil {
		t.Fatal(err)
	}
	m := s.result(0)
	if len(m) != 3 || !strings.HasPrefix(m[0], "step 3 (Pick): came ") || !strings.HasSuffix(m[0], "after the previous step, want at least 200 ms") ||
		m[1] != "step 4 (upstream a): never came" || m[2] != "step 5 (RecordOutcome): never came" {
		t.Errorf("mismatches = %q", m)
	}
}

// A timeout_ms of the control API too large for a Duration waits maxWait,
// not a wrapped (negative) time.
func TestWaitContextBoundsTheTimeout(t *testing.T) {
	for _, q := range []string{"timeout_ms=9223372036854775807", "timeout_ms=-1", "timeout_ms=x", ""} {
		ctx, cancel := waitContext(httptest.NewRequest(http.MethodGet, "/result?"+q, nil))
		deadline, _ := ctx.Deadline()
		cancel()
		if left := time.Until(deadline); left <= maxWait-time.Minute || left > maxWait {
			t.Errorf("%q: waits %v; want maxWait (%v)", q, left, maxWait)
		}
	}
	ctx, cancel := waitContext(httptest.NewRequest(http.MethodGet, "/result?timeout_ms=1500", nil))
	defer cancel()
	if deadline, _ := ctx.Deadline(); time.Until(deadline) > 1500*time.Millisecond {
		t.Errorf("timeout_ms=1500 waits until %v; want at most 1.5 s", deadline)
	}
}

func TestAppSeesCheck(t *testing.T) {
	exs, err := Load("../exchanges")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(exs, func(e *Exchange) bool { return e.Name == "wait-failure" })
	want := exs[i].Calls[0].AppSees
	h := http.Header{}
	for k, v := range map[string]string{"Polygate-Failure-Reason": "circuit_open", "Polygate-Retry-After": "30.000", "Retry-After": "30", "Polygate-Call-Id": "call-1"} {
		h.Set(k, v)
	}
	body := []byte(`{"error":{"type":"polygate_error","code":"circuit_open","polygate":{"retry_after_s":30,"per_source":[{"source":"a"}]}}}`)
	if m := want.Check(503, h, body); len(m) != 0 {
		t.Errorf("a matching response: %q", m)
	}
	h.Set("Polygate-Failure-Reason", "stalled")
	m := want.Check(429, h, []byte(`{"error":{"code":"stalled"}}`))
	wantM := []string{
		"status = 429, want 503",
		`header polygate-failure-reason = "stalled", want "circuit_open"`,
		`body error.code = "stalled", want "circuit_open"`,
		"body error.polygate.per_source.0.source = null, want \"a\"",
		"body error.polygate.retry_after_s = null, want 30",
		`body error.type = null, want "polygate_error"`,
	}
	if !slices.Equal(m, wantM) {
		t.Errorf("mismatches = %q\nwant %q", m, wantM)
	}
}
