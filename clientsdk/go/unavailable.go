package polygate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SidecarUnavailable is what a call does when the sidecar cannot be
// reached (WithOnSidecarUnavailable).
type SidecarUnavailable string

const (
	// SidecarFail ends the call with the sidecar's error (a *StatusError
	// matching ErrUnavailable): the default.
	SidecarFail SidecarUnavailable = "fail"
	// SidecarAllow makes the call's attempt directly, ungoverned, on the
	// source the scope's calls last began on (or the scope's WithFallback),
	// with the upstream's answer passed through.
	SidecarAllow SidecarUnavailable = "allow"
)

// Environment variables the SDK reads when the application passes nothing.
const (
	// EnvAddr is the sidecar's address when Dial is given "".
	EnvAddr = "POLYGATE_ADDR"
	// EnvToken is the bearer token when no WithToken is given.
	EnvToken = "POLYGATE_TOKEN"
	// EnvOnSidecarUnavailable is "fail" or "allow" when no
	// WithOnSidecarUnavailable is given.
	EnvOnSidecarUnavailable = "POLYGATE_ON_SIDECAR_UNAVAILABLE"
)

// WithOnSidecarUnavailable chooses what a call does when the sidecar cannot
// be reached: SidecarFail (the default, else $POLYGATE_ON_SIDECAR_UNAVAILABLE)
// or SidecarAllow. "Cannot be reached" is a gRPC UNAVAILABLE without the
// sidecar's own ErrorInfo: the sidecar's UNAVAILABLE for a shared backend
// that is down under a fail-closed scope is the operator's decision, and is
// never bypassed.
func WithOnSidecarUnavailable(mode SidecarUnavailable) Option {
	return func(c *clientConfig) { c.mode = mode }
}

// WithFallback names the source that SidecarAllow calls directly for scope
// while the sidecar cannot be reached, when no call of the scope was
// granted a source yet (otherwise the source its calls last began on is
// used). source is the Attempt's Source (e.g. for Prepare to pick its API
// key), attributes its Attributes (base_url...).
func WithFallback(scope, source string, attributes map[string]string) Option {
	return func(c *clientConfig) {
		if c.fallbacks == nil {
			c.fallbacks = make(map[string]Attempt)
		}
		c.fallbacks[scope] = Attempt{Source: source, Attributes: maps.Clone(attributes), Number: 1}
	}
}

// WithLogger is where the client logs an outage of the sidecar under
// SidecarAllow (once when it begins, once when it ends); slog.Default()
// when nil or not given.
func WithLogger(l *slog.Logger) Option { return func(c *clientConfig) { c.logger = l } }

// modeOf is the configured mode, else the environment's, else SidecarFail.
func (cfg clientConfig) modeOf() (SidecarUnavailable, error) {
	mode, where := cfg.mode, "WithOnSidecarUnavailable"
	if mode == "" {
		mode, where = SidecarUnavailable(os.Getenv(EnvOnSidecarUnavailable)), "$"+EnvOnSidecarUnavailable
	}
	switch mode {
	case "":
		return SidecarFail, nil
	case SidecarFail, SidecarAllow:
		return mode, nil
	}
	return SidecarFail, fmt.Errorf("polygate: %s: %q is not allowed: fail or allow", where, truncate(string(mode), 50))
}

// watch is one client's view of the sidecar's reachability.
type watch struct {
	mode      SidecarUnavailable
	log       *slog.Logger
	fallbacks map[string]Attempt

	mu    sync.Mutex
	first map[string]Attempt // by scope: the grant the scope's last call began on
	down  bool

	ungoverned atomic.Int64
}

func newWatch(cfg clientConfig) *watch {
	w := &watch{fallbacks: cfg.fallbacks, first: make(map[string]Attempt), log: cfg.logger}
	if w.log == nil {
		w.log = slog.Default()
	}
	var err error
	if w.mode, err = cfg.modeOf(); err != nil {
		w.log.Error(err.Error() + "; failing when the sidecar is unreachable")
	}
	return w
}

// began records the first attempt of a call of scope.
func (w *watch) began(scope string, a Attempt) {
	if a.Number > 1 {
		return
	}
	w.mu.Lock()
	w.first[scope] = a
	w.mu.Unlock()
}

// fallback is the direct attempt for scope: the source its calls last
// began on, else the configured fallback. Its CallID and PermitID are
// empty: no sidecar governs it.
func (w *watch) fallback(scope string) (Attempt, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.first[scope]
	if !ok {
		a, ok = w.fallbacks[scope]
	}
	return Attempt{Source: a.Source, Attributes: maps.Clone(a.Attributes), Number: 1, Timeout: a.Timeout}, ok
}

// observe notes an RPC's result: an answer ends an outage, an unreachable
// sidecar begins one; the first and last of an outage are logged.
func (w *watch) observe(err error) {
	reached := err == nil || !unreachable(err)
	w.mu.Lock()
	changed := w.down == reached
	w.down = !reached
	w.mu.Unlock()
	if !changed || w.mode != SidecarAllow {
		return
	}
	if reached {
		w.log.Warn("polygate: the sidecar answers again; calls are governed again", "ungoverned_attempts", w.ungoverned.Load())
		return
	}
	w.log.Warn("polygate: the sidecar is unreachable; attempts go directly to the source each scope's calls last began on, ungoverned, until it answers again",
		"on_sidecar_unavailable", string(SidecarAllow), "err", truncate(err.Error(), 200))
}

// unreachable says whether err means the sidecar could not be reached: a
// gRPC UNAVAILABLE without the sidecar's own ErrorInfo.
func unreachable(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code == codes.Unavailable && se.Reason == ""
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return false
		}
	}
	return true
}

// watchedConn tells the watch how each RPC went.
type watchedConn struct {
	grpc.ClientConnInterface
	w *watch
}

func (c watchedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	c.w.observe(err)
	return err
}

// ungoverned ends a call that found the sidecar unreachable (err) under
// SidecarAllow: an attempt already made stands (a success is returned, else
// err with its value, for Transport to pass its response through); with no
// attempt made, one attempt runs directly on the scope's fallback source,
// counted, and ends the call the same way. With no source to fall back on,
// err stays.
func ungoverned[T any](ctx context.Context, call *callState, fn func(context.Context, Attempt) (T, Result), value T, err error) (T, error) {
	if call.last != nil {
		if call.last.Outcome == Success {
			return value, nil
		}
		return value, err
	}
	a, ok := call.c.watch.fallback(call.scope)
	if !ok {
		return value, err
	}
	call.c.watch.ungoverned.Add(1)
	call.attempts++
	actx, stop := ctx, context.CancelFunc(func() {})
	if a.Timeout > 0 {
		actx, stop = context.WithTimeout(ctx, a.Timeout)
	}
	defer stop()
	value, res := fn(actx, a)
	call.last = &res
	if res.Outcome == Success {
		return value, nil
	}
	return value, err
}

// UngovernedAttempts is how many attempts SidecarAllow made without the
// sidecar so far.
func (c *Client) UngovernedAttempts() int64 { return c.watch.ungoverned.Load() }

// OnSidecarUnavailable is what the client's calls do when the sidecar cannot
// be reached.
func (c *Client) OnSidecarUnavailable() SidecarUnavailable { return c.watch.mode }
