package redisgate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
)

// fuzzValue turns JSON into what go-redis hands a reply as: arrays,
// integers and strings (anything else is dropped).
func fuzzValue(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = fuzzValue(x)
		}
		return out
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		return v.String()
	case string:
		return v
	}
	return nil
}

// FuzzReplyParser feeds arbitrary replies to every reader of replies: none
// may panic, and what one answers holds its invariants.
func FuzzReplyParser(f *testing.F) {
	notable := `1,1,2,1,5,99,1,"",0,0,"","",0`
	f.Add(`[0,1,0,0,0,5,0,0]`)
	f.Add(`[0,2,0,1,3,9,` + notable + `,3,"x","","",1,1,6,10,` + notable + `,2,2,2,0,2,0,1,1,0,"p",0,"",""]`)
	f.Add(`[1,"m"]`)
	f.Add(`[2]`)
	f.Add(`[1,0,3,4,"w",2,0,0,10,2,0,2,1,1,0,1,1,0,1,100,"",0,"",""]`)
	f.Add(`[0,5,"m",3,1,0,4,4,` + notable + `,1,2,3,0,0,2,"p","h",7,1,"a",1,1,"t",2]`)
	f.Add(`[9,"m",0,0,0,0,0,1,0,0,0,0,0,"",0,1,"a","w",7,0,0,0,2,1,6,0,0,0,0,0,0,"",1,"a","w"]`)
	f.Add(`[0,0,"m"]`)
	f.Fuzz(func(t *testing.T, raw string) {
		var v any
		d := json.NewDecoder(strings.NewReader(raw))
		d.UseNumber()
		if d.Decode(&v) != nil {
			return
		}
		v = fuzzValue(v)
		b := must(New(nil, Options{}))
		srcs := []*gate.Source{gatetest.Src("a"), gatetest.Src("b"), gatetest.Src("c")}
		areq := &gate.AdmitRequest{Scope: "f", PermitID: "p"}
		for _, s := range srcs {
			areq.Candidates = append(areq.Candidates, gate.Candidate{Source: s, Ceiling: 1})
		}
		if out, unmarked, err := b.admission(areq, v); err == nil && unmarked == nil {
			last := -1
			for _, r := range out.Rejections {
				i := indexOf(srcs, r.Source)
				if i <= last || r.Reason == gate.ReasonNone || r.RetryAfter < 0 {
					t.Fatalf("admission %+v from %v", out, v)
				}
				last = i
			}
			if out.Granted && indexOf(srcs, out.Permit.Source) <= last {
				t.Fatalf("granted %s after a rejection of a later candidate: %+v", out.Permit.Source, out)
			}
		}
		if st, err := b.settlement(&gate.SettleRequest{Scope: "f", Source: srcs[0], PermitID: "p"}, v); err == nil && st.Breaker.Fails > st.Breaker.Calls {
			t.Fatalf("settlement %+v", st)
		}
		if snap, err := b.snapshot(&gate.PeekRequest{Scope: "f", Sources: srcs[:1], Line: &gate.LineRead{}}, v); err == nil && len(snap.Sources) != 1 {
			t.Fatalf("snapshot of %d sources for 1", len(snap.Sources))
		}
		_, _ = b.overridden(&gate.OverrideRequest{Scope: "f", Source: srcs[0]}, v)
	})
}

func indexOf(srcs []*gate.Source, name string) int {
	for i, s := range srcs {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
