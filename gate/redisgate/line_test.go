package redisgate_test

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestLineSameAsMemory: random line traces (joins, reads, picks, handoffs,
// leaves, replicas going silent) on the memory backend and on Redis, every
// answer compared.
func TestLineSameAsMemory(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	seeds := 50 // 150 found nothing more when written
	for seed := range seeds {
		clock := gatetest.NewClock()
		mem := inmem.New(clock.Now)
		rg, err := redisgate.New(client, redisgate.Options{Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		bs := []gate.Backend{mem, rg}
		scope := fmt.Sprint("line-", seed)
		rng := rand.New(rand.NewSource(int64(seed)))
		src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 + rng.Intn(3) })
		nW := 8 + rng.Intn(40)
		replicas := []string{"r1", "r2", "r3", "r4"}
		leases := map[string]time.Duration{}
		for _, r := range replicas {
			leases[r] = time.Duration(100+rng.Intn(900)) * time.Millisecond
		}
		type wst struct {
			w      *gate.Waiter
			places [2]map[string]string
		}
		ws := make([]*wst, nW)
		for i := range ws {
			r, tenant := replicas[rng.Intn(len(replicas))], rng.Intn(4)
			ws[i] = &wst{w: &gate.Waiter{ID: fmt.Sprint("w", i), Replica: r, Priority: int32(rng.Intn(2)), Tenant: fmt.Sprint("t", tenant), Named: tenant == 0,
				Weight: 1 + rng.Intn(2), OtherWeight: 1, MaxTenants: 2, Lease: leases[r]}}
		}
		var held [][2]gate.Permit
		var log []string
		fail := func(i int, what string, a, b any) {
			t.Fatalf("seed %d op %d %s:\nmem %+v\nrg  %+v\nlog:\n%s", seed, i, what, a, b, strings.Join(log, "\n"))
		}
		nOps := 60 + rng.Intn(80)
		pid := 0
		for i := range nOps {
			switch op := rng.Intn(10); {
			case op < 3: // join (a peek of a waiter)
				x := ws[rng.Intn(nW)]
				var vs [2]gate.LineView
				jdesc := rng.Intn(2) == 0
				for j, b := range bs {
					w := *x.w
					w.Places = x.places[j]
					w.Place = x.places[j]["s"]
					s, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src},
						Line: &gate.LineRead{Replica: w.Replica, Lease: w.Lease, Join: &w, Joins: []string{"s"}, Describe: jdesc}})
					if err != nil {
						t.Fatal(err)
					}
					vs[j] = s.Sources[0].Line
					x.places[j] = map[string]string{"s": vs[j].Place}
				}
				log = append(log, fmt.Sprintf("join %s (%s): %+v", x.w.ID, x.w.Replica, vs[0]))
				// describe random per backend would differ: redo same choice
				if !reflect.DeepEqual(vs[0], vs[1]) {
					fail(i, "join", vs[0], vs[1])
				}
			case op < 5: // read by a replica
				r := replicas[rng.Intn(len(replicas))]
				desc := rng.Intn(2) == 0
				var vs [2]gate.LineView
				for j, b := range bs {
					s, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src},
						Line: &gate.LineRead{Replica: r, Lease: leases[r], Describe: desc}})
					if err != nil {
						t.Fatal(err)
					}
					vs[j] = s.Sources[0].Line
				}
				log = append(log, fmt.Sprintf("read %s: %+v", r, vs[0]))
				if !reflect.DeepEqual(vs[0], vs[1]) {
					fail(i, "read", vs[0], vs[1])
				}
			case op < 7: // pick
				x := ws[rng.Intn(nW)]
				pid++
				var as [2]gate.Admission
				for j, b := range bs {
					w := *x.w
					w.Places = x.places[j]
					a, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("p", pid), Line: &w,
						Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}})
					if err != nil {
						t.Fatal(err)
					}
					as[j] = a
					x.places[j] = a.Places
				}
				log = append(log, fmt.Sprintf("pick %s: granted %v %+v places %v", x.w.ID, as[0].Granted, as[0].Rejections, as[0].Places))
				if as[0].Granted != as[1].Granted || !reflect.DeepEqual(as[0].Rejections, as[1].Rejections) || !(len(as[0].Places) == 0 && len(as[1].Places) == 0 || reflect.DeepEqual(as[0].Places, as[1].Places)) {
					fail(i, "pick", as[0], as[1])
				}
				if as[0].Granted {
					held = append(held, [2]gate.Permit{as[0].Permit, as[1].Permit})
				}
			case op < 8: // settle with a handoff
				if len(held) == 0 {
					continue
				}
				k := rng.Intn(len(held))
				p := held[k]
				held = append(held[:k], held[k+1:]...)
				r := replicas[rng.Intn(len(replicas))]
				var ss [2]gate.Settlement
				for j, b := range bs {
					s, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: p[j].ID, Epoch: p[j].Epoch, Verdict: gate.VerdictSuccess,
						ActualTokens: -1, Line: &gate.LineHandoff{Replica: r, Lease: leases[r]}})
					if err != nil {
						t.Fatal(err)
					}
					ss[j] = s
				}
				log = append(log, fmt.Sprintf("settle by %s: handoff %q", r, ss[0].Handoff))
				if ss[0].Handoff != ss[1].Handoff || ss[0].Released != ss[1].Released {
					fail(i, "settle", ss[0], ss[1])
				}
			case op < 9: // leave
				x := ws[rng.Intn(nW)]
				for j, b := range bs {
					if err := b.Leave(ctx, gate.LeaveRequest{Scope: scope, Waiter: x.w.ID, Sources: []string{"s"}}); err != nil {
						t.Fatal(err)
					}
					x.places[j] = nil
				}
				log = append(log, "leave "+x.w.ID)
			default:
				d := time.Duration(rng.Intn(700)) * time.Millisecond
				clock.Advance(d)
				log = append(log, fmt.Sprint("advance ", d))
			}
		}
	}
}

// TestLineFrontWalkPages seeds a line of n waiters of which those at the
// given ranks belong to a silent replica, and checks Redis against memory.
func TestLineFrontWalkPages(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, n := range []int{1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 300, 600} {
		for pat := range 6 {
			clock := gatetest.NewClock()
			mem := inmem.New(clock.Now)
			rg, err := redisgate.New(client, redisgate.Options{Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			scope := fmt.Sprint("pages-", n, "-", pat)
			src := gatetest.Src("s")
			gone := func(i int) bool {
				switch pat {
				case 0:
					return true
				case 1:
					return i != n-1
				case 2:
					return i&(i+1) == 0 || i == 0 // ranks 0,1,3,7,...: ends of pages
				case 3:
					return i%2 == 1
				case 4:
					return i < n/2
				}
				return i != 0 && i&(i-1) == 0 // 1,2,4,8: starts of pages
			}
			for _, b := range []gate.Backend{mem, rg} {
				for i := range n {
					r := "live"
					if gone(i) {
						r = "gone"
					}
					w := &gate.Waiter{ID: fmt.Sprintf("w%04d", i), Replica: r, Tenant: "t", Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Second}
					_, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src},
						Line: &gate.LineRead{Replica: r, Lease: time.Second, Join: w, Joins: []string{"s"}}})
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			clock.Advance(1500 * time.Millisecond)
			var vs [2]gate.LineView
			for j, b := range []gate.Backend{mem, rg} {
				// A handoff calls the first live; then reads.
				p, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "p", Candidates: []gate.Candidate{{Source: src, Ceiling: 100}}})
				if err != nil || !p.Granted {
					t.Fatal(err, p)
				}
				s, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: "p", Epoch: p.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1,
					Line: &gate.LineHandoff{Replica: "live", Lease: time.Second}})
				if err != nil {
					t.Fatal(err)
				}
				v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src},
					Line: &gate.LineRead{Replica: "live", Lease: time.Second, Describe: true}})
				if err != nil {
					t.Fatal(err)
				}
				vs[j] = v.Sources[0].Line
				vs[j].Head = s.Handoff + "/" + vs[j].Head
			}
			if !reflect.DeepEqual(vs[0], vs[1]) {
				t.Fatalf("n %d pat %d: mem %+v rg %+v", n, pat, vs[0], vs[1])
			}
			if pat == 0 {
				keys := must(client.Keys(ctx, "*{"+scope+"}*").Result())(t)
				for _, k := range keys {
					if strings.Contains(k, ":line") || strings.Contains(k, ":waiters") {
						t.Errorf("n %d: key %s left after the line emptied", n, k)
					}
				}
			}
		}
	}
	_ = redis.Nil
}
