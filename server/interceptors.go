package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Interceptors are what the composition root adds to the chain: extra
// interceptors for its outermost place (tracing; metrics of streams), and
// the counter of unary RPCs.
type Interceptors struct {
	// RPC, when set, counts the admission service's unary RPCs from within
	// the chain's own interceptor, outside its other links.
	RPC    RPCCounter
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// RPCCounter counts unary RPCs (metrics.RPC): Started as one begins, Ended
// with the status it answers and its time. Called from the chain's own
// interceptor, it costs neither an interceptor frame (a held call's stack)
// nor grpc-go's chaining closure per RPC.
type RPCCounter interface {
	Started(fullMethod string)
	Ended(fullMethod string, err error, d time.Duration)
}

// ServerOptions builds the interceptor chain in one place, outermost first:
// extra (tracing; metrics of streams), metrics of unary RPCs (extra.RPC),
// logging (slog), the error edge (domain errors → statuses), auth and
// validation, recovery innermost so that logging and metrics still see a
// panic.
//
// The chain is the admission service's: health and reflection skip every
// link of it (they are never behind the token, and a probe every second is
// neither logged nor counted), so a health check costs what grpc-go's does.
// Only the end of a stream's silence (heard, see firstMessage) is every
// service's: first in the stream chain, first thing in the unary one.
//
// For unary RPCs the links are one interceptor (unaryChain), not five: a call
// held in OnNoRunnable parks its goroutine below the chain, and five chained
// closures would add 1.4 KB to that stack (3.1 KB in all with one). The
// runtime halves a stack at GC when less than a quarter of it is in use
// (counting 800 B of guard): with one link, a held call's stack that a Redis
// read grew to 16 KB shrinks back to 8 KB (docs/performance.md, "What a held
// call costs").
//
// tokens are the bearer tokens of the application and operator roles (see
// Tokens); they are read per call, so a reload can change them.
func ServerOptions(log *slog.Logger, tokens *Tokens, extra Interceptors) []grpc.ServerOption {
	authFn := tokens.authenticate
	recover := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		return panicked(ctx, log, p)
	})
	streamEdge := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return toStatus(ss.Context(), log, handler(srv, ss))
	}
	logStream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		logFinished(ss.Context(), log, info.FullMethod, "server_stream", start, err)
		return err
	}

	chain := &unaryChain{log: log, auth: authFn, rpc: extra.RPC}
	unary := slices.Concat(extra.Unary, []grpc.UnaryServerInterceptor{chain.intercept})
	for i, in := range unary[:len(extra.Unary)] {
		unary[i] = admissionUnary(in)
	}
	stream := slices.Concat(extra.Stream, []grpc.StreamServerInterceptor{
		logStream,
		streamEdge,
		auth.StreamServerInterceptor(authFn),
		recovery.StreamServerInterceptor(recover),
	})
	for i, in := range stream {
		stream[i] = admissionStream(in)
	}
	stream = append([]grpc.StreamServerInterceptor{heardStream}, stream...) // every service's
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.NumStreamWorkers(streamWorkers),
	}
}

// unaryChain is the unary links of the chain, outermost first: metrics,
// logging, the error edge, auth, validation and recovery, in two frames.
type unaryChain struct {
	log  *slog.Logger
	auth func(context.Context) (context.Context, error)
	rpc  RPCCounter // nil: not counted
}

// intercept counts and logs the RPC and turns its error into a status. It
// keeps the method's name, not info, across the call: a call held in
// OnNoRunnable would keep info as long as it is held.
func (ch *unaryChain) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	heard(ctx) // the request is here: the stream is no longer silent
	method := info.FullMethod
	if !strings.HasPrefix(method, admissionPrefix) {
		return handler(ctx, req)
	}
	start := time.Now()
	if ch.rpc != nil {
		ch.rpc.Started(method)
	}
	resp, err := ch.admit(ctx, req, handler)
	err = toStatus(ctx, ch.log, err)
	if ch.rpc != nil {
		ch.rpc.Ended(method, err, time.Since(start))
	}
	logFinished(ctx, ch.log, method, "unary", start, err)
	return resp, err
}

// admit authenticates and validates the request, then runs the handler,
// turning a panic into INTERNAL.
func (ch *unaryChain) admit(ctx context.Context, req any, handler grpc.UnaryHandler) (resp any, err error) {
	if ctx, err = ch.auth(ctx); err != nil {
		return nil, err
	}
	if err := validate(req); err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, panicked(ctx, ch.log, p)
		}
	}()
	return handler(ctx, req)
}

// panicked logs a recovered panic with its stack and returns errPanic,
// which the error edge (toStatus) answers as INTERNAL.
func panicked(ctx context.Context, log *slog.Logger, p any) error {
	log.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
	return errPanic
}

// streamWorkers is the number of goroutines kept to serve RPCs. A new
// goroutine per RPC grew (copied) its stack a few times on every call: 20% of
// the sidecar's CPU at 64 callers (docs/performance.md); reused ones have
// grown already. More RPCs at once than workers (calls held in OnNoRunnable)
// get a goroutine each, as before. 128 workers keep at most a few MB of
// stacks. (grpc.NumStreamWorkers is marked experimental in grpc-go.)
const streamWorkers = 128

// admissionPrefix starts the full method name of every admission RPC.
var admissionPrefix = "/" + admissionv1.AdmissionService_ServiceDesc.ServiceName + "/"

// admissionUnary runs in for the admission service's RPCs only; others go
// straight on.
func admissionUnary(in grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, admissionPrefix) {
			return handler(ctx, req)
		}
		return in(ctx, req, info, handler)
	}
}

// admissionStream is admissionUnary for streams.
func admissionStream(in grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, admissionPrefix) {
			return handler(srv, ss)
		}
		return in(srv, ss, info, handler)
	}
}

// logFinished logs a finished RPC at the level of its code. Nothing is built
// unless that level is enabled: a successful RPC logs at debug, which is
// off by default.
func logFinished(ctx context.Context, log *slog.Logger, fullMethod, kind string, start time.Time, err error) {
	code := status.Code(err)
	level := codeToLevel(code)
	if !log.Enabled(ctx, level) {
		return
	}
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	attrs := []slog.Attr{
		slog.String("grpc.service", service),
		slog.String("grpc.method", method),
		slog.String("grpc.method_type", kind),
		slog.String("grpc.code", code.String()),
		slog.Float64("grpc.time_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if err != nil {
		attrs = append(attrs, slog.String("grpc.error", err.Error()))
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer.address", p.Addr.String()))
	}
	log.LogAttrs(ctx, level, "finished call", attrs...)
}

// codeToLevel logs successful RPCs at debug, misuse at warn and failures of
// the sidecar at error.
func codeToLevel(c codes.Code) slog.Level {
	switch c {
	case codes.OK, codes.Canceled:
		return slog.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		return slog.LevelError
	}
	return slog.LevelWarn
}
