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
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// rejHook rewrites the rejections (ADMIT_R's fourth field, a string after
// three numbers) of the reply of every admit called alone while rewrite is
// set: what a buggy script or a compromised Redis could answer.
type rejHook struct {
	redistest.PassThrough
	mu      sync.Mutex
	rewrite func(rej string) string
}

func (h *rejHook) set(f func(string) string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rewrite = f
}

func (h *rejHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		h.mu.Lock()
		f := h.rewrite
		h.mu.Unlock()
		if err != nil || f == nil || len(a) < 2 || !strings.HasSuffix(fmt.Sprint(a[1]), "_admit") {
			return err
		}
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return err
		}
		s, ok := c.Val().(string)
		if !ok || len(s) < 28 {
			return err
		}
		n := int(binary.LittleEndian.Uint32([]byte(s[24:28])))
		rej := f(s[28 : 28+n])
		c.SetVal(s[:24] + string(binary.LittleEndian.AppendUint32(nil, uint32(len(rej)))) + rej + s[28+n:])
		return nil
	}
}

// rejRecord is a packed REJ record (src, reason, retry: doubles).
func rejRecord(src, reason int, retry float64) string {
	var b []byte
	for _, v := range []float64{float64(src), float64(reason), retry} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// TestAdmitHostileRejections: what admit.lua answers has at most one rejection per candidate, in candidate
// order, and none for the granted candidate or any after it; a reply with
// more rejections than candidates, or a rejection of the candidate it
// grants, is a bug or a compromised Redis and must be refused (the parser
// refuses every other malformed reply), not answered to the caller. A
// retry is a number of milliseconds within int64: read as a Duration it
// must saturate, never wrap, and a negative one is refused.
func TestAdmitHostileRejections(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	h := &rejHook{}
	c.AddHook(h)
	b := newBackend(t, c, redisgate.Options{})

	// refused: a source whose one slot is held; its Admit has one
	// rejection (candidate 1) to rewrite.
	refused := func(t *testing.T, scope string, rewrite func(string) string) (gate.Admission, error) {
		src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		if a := admit(t, ctx, b, scope, "hold", src); !a.Granted {
			t.Fatalf("the first admit was refused: %+v", a)
		}
		h.set(rewrite)
		defer h.set(nil)
		return b.Admit(ctx, admitReq(scope, "x", src))
	}

	t.Run("more rejections than candidates", func(t *testing.T) {
		a, err := refused(t, "rej-more", func(r string) string { return r + r + r })
		if err == nil {
			t.Errorf("an admit of 1 candidate answered %d rejections, want an error: %+v", len(a.Rejections), a.Rejections)
		}
	})
	t.Run("retry beyond a Duration", func(t *testing.T) {
		a, err := refused(t, "rej-huge", func(r string) string { return rejRecord(1, 1, 1<<62) })
		if err == nil && (len(a.Rejections) != 1 || a.Rejections[0].RetryAfter != time.Duration(math.MaxInt64)) {
			t.Errorf("a retry of 2^62 ms read as %v, want it saturated (%v) or an error", a.Rejections, time.Duration(math.MaxInt64))
		}
	})
	t.Run("negative retry", func(t *testing.T) {
		a, err := refused(t, "rej-neg", func(r string) string { return rejRecord(1, 1, -1000) })
		if err == nil && (len(a.Rejections) != 1 || a.Rejections[0].RetryAfter < 0) {
			t.Errorf("a retry of -1000 ms read as %v, want none negative or an error", a.Rejections)
		}
	})
	t.Run("a grant rejecting its own candidate", func(t *testing.T) {
		src := gatetest.Src("s")
		h.set(func(string) string { return rejRecord(1, 1, 0) })
		a, err := b.Admit(ctx, admitReq("rej-grant", "x", src))
		h.set(nil)
		if err == nil && a.Granted && len(a.Rejections) != 0 {
			t.Errorf("an admit granted candidate 1 and rejected it too: %+v", a)
		}
	})
}

// confBlocks splits a CONF argument into its scope's channel and scope
// (CONF_H: idle_ttl, channel, scope) and its SRC_CONF blocks' names (a
// name, then eleven numbers), failing t on a cut block.
