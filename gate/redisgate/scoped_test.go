package redisgate_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// seenHook rewrites the seen marker of a batch's admits by permit (seen:
// permit -> the marker to send, keep for the one sent) and keeps each rewritten op's answer in the
// batch's reply (got: permit -> "granted", "refused" or the error), before
// the Backend sees it (an UNMARKED answer makes it re-assert and admit
// again).
type seenHook struct {
	redistest.PassThrough
	seen map[string]string
	mu   sync.Mutex
	got  map[string]string
}

// rewriteSeen is op (a batch's op argument: BATCH_OP, then the admit's
// one argument) with its ADMIT block's seen set to seen, and the op's
// permit; ok false if op is not an admit's.
func rewriteSeen(op []byte, seen func(permit, was string) (string, bool)) (out []byte, permit string, ok bool) {
	u32 := func(at int) (int, bool) {
		if at < 0 || at+4 > len(op) {
			return 0, false
		}
		return int(binary.LittleEndian.Uint32(op[at:])), true
	}
	if len(op) < 12 || math.Float64frombits(binary.LittleEndian.Uint64(op)) != 1 { // kind: opAdmit
		return nil, "", false
	}
	ml, _ := u32(8)
	cl, ok1 := u32(12 + ml)
	p0 := 12 + ml + 4 + cl
	q0, ok2 := u32(p0)
	if !ok1 || !ok2 || q0%4 != 0 {
		return nil, "", false
	}
	a := p0 + q0
	pl, ok3 := u32(a + 8)
	if !ok3 || a+12+pl > len(op) {
		return nil, "", false
	}
	permit = string(op[a+12 : a+12+pl])
	s := a + 12 + pl + 16 // seen's length, after tokens and n
	sl, ok4 := u32(s)
	if !ok4 || s+4+sl > len(op) {
		return nil, "", false
	}
	ns, want := seen(permit, string(op[s+4:s+4+sl]))
	if !want {
		return nil, permit, false
	}
	delta := len(ns) - sl
	out = slices.Clone(op[:s])
	out = binary.LittleEndian.AppendUint32(out, uint32(len(ns)))
	out = append(out, ns...)
	out = append(out, op[s+4+sl:]...)
	for k := 1; k < q0/4; k++ { // the blocks after ADMIT move by delta
		q, _ := u32(p0 + 4*k)
		binary.LittleEndian.PutUint32(out[p0+4*k:], uint32(q+delta))
	}
	return out, permit, true
}

func (h *seenHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 4 || !strings.EqualFold(fmt.Sprint(a[0]), "fcall") || !strings.HasSuffix(fmt.Sprint(a[1]), "_batch") {
			return next(ctx, cmd)
		}
		at := map[int]string{} // the rewritten ops, by their argument's place
		for i := len(a) - 1; i >= 3; i-- {
			op, isOp := a[i].([]byte)
			if !isOp {
				break
			}
			out, permit, ok := rewriteSeen(op, func(p, was string) (string, bool) {
				s, ok := h.seen[p]
				if s == keep {
					s = was
				}
				return s, ok
			})
			if ok {
				a[i] = out
				at[i] = permit
			}
		}
		err := next(ctx, cmd)
		v, _ := cmd.(*redis.Cmd).Val().([]any)
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, permit := range at {
			j := i - (len(a) - len(v)) // its answer's place: the ops are the last arguments
			if j < 0 || j >= len(v) {
				h.got[permit] = "no answer"
				continue
			}
			switch r := v[j].(type) {
			case error:
				h.got[permit] = r.Error()
			case string:
				if len(r) >= 8 && math.Float64frombits(binary.LittleEndian.Uint64([]byte(r))) != 0 {
					h.got[permit] = "granted"
				} else {
					h.got[permit] = "refused"
				}
			default:
				h.got[permit] = fmt.Sprintf("%T", r)
			}
		}
		return err
	}
}

// keep, as a seenHook's marker, sends the op's own.
const keep = "\x00keep"

// TestBatchScopeReadOnceKeepsTheMarker: in one batch an admit of a scope
// it keeps no record of (seen "*": no marker read), then one with the
// scope's marker, then one with a stale marker: granted, granted,
// UNMARKED. The batch's admits read the marker once (CALL.scoped), and
// only after an admit that read it: a "*" admit, which reads the progress
// alone, must not mark it read (review lua9r, finding 2).
func TestBatchScopeReadOnceKeepsTheMarker(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-scoped"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	sh := &seenHook{seen: map[string]string{"p-star": "*", "p-real": keep, "p-stale": "stale"}, got: map[string]string{}}
	c.AddHook(sh)
	src := gatetest.Src("s")
	release, wait := gather(t, b, h, scope, 3,
		func() { _, _ = b.Admit(ctx, admitReq(scope, "p-star", src)) },
		func() { _, _ = b.Admit(ctx, admitReq(scope, "p-real", src)) },
		func() { _, _ = b.Admit(ctx, admitReq(scope, "p-stale", src)) },
	)
	release()
	wait()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.got["p-star"] != "granted" || sh.got["p-real"] != "granted" || !strings.Contains(sh.got["p-stale"], "UNMARKED") {
		t.Fatalf("the batch's answers %q, want p-star and p-real granted, p-stale UNMARKED", sh.got)
	}
}
