package status

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
