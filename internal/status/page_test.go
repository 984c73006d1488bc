package status

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// oneScope answers DescribeScope with d for scope "chat".
type oneScope struct{ d *admissionv1.ScopeDescription }

func (o oneScope) Scopes() []string { return []string{"chat"} }
func (o oneScope) DescribeScope(context.Context, *admissionv1.DescribeScopeRequest) (*admissionv1.DescribeScopeResponse, error) {
	return &admissionv1.DescribeScopeResponse{Scope: o.d}, nil
}

// TestPageSaysWhenRedisLostTheScope: /status shows DescribeScope's
// state_loss once there was a loss (or a re-assert is pending), and nothing
// of it before.
func TestPageSaysWhenRedisLostTheScope(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 4, 5, 0, time.UTC)
	render := func(l *admissionv1.StateLoss) string {
		t.Helper()
		d := &admissionv1.ScopeDescription{Config: &admissionv1.ScopeConfig{Name: "chat"}, Backend: "redis", StateLoss: l}
		p := New(oneScope{d}, NewRecorder(func() time.Time { return now }), func() time.Time { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
		w := httptest.NewRecorder()
		p.serveHTML(w, httptest.NewRequest("GET", "/status", nil))
		body, _ := io.ReadAll(w.Result().Body)
		if w.Code != 200 {
			t.Fatalf("/status answered %d: %s", w.Code, body)
		}
		return string(body)
	}
	if page := render(&admissionv1.StateLoss{}); strings.Contains(page, "lost this scope") {
		t.Errorf("the page reports a loss before any:\n%s", page)
	}
	page := render(&admissionv1.StateLoss{Count: 2, Last: timestamppb.New(now.Add(-time.Minute)), Restored: 3})
	if want := "redis lost this scope's state 2× (last at 03:03:05; 3 breakers re-asserted)"; !strings.Contains(page, want) {
		t.Errorf("the page does not say %q:\n%s", want, page)
	}
	if page := render(&admissionv1.StateLoss{ReassertPending: true}); !strings.Contains(page, "re-assert pending") {
		t.Errorf("the page does not say the re-assert is pending:\n%s", page)
	}
}

// TestPageRunsOnlyItsOwnScript: the page's Content-Security-Policy allows
// its own inline script (by hash) and nothing from elsewhere; the fragment
// the script fetches is the live part alone; a filter that names nothing
// the page offers is ignored, not echoed.
func TestPageRunsOnlyItsOwnScript(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 4, 5, 0, time.UTC)
	d := &admissionv1.ScopeDescription{Config: &admissionv1.ScopeConfig{Name: "chat"}, Backend: "memory",
		Sources: []*admissionv1.SourceState{{Name: "primary", State: admissionv1.BreakerState_BREAKER_STATE_CLOSED, Config: &admissionv1.SourceConfig{}}}}
	p := New(oneScope{d}, NewRecorder(func() time.Time { return now }), func() time.Time { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	get := func(url string) (string, string) {
		t.Helper()
		w := httptest.NewRecorder()
		p.serveHTML(w, httptest.NewRequest("GET", url, nil))
		body, _ := io.ReadAll(w.Result().Body)
		if w.Code != 200 {
			t.Fatalf("%s answered %d: %s", url, w.Code, body)
		}
		return string(body), w.Header().Get("Content-Security-Policy")
	}
	page, csp := get("/status")
	sum := sha256.Sum256([]byte(script))
	if want := "script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q, want default-src 'none' and %s", csp, want)
	}
	if !strings.Contains(page, "<script>"+script+"</script>") || strings.Contains(page, "<script src") {
		t.Error("the page does not carry its script inline, as written")
	}
	if !strings.Contains(page, `<section class="scope up" id="scope-chat">`) || !strings.Contains(page, "all 1 sources CLOSED") {
		t.Errorf("the page:\n%s", page)
	}
	frag, _ := get("/status?fragment=1")
	if strings.Contains(frag, "<html") || strings.Contains(frag, "<script") || !strings.Contains(frag, `id="scope-chat"`) {
		t.Errorf("the fragment:\n%s", frag)
	}
	hostile, _ := get("/status?scope=%3Cb%3Ex&source=%3Cb%3Ey&kind=%3Cb%3Ez")
	if strings.Contains(hostile, "<b>x") || strings.Contains(hostile, "&lt;b&gt;") || !strings.Contains(hostile, `id="scope-chat"`) {
		t.Errorf("a filter naming nothing the page offers was not ignored:\n%s", hostile)
	}
}

// TestPageShowsTenants: each tenant's limits as used / limit, and its next
// pick's verdict with the wait.
func TestPageShowsTenants(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 4, 5, 0, time.UTC)
	d := &admissionv1.ScopeDescription{Config: &admissionv1.ScopeConfig{Name: "chat"}, Backend: "memory", Tenants: []*admissionv1.TenantState{
		{Name: "team", Config: &admissionv1.TenantConfig{Weight: 2, MaxPriority: 3, Rpm: 3, MaxLiveCalls: 20, BudgetTokens: 1000, BudgetPer: durationpb.New(time.Hour)},
			LiveCalls: 4, RequestsLastMinute: 3, BudgetUsed: 700, Reason: admissionv1.Reason_REASON_TENANT_LIMIT, RetryAfter: durationpb.New(42 * time.Second)},
		{Name: "~other", Config: &admissionv1.TenantConfig{Weight: 1}},
	}}
	p := New(oneScope{d}, NewRecorder(func() time.Time { return now }), func() time.Time { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w := httptest.NewRecorder()
	p.serveHTML(w, httptest.NewRequest("GET", "/status", nil))
	body, _ := io.ReadAll(w.Result().Body)
	page := string(body)
	for _, want := range []string{"<td>team</td>", "4 / 20", "3 / 3", "700 / 1000 per 1h0m0s", "tenant_limit, 42s", "<td>~other</td>", "0 / ∞"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
}
