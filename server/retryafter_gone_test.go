package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/polygate/polygate/config"

	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/redisgate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
)

// dialCounter counts the connections a go-redis client dials.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// a RetryAfter whose caller gives up while its read is on
// Redis must not cost the sidecar its Redis connection. Admits and settles
// run under the Backend's own timeout, never a caller's (redisgate's batch.go),
// and shared reads run without the caller's cancellation; a read run inline
// now runs under its caller's context, and with the client as the sidecar
// configures it (ContextTimeoutEnabled) a deadline passing mid-read is a
// socket timeout: go-redis closes the connection (isBadConn), and the next
// operation dials a new one. A client that asks RetryAfter with a deadline
// shorter than a Redis round trip makes the sidecar dial Redis once per RPC.
//
// Redis holds the read (heldRead: CLIENT PAUSE WRITE holds an FCALL of a
// function without no-writes, as peek is, but not CLIENT UNPAUSE) until the
// caller's deadline has passed: the read is on the wire when it gives up.
func TestRetryAfterCallerGoneKeepsRedisConnection(t *testing.T) {
	r := redistest.Start(t)
	dials := &dialCounter{}
	// As internal/sidecar's openRedis: deadlines reach the socket.
	client := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 4})
	client.AddHook(dials)
	t.Cleanup(func() { client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { admin.Close() })
	b, err := redisgate.New(client, redisgate.Options{Timeout: harnessTimeout})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, harnessOpts{backend: b})
	retryAfter := func(ctx context.Context) error {
		_, err := h.srv.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: "other"})
		return err
	}
	for range 2 { // the library loaded, a connection pooled
		if err := retryAfter(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := dials.n.Load()

	err = heldRead(t, h.ctx, admin, 200*time.Millisecond, retryAfter) // (its error: the next test)
	if err := retryAfter(h.ctx); err != nil {
		t.Fatal(err)
	}
	if n := dials.n.Load() - before; n != 0 {
		t.Fatalf("a RetryAfter whose caller gave up mid-read cost %d new Redis connection(s) (answered %v): the read ran under the caller's deadline and go-redis closed its connection", n, err)
	}
}

// heldRead runs call with a context whose deadline passes while Redis holds
// the read (CLIENT PAUSE WRITE from admin, released once the deadline has
// passed), and returns call's error.
func heldRead(t *testing.T, ctx context.Context, admin *redis.Client, deadline time.Duration, call func(context.Context) error) error {
	t.Helper()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", int64(harnessTimeout/time.Millisecond), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		<-gone.Done()
		if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Error(err)
		}
	})
	return call(gone)
}

// A caller's own deadline must not read as Redis being down.
// The sidecar wraps redisgate in fallback; an error wrapping
// gate.ErrUnavailable makes it degraded: the log says "redis backend
// unavailable", the polygate.backend health NOT_SERVING (the admission
// service's too under fail_closed), and under local every decision of the
// sidecar is served by the local backend until a check a PingEvery later.
// A read run under the caller's context put the caller's deadline on the
// socket, which can fire before the context's timer: redisgate.wrap, seeing
// ctx.Err() still nil, sorted the timeout as Redis unavailable, so any
// application client could flip the sidecar by asking RetryAfter with a
// deadline shorter than a Redis read. Reads run without the caller's
// cancellation, and wrap sorts a passed deadline as the caller's.
func TestRetryAfterCallerGoneIsNotRedisDown(t *testing.T) {
	r := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { admin.Close() })
	rb, err := redisgate.New(client, redisgate.Options{Timeout: harnessTimeout})
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int64
	var cause atomic.Value
	fb := fallback.New(rb, fallback.Options{Mode: fallback.Local, PingEvery: harnessTimeout, OnChange: func(degraded bool, err error) {
		changes.Add(1)
		if err != nil {
			cause.Store(err.Error())
		}
	}})
	h := start(t, harnessOpts{backend: fb})
	retryAfter := func(ctx context.Context) error {
		_, err := h.srv.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: "other"})
		return err
	}
	if err := retryAfter(h.ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		err := heldRead(t, h.ctx, admin, 100*time.Millisecond, retryAfter)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("round %d: the caller gone mid-read is answered %v, want its own deadline", round, err)
		}
		if fb.Degraded() || changes.Load() != 0 {
			t.Fatalf("round %d: the sidecar's Redis backend went degraded (%d changes, cause %v) because a RetryAfter's caller gave up", round, changes.Load(), cause.Load())
		}
	}
}

// The shared SourceConfig messages, the zero duration and
// RetryAfter's pre-encoded configuration bytes under everything at once:
// RetryAfter (gRPC and in process, naming sources), DescribeScope (gRPC,
// and in process rendered with protojson as the status page does),
// OverrideBreaker, and reloads that flip the configuration. Under -race;
// every RetryAfter decodes to DescribeScope's configuration of one of the
// two configurations, never both config forms, never a torn one.
func TestSharedConfigsUnderEverything(t *testing.T) {
	yaml := func(timeout string, attr string) string {
		return `
scopes:
  one:
    lease_grace: 1s
    sources: [{name: a, timeout: ` + timeout + `, attributes: {m: ` + attr + `}}, {name: b, timeout: ` + timeout + `}]
`
	}
	rb := redisBackend(t)
	for _, backend := range []struct {
		name string
		b    harnessOpts
	}{{"memory", harnessOpts{}}, {"redis", harnessOpts{backend: rb}}} {
		t.Run(backend.name, func(t *testing.T) {
			o := backend.b
			o.yaml = yaml("5s", "x")
			h := start(t, o)
			var parsed []*config.Config
			for _, y := range []string{yaml("5s", "x"), yaml("11s", "yy")} {
				cfg, err := config.Parse([]byte(y), nil)
				if err != nil {
					t.Fatal(err)
				}
				parsed = append(parsed, cfg)
			}
			want := map[string]bool{}
			for _, c := range parsed {
				for i := range c.Scopes["one"].Sources {
					b, _ := proto.Marshal(sourceConfig(&c.Scopes["one"].Sources[i], c.Scopes["one"].LeaseGrace))
					want[string(b)] = true
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			loop := func(f func(i int)) {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						f(i)
					}
				})
			}
			loop(func(i int) { h.srv.Apply(parsed[i%2]) })
			loop(func(i int) {
				action := []admissionv1.OverrideAction{admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR}[i%2]
				if _, err := h.client.OverrideBreaker(h.ctx, &admissionv1.OverrideBreakerRequest{Scope: "one", Source: "a", Action: action, Actor: "t", Reason: "r"}); err != nil {
					t.Errorf("OverrideBreaker: %v", err)
				}
			})
			loop(func(int) {
				d, err := h.srv.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "one"})
				if err != nil {
					t.Errorf("DescribeScope: %v", err)
					return
				}
				if _, err := protojson.Marshal(d); err != nil {
					t.Error(err)
				}
				if _, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "one"}); err != nil {
					t.Errorf("DescribeScope: %v", err)
				}
			})
			loop(func(int) {
				resp, err := h.srv.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "one", Sources: []string{"b"}})
				if err != nil {
					t.Errorf("RetryAfter: %v", err)
					return
				}
				if _, err := proto.Marshal(resp); err != nil {
					t.Error(err)
				}
			})
			for range 150 {
				resp, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "one"})
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range resp.GetSources() {
					b, _ := proto.Marshal(s.GetConfig())
					if !want[string(b)] || len(s.ProtoReflect().GetUnknown()) != 0 {
						t.Fatalf("RetryAfter's configuration of %s: %v (unknown %x), not one of the configurations'", s.GetName(), s.GetConfig(), s.ProtoReflect().GetUnknown())
					}
				}
			}
			close(stop)
			wg.Wait()
		})
	}
}
