package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// One status per cause: a backend that timed out is UNAVAILABLE with
// BACKEND_UNAVAILABLE even when its error wraps the context error of its own
// deadline; the caller's own deadline or cancellation stays its code.
func TestToStatusOneCausePerStatus(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	timedOut := fmt.Errorf("redisgate: admit: %w: %w", gate.ErrUnavailable, context.DeadlineExceeded)
	refused := fmt.Errorf("redisgate: admit: %w: dial tcp: connection refused", gate.ErrUnavailable)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		err    error
		code   codes.Code
		reason admissionv1.ErrorReason // unspecified: none expected
	}{
		{"the backend's own timeout", live, timedOut, codes.Unavailable, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE},
		{"the backend refused", live, refused, codes.Unavailable, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE},
		{"the backend refused after the caller's deadline", ended, refused, codes.Unavailable, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE},
		{"the caller's deadline passed while the backend timed out", ended, timedOut, codes.DeadlineExceeded, 0},
		{"a bare deadline", live, context.DeadlineExceeded, codes.DeadlineExceeded, 0},
		{"a bare cancellation", live, context.Canceled, codes.Canceled, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := toStatus(tc.ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), tc.err)
			if tc.reason == 0 {
				if c := status.Code(err); c != tc.code {
					t.Fatalf("toStatus(%v) = %v; want code %v", tc.err, err, tc.code)
				}
				return
			}
			wantStatus(t, err, tc.code, tc.reason, "")
		})
	}
}
