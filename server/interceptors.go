package server

import (
	"context"
	"log/slog"
	"runtime/debug"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Interceptors are extra interceptors for the outermost place of the chain
// (metrics).
type Interceptors struct {
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// ServerOptions builds the interceptor chain in one place, outermost first:
// metrics, logging (slog), the error edge (domain errors → statuses), auth
// and validation (admission service only, so health and reflection stay
// open), recovery innermost so that logging and metrics still see a panic.
//
// tokens are the bearer tokens of the application and operator roles (see
// Tokens); they are read per call, so a reload can change them.
func ServerOptions(log *slog.Logger, tokens *Tokens, extra Interceptors) []grpc.ServerOption {
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		log.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(codeToLevel),
	}
	admission := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service == admissionv1.AdmissionService_ServiceDesc.ServiceName
	})
	authFn := tokens.authenticate
	recover := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	edge := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		return resp, toStatus(ctx, log, err)
	}
	streamEdge := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return toStatus(ss.Context(), log, handler(srv, ss))
	}
	check := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := validate(req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}

	unary := append(extra.Unary,
		logging.UnaryServerInterceptor(logger, logOpts...),
		edge,
		selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(authFn), admission),
		selector.UnaryServerInterceptor(check, admission),
		recovery.UnaryServerInterceptor(recover),
	)
	stream := append(extra.Stream,
		logging.StreamServerInterceptor(logger, logOpts...),
		streamEdge,
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(authFn), admission),
		recovery.StreamServerInterceptor(recover),
	)
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...)}
}

// codeToLevel logs successful RPCs at debug, misuse at warn and failures of
// the sidecar at error.
func codeToLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.Canceled:
		return logging.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		return logging.LevelError
	}
	return logging.LevelWarn
}
