package server

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/polygate/polygate/gate/redisgate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
)

// redisBackend is a Redis backend on a redis-server of its own.
func redisBackend(tb testing.TB) *redisgate.Backend {
	tb.Helper()
	b, err := redisgate.New(redistest.Start(tb).Client(tb), redisgate.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Each RPC of the sidecar costs exactly one Redis round trip (once the
// scripts are cached): Pick one Admit walk, RecordOutcome one Settle,
// OnNoRunnable one Peek, DescribeScope and RetryAfter one Peek.
func TestOneRedisRoundTripPerRPC(t *testing.T) {
	r := redistest.Start(t)
	counter := &redistest.Recorder{}
	client := redis.NewClient(&redis.Options{Addr: r.Addr})
	client.AddHook(counter)
	t.Cleanup(func() { client.Close() })
	b, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, harnessOpts{backend: b, yaml: strings.Replace(testConfig, "max_live: 3", "max_live: 100", 1)})
	// Warm the script cache: one of each RPC (and the first Pick of a scope
	// looks at its marker: see redisgate's reassert.go).
	for range 2 {
		h.record(t, "chat", h.pick(t, &admissionv1.PickRequest{Scope: "chat"}), admissionv1.Outcome_OUTCOME_TRANSIENT)
	}
	h.record(t, "other", h.pick(t, &admissionv1.PickRequest{Scope: "other"}), admissionv1.Outcome_OUTCOME_SUCCESS)
	p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"}) // refused: the breaker opened
	if _, err := h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.CallId}); err != nil {
		t.Fatal(err)
	}
	counter.Names()

	for _, rpc := range []struct {
		name string
		call func() error
	}{
		{"Pick (grant)", func() error {
			_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other"})
			return err
		}},
		{"Pick + RecordOutcome", func() error {
			p := h.pick(t, &admissionv1.PickRequest{Scope: "other"})
			counter.Names()
			_, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "other", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
			return err
		}},
		{"OnNoRunnable (fail_fast)", func() error {
			p := h.pick(t, &admissionv1.PickRequest{Scope: "chat"})
			counter.Names()
			_, err := h.client.OnNoRunnable(h.ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.CallId})
			return err
		}},
		{"RetryAfter", func() error {
			_, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "chat"})
			return err
		}},
		{"DescribeScope", func() error {
			_, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
			return err
		}},
	} {
		if err := rpc.call(); err != nil {
			t.Fatalf("%s: %v", rpc.name, err)
		}
		if sent := counter.Names(); len(sent) != 1 || sent[0] != "fcall" {
			t.Fatalf("%s sent %v, want one FCALL", rpc.name, sent)
		}
	}
}

// BenchmarkRoundPair measures one attempt over real loopback gRPC — Pick
// (opening a call) then RecordOutcome(SUCCESS) — with the full interceptor
// chain, on the memory and on the Redis backend in one run, serially and with
// parallel clients:
//
//	go test -run '^$' -bench RoundPair -benchmem ./server/
func BenchmarkRoundPair(b *testing.B) {
	rb := redisBackend(b)
	for _, backend := range []struct {
		name string
		opts harnessOpts
	}{{"memory", harnessOpts{}}, {"redis", harnessOpts{backend: rb}}} {
		b.Run(backend.name, func(b *testing.B) {
			backend.opts.yaml, backend.opts.loopback = benchConfig, true
			h := start(b, backend.opts)
			round := func(b *testing.B) {
				p, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "other"})
				if err != nil || p.GetGrant() == nil {
					b.Fatalf("Pick: %v %v", p, err)
				}
				if _, err := h.client.RecordOutcome(h.ctx, &admissionv1.RecordOutcomeRequest{Scope: "other", CallId: p.CallId, PermitId: p.GetGrant().PermitId, Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					round(b)
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						round(b)
					}
				})
			})
		})
	}
}

const benchConfig = `
calls: {max_live: 1000000}
scopes:
  other:
    sources: [{name: a, max_concurrency: 1000000}, {name: b, max_concurrency: 1000000}]
`

// DescribeScope says when Redis lost the scope's state (FLUSHALL stands in
// for a restart without persistence): how many times this replica found it,
// when, how many breakers it re-asserted; nothing before.
func TestDescribeShowsStateLoss(t *testing.T) {
	client := redistest.Start(t).Client(t)
	b, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, harnessOpts{backend: b, stateLoss: b.StateLoss})
	describe := func() *admissionv1.StateLoss {
		t.Helper()
		d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "other"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetScope().GetStateLoss()
	}
	if _, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "other", Source: "only",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "oncall", Reason: "key rotated"}); err != nil {
		t.Fatal(err)
	}
	h.pick(t, &admissionv1.PickRequest{Scope: "other"}) // the first look at the scope's marker
	if l := describe(); l == nil || l.GetCount() != 0 || l.GetLast() != nil || l.GetReassertPending() {
		t.Fatalf("state_loss before any loss: %v, want present and zero", l)
	}
	before := time.Now()
	if err := client.FlushAll(h.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if p := h.pick(t, &admissionv1.PickRequest{Scope: "other"}); p.GetGrant() != nil {
		t.Fatalf("Pick after the loss granted %v: the override this replica saw was not re-asserted first", p.GetGrant())
	}
	l := describe()
	if l.GetCount() != 1 || l.GetRestored() != 1 || l.GetReassertPending() || l.GetLast().AsTime().Before(before.Truncate(time.Second)) {
		t.Fatalf("state_loss after a FLUSHALL: %v, want one loss found after %v, 1 breaker re-asserted, none pending", l, before)
	}
}

// BenchmarkRetryAfter measures the RetryAfter handler and its answer's
// encoding alone (no transport, no interceptor: polygate's own work per RPC) on the memory and on the Redis
// backend, one caller at a time and 64 at once (reads shared), on a scope of
// one source as polybench's, and on one of eight sources:
//
//	go test -run '^$' -bench RetryAfter -benchmem ./server/
func BenchmarkRetryAfter(b *testing.B) {
	rb := redisBackend(b)
	for _, backend := range []struct {
		name string
		opts harnessOpts
	}{{"memory", harnessOpts{}}, {"redis", harnessOpts{backend: rb}}} {
		b.Run(backend.name, func(b *testing.B) {
			backend.opts.yaml = retryAfterBenchConfig
			h := start(b, backend.opts)
			for _, scope := range []string{"one", "eight"} {
				req := &admissionv1.RetryAfterRequest{Scope: scope}
				call := func(b *testing.B) {
					resp, err := h.srv.RetryAfter(h.ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := proto.Marshal(resp); err != nil {
						b.Fatal(err)
					}
				}
				b.Run("sources="+scope+"/serial", func(b *testing.B) {
					for b.Loop() {
						call(b)
					}
				})
				b.Run("sources="+scope+"/parallel=64", func(b *testing.B) {
					b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							call(b)
						}
					})
				})
			}
		})
	}
}

const retryAfterBenchConfig = `
scopes:
  one:
    sources: [{name: only, max_concurrency: 1000, timeout: 60s}]
  eight:
    sources: [{name: s1}, {name: s2}, {name: s3}, {name: s4}, {name: s5}, {name: s6}, {name: s7}, {name: s8}]
`
