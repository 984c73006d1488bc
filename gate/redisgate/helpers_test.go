package redisgate_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

func must[T any](v T, err error) func(t testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// callHook is a go-redis hook on the calls of the library's function: it
// counts their ops, can hold the next call until released, and can make
// calls fail as a Redis that does not answer would.
type callHook struct {
	redistest.PassThrough
	mu    sync.Mutex
	sizes []int
	hold  chan struct{} // set: the next call waits until it is closed
	held  chan struct{} // closed once that call waits
	fail  bool          // calls wait for their deadline and fail
}

func (h *callHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 3 || !strings.EqualFold(toString(a[0]), "fcall") || toString(a[1]) != redisgate.Function {
			return next(ctx, cmd)
		}
		nkeys, _ := a[2].(int)
		h.mu.Lock()
		h.sizes = append(h.sizes, countOps(a[3+nkeys:]))
		hold, held, fail := h.hold, h.held, h.fail
		h.hold = nil
		h.mu.Unlock()
		if hold != nil {
			close(held)
			<-hold
		}
		if fail {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

// countOps counts the ops of a call's ARGV (wire.go): its numbers (the
// header's, then each op's: kind, count of numbers, count of strings,
// numbers) and its strings.
func countOps(argv []any) int {
	b := argv[0].([]byte)
	x := make([]float64, len(b)/8)
	for i := range x {
		x[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	n := 0
	for i := 4 + 12*int(x[2]) + 6*int(x[3]); i < len(x); i += 3 + int(x[i+1]) {
		n++
	}
	return n
}

func toString(v any) string {
	s, _ := v.(string)
	return s
}

// holdNext makes the next call wait; it returns a channel closed once the
// call waits, and release.
func (h *callHook) holdNext() (held <-chan struct{}, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hold, h.held = make(chan struct{}), make(chan struct{})
	hold := h.hold
	return h.held, func() { close(hold) }
}

func (h *callHook) failing(fail bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail = fail
}

func (h *callHook) takeSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sizes
	h.sizes = nil
	return s
}

func newBackend(t *testing.T, c redis.UniversalClient, o redisgate.Options) *redisgate.Backend {
	t.Helper()
	return must(redisgate.New(c, o))(t)
}

func admit(t *testing.T, ctx context.Context, b gate.Backend, scope, id string, srcs ...*gate.Source) gate.Admission {
	t.Helper()
	return must(b.Admit(ctx, admitReq(scope, id, srcs...)))(t)
}

func settle(t *testing.T, ctx context.Context, b gate.Backend, scope string, src *gate.Source, p gate.Permit, v gate.Verdict) gate.Settlement {
	t.Helper()
	return must(b.Settle(ctx, settleReq(scope, src, p, v)))(t)
}

func peek(t *testing.T, ctx context.Context, b gate.Backend, scope string, src *gate.Source) gate.SourceView {
	t.Helper()
	return must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}}))(t).Sources[0]
}

// openBreaker trips src's breaker with fail_threshold consecutive failures
// and returns the settlement that opened it.
func openBreaker(t *testing.T, ctx context.Context, b gate.Backend, scope string, src *gate.Source) gate.Settlement {
	t.Helper()
	var s gate.Settlement
	for i := range src.Breaker.FailThreshold {
		a := admit(t, ctx, b, scope, fmt.Sprintf("fail-%d-%d", time.Now().UnixNano(), i), src)
		if !a.Granted {
			t.Fatalf("failure %d refused: %+v", i, a.Rejections)
		}
		s = settle(t, ctx, b, scope, src, a.Permit, gate.VerdictFailure)
	}
	if s.Breaker.State != gate.Open {
		t.Fatalf("after %d failures: %+v", src.Breaker.FailThreshold, s.Breaker)
	}
	return s
}
