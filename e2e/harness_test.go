package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// timeout bounds every test's waiting: conditions are awaited until it, never
// slept for.
const timeout = 60 * time.Second

func TestMain(m *testing.M) { sidecartest.Main(m) }

// sidecar is a running sidecar process.
type sidecar struct {
	addr string
	raw  admissionv1.AdmissionServiceClient
}

// startSidecar writes config to a file and starts the real binary on a free
// port (internal/sidecartest); it is stopped when the test ends.
func startSidecar(t *testing.T, config string) *sidecar {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := sidecartest.Start(t, []string{"--config", file, "--listen", "127.0.0.1:0"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", sc.Logs())
		}
	})
	conn, err := grpc.NewClient(sc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &sidecar{addr: sc.Addr, raw: admissionv1.NewAdmissionServiceClient(conn)}
}

// client dials the sidecar with the Go SDK.
func (s *sidecar) client(t *testing.T) *polygate.Client {
	t.Helper()
	c, err := polygate.Dial(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// loggedClient dials the sidecar with the Go SDK through a connection
// whose RPCs and answers are recorded.
func (s *sidecar) loggedClient(t *testing.T) (*polygate.Client, *answers) {
	t.Helper()
	log := &answers{}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(log.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return polygate.New(conn), log
}

// answers records each RPC a client makes and what the sidecar answered,
// so that tests assert answers (reasons, retry_after, what the sidecar
// slept) rather than wall-clock times.
type answers struct {
	mu      sync.Mutex
	rpcs    []string
	replies []any
}

func (a *answers) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rpcs = append(a.rpcs, method[strings.LastIndex(method, "/")+1:])
	if err != nil {
		reply = err
	}
	a.replies = append(a.replies, reply)
	return err
}

// take returns the RPCs made since the last take (method names) and their
// answers (the reply, or the error).
func (a *answers) take() ([]string, []any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rpcs, replies := a.rpcs, a.replies
	a.rpcs, a.replies = nil, nil
	return rpcs, replies
}

// replyOf is an answer as a T (the zero T if it is not one).
func replyOf[T any](reply any) T {
	r, _ := reply.(T)
	return r
}

// lastReply is the last answer to the RPC named name, if it was a T.
func lastReply[T any](rpcs []string, replies []any, name string) (T, bool) {
	for i := len(rpcs) - 1; i >= 0; i-- {
		if rpcs[i] == name {
			r, ok := replies[i].(T)
			return r, ok
		}
	}
	var zero T
	return zero, false
}

// source reads one source's live state.
func (s *sidecar) source(t *testing.T, scope, name string) *admissionv1.SourceState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d, err := s.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range d.GetScope().GetSources() {
		if src.GetName() == name {
			return src
		}
	}
	t.Fatalf("scope %s has no source %s", scope, name)
	return nil
}

// liveCalls reads how many calls of the scope the sidecar holds open.
func (s *sidecar) liveCalls(t *testing.T, scope string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d, err := s.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return d.GetScope().GetLiveCalls()
}

// retryAfter is the earliest certain retry moment of the named sources.
func (s *sidecar) retryAfter(t *testing.T, scope string, sources ...string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := s.raw.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: scope, Sources: sources})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetRetryAfter().AsDuration()
}

// eventually polls cond until it holds or the test's timeout passes. It is
// for state only the sidecar can report (a breaker's state), which has no
// change notification over the admission API.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// attempt is what an application's fn does: one real HTTP request to the
// granted source's base_url, classified with the SDK. It records the grants
// it ran under.
type attempt struct {
	mu     sync.Mutex
	grants []polygate.Attempt
	starts []time.Time
	ends   []time.Time
}

// fn returns the upstream's answer: the response body.
func (a *attempt) fn(ctx context.Context, g polygate.Attempt) ([]byte, polygate.Result) {
	a.mu.Lock()
	a.grants = append(a.grants, g)
	a.starts = append(a.starts, time.Now())
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.ends = append(a.ends, time.Now())
		a.mu.Unlock()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.Attributes["base_url"]+"/chat/completions", strings.NewReader(`{"model":"x"}`))
	if err != nil {
		return nil, polygate.Result{Outcome: polygate.ClientError, Detail: err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, polygate.ResultOf(nil, nil, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return body, polygate.ResultOf(resp, body, err)
}

func (a *attempt) log() ([]polygate.Attempt, []time.Time, []time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]polygate.Attempt(nil), a.grants...), append([]time.Time(nil), a.starts...), append([]time.Time(nil), a.ends...)
}

// newUpstream starts the fake provider for a test.
func newUpstream(t *testing.T) *upstream.Server {
	t.Helper()
	up := upstream.New()
	t.Cleanup(up.Close)
	return up
}

// assertSpacing checks that consecutive requests are at least min apart, less
// the millisecond the breaker's clock counts in (it opens at the current
// whole millisecond).
func assertSpacing(t *testing.T, what string, reqs []upstream.Received, min time.Duration) {
	t.Helper()
	for i := 1; i < len(reqs); i++ {
		if gap := reqs[i].At.Sub(reqs[i-1].At); gap < min-time.Millisecond {
			t.Errorf("%s: requests %d and %d were %v apart; want at least %v", what, i, i+1, gap, min)
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}
