package redisgate_test

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

func confBlocks(t *testing.T, conf []byte) (channel, scope string, srcs []string) {
	t.Helper()
	str := func() string {
		if len(conf) < 4 {
			t.Fatalf("CONF argument cut in a length: %q", conf)
		}
		n := int(binary.LittleEndian.Uint32(conf))
		if len(conf) < 4+n {
			t.Fatalf("CONF argument cut in a string of %d", n)
		}
		s := string(conf[4 : 4+n])
		conf = conf[4+n:]
		return s
	}
	num := func(k int) {
		if len(conf) < 8*k {
			t.Fatalf("CONF argument cut in its numbers")
		}
		conf = conf[8*k:]
	}
	num(1)
	channel, scope = str(), str()
	for len(conf) > 0 {
		srcs = append(srcs, str())
		num(11)
	}
	return channel, scope, srcs
}

// TestPooledLoneCallsSendTheirOwnConf: calls alone, one after the
// other, reuse one pooled op (its CONF buffer and block ends, its keys and
// sources): an admit of 30 candidates with long names, then one of 1
// candidate, a settle, an admit of 2 in another scope. Each call's CONF
// argument is exactly its scope's block and one SRC_CONF per candidate
// (its source's), nothing left of the previous op; its keys are its own
// (the scope's and 6 per candidate).
func TestPooledLoneCallsSendTheirOwnConf(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	rec := &redistest.Recorder{}
	c.AddHook(rec)
	b := newBackend(t, c, redisgate.Options{})
	warm := gatetest.Src("warm")
	for _, scope := range []string{"pool-conf-a", "pool-conf-b", "p"} {
		settle(t, ctx, b, scope, warm, admit(t, ctx, b, scope, "warm", warm).Permit, gate.VerdictSuccess)
	}
	rec.Take() // the library's load, each scope's first admit's repetition (UNMARKED)
	var many []*gate.Source
	for i := range 30 {
		many = append(many, gatetest.Src(fmt.Sprintf("many-%02d-%s", i, strings.Repeat("x", 100)), func(s *gate.Source) { s.Limits.MaxConcurrency = 0 }))
	}
	one := gatetest.Src("one")
	two := gatetest.Src("two", func(s *gate.Source) { s.Limits.RPM = 7 })
	type want struct {
		fn, scope string
		srcs      []string
	}
	var wants []want
	names := func(ss ...*gate.Source) (out []string) {
		for _, s := range ss {
			out = append(out, s.Name)
		}
		return out
	}
	_, _ = b.Admit(ctx, admitReq("pool-conf-a", "p1", many...))
	wants = append(wants, want{"_admit", "pool-conf-a", names(many...)})
	a := must(b.Admit(ctx, admitReq("pool-conf-b", "p2", one)))(t)
	wants = append(wants, want{"_admit", "pool-conf-b", names(one)})
	must(b.Settle(ctx, settleReq("pool-conf-b", one, a.Permit, gate.VerdictSuccess)))(t)
	wants = append(wants, want{"_settle", "pool-conf-b", names(one)})
	_, _ = b.Admit(ctx, admitReq("p", "p3", two, one))
	wants = append(wants, want{"_admit", "p", names(two, one)})

	_, args := rec.Take()
	k := 0
	for _, a := range args {
		if len(a) < 3 || !strings.EqualFold(fmt.Sprint(a[0]), "fcall") {
			continue
		}
		fn := fmt.Sprint(a[1])
		if !strings.HasSuffix(fn, "_admit") && !strings.HasSuffix(fn, "_settle") {
			continue
		}
		if k == len(wants) {
			t.Fatalf("more calls than made: %s", fn)
		}
		w := wants[k]
		k++
		if !strings.HasSuffix(fn, w.fn) {
			t.Fatalf("call %d is %s, want %s", k, fn, w.fn)
		}
		nkeys, _ := a[2].(int64)
		if n, ok := a[2].(int); ok {
			nkeys = int64(n)
		}
		if int(nkeys) != len(a)-5 {
			t.Fatalf("call %d: %d keys and %d arguments, want 2 arguments", k, nkeys, len(a)-3-int(nkeys))
		}
		conf, _ := a[len(a)-1].([]byte)
		channel, scope, srcs := confBlocks(t, conf)
		if scope != w.scope || !strings.Contains(channel, "{"+w.scope+"}") || !slices.Equal(srcs, w.srcs) {
			t.Errorf("call %d (%s of %s): CONF of scope %q, channel %q, sources %q; want %q", k, fn, w.scope, scope, channel, srcs, w.srcs)
		}
		for _, key := range a[3 : 3+nkeys] {
			if !strings.Contains(fmt.Sprint(key), "{"+w.scope+"}") {
				t.Errorf("call %d: key %v of another scope than %s", k, key, w.scope)
			}
		}
	}
	if k != len(wants) {
		t.Fatalf("%d calls recorded, want %d", k, len(wants))
	}
}
