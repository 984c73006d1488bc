package kit

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// Event is one thing the fake saw: an RPC or an upstream request.
type Event struct {
	// Step is the script's step it was matched against (-1: none left).
	Step int `json:"step"`
	// What: the RPC's name, or "upstream SOURCE METHOD PATH".
	What string  `json:"what"`
	AtMs float64 `json:"at_ms"`
}

// Report is what the fake saw of an exchange.
type Report struct {
	// Mismatches: every difference between what the SDK did and the
	// script, and every step that never came. Empty: the SDK conformed.
	Mismatches []string `json:"mismatches"`
	Events     []Event  `json:"events"`
}

// Fake is the scripted sidecar and upstream of one exchange at a time.
type Fake struct {
	mu      sync.Mutex
	ex      *Exchange
	start   time.Time
	next    int  // the script's next step
	broken  bool // an event came that the script does not have: the rest is noise
	events  []Event
	miss    []string
	mark    time.Time // the previous step's reply (or a hang's arrival)
	calls   int
	callID  string
	permits int
	permit  string
	attempt int32
	changed chan struct{} // closed and replaced on every event
	done    chan struct{} // closed when the exchange ends: releases hangs

	grpc     *grpc.Server
	upstream *httptest.Server
}

// Endpoints are where an exchange's SDK client and fallback point.
type Endpoints struct {
	// Sidecar is the gRPC address (host:port).
	Sidecar string `json:"sidecar"`
	// Upstream is the fake upstream's URL; a source's route is Upstream + "/" + name.
	Upstream string `json:"upstream"`
	// TLS, for an exchange whose client uses TLS: the PEMs to trust and present.
	TLS *TLSFiles `json:"tls,omitempty"`
}

// Begin ends the current exchange (if any) and serves ex on fresh ports.
func (f *Fake) Begin(ex *Exchange) (Endpoints, error) {
	f.End()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Endpoints{}, err
	}
	var opts []grpc.ServerOption
	var files *TLSFiles
	if ex.Client.TLS != "" {
		creds, tf, err := serverTLS(ex.Client.TLS == "mtls")
		if err != nil {
			lis.Close()
			return Endpoints{}, err
		}
		opts, files = append(opts, grpc.Creds(creds)), tf
	}
	opts = append(opts, grpc.UnaryInterceptor(f.checkToken))
	srv := grpc.NewServer(opts...)
	admissionv1.RegisterAdmissionServiceServer(srv, &admission{f: f})
	up := httptest.NewServer(http.HandlerFunc(f.serveUpstream))
	f.mu.Lock()
	f.ex, f.start, f.next, f.broken = ex, time.Now(), 0, false
	f.events, f.miss, f.mark = nil, nil, time.Now()
	f.calls, f.callID, f.permits, f.permit, f.attempt = 0, "", 0, "", 0
	f.changed, f.done = make(chan struct{}), make(chan struct{})
	f.grpc, f.upstream = srv, up
	f.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return Endpoints{Sidecar: lis.Addr().String(), Upstream: up.URL, TLS: files}, nil
}

// checkToken records, as a mismatch, an RPC whose authorization is not the
// exchange's token; the RPC is then served as usual.
func (f *Fake) checkToken(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var got string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			got = v[0]
		}
	}
	f.mu.Lock()
	want := ""
	if f.ex != nil && f.ex.Client.Token != "" {
		want = "Bearer " + f.ex.Client.Token
	}
	if got != want {
		name := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		f.miss = append(f.miss, fmt.Sprintf("%s: authorization %q, want %q", name, got, want))
	}
	f.mu.Unlock()
	return handler(ctx, req)
}

// StopSidecar stops the exchange's gRPC server: from its return on, the
// address refuses connections.
func (f *Fake) StopSidecar() {
	f.mu.Lock()
	srv := f.grpc
	f.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// End stops the current exchange's servers and releases its hangs. The
// servers stay in f (stopped) so that a handler still running reads them
// safely; a nil done marks the exchange ended.
func (f *Fake) End() {
	f.mu.Lock()
	srv, up, done := f.grpc, f.upstream, f.done
	f.done = nil
	f.mu.Unlock()
	if done == nil {
		return // none begun, or ended already
	}
	close(done)
	srv.Stop()
	up.CloseClientConnections()
	up.Close()
}

// WaitEvents waits until the exchange has seen at least n events.
func (f *Fake) WaitEvents(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		got, changed := len(f.events), f.changed
		f.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d events, waiting for %d: %w", got, n, ctx.Err())
		}
	}
}

// Result waits until every step came (or a mismatch broke the script, or
// ctx ends) and reports what the fake saw.
func (f *Fake) Result(ctx context.Context) Report {
	for {
		f.mu.Lock()
		finished := f.ex == nil || f.broken || f.next >= len(f.ex.Script)
		changed := f.changed
		if finished || ctx.Err() != nil {
			r := Report{Mismatches: slices.Clone(f.miss), Events: slices.Clone(f.events)}
			if f.ex != nil && !f.broken {
				for i := f.next; i < len(f.ex.Script); i++ {
					r.Mismatches = append(r.Mismatches, fmt.Sprintf("step %d (%s): never came", i, f.ex.Script[i].what()))
				}
			}
			if r.Mismatches == nil {
				r.Mismatches = []string{}
			}
			f.mu.Unlock()
			return r
		}
		f.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
}

func (s *Step) what() string {
	if s.RPC != "" {
		return s.RPC
	}
	return "upstream " + s.Upstream
}

// arrive matches an event against the next step. It returns the step (nil
// when the event is not the script's) and the exchange's done channel; the
// caller checks the request with check, which reports mismatches.
func (f *Fake) arrive(what, rpc, source string, check func(s *Step) []string) (*Step, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	ev := Event{Step: -1, What: what, AtMs: float64(now.Sub(f.start).Microseconds()) / 1000}
	defer func() {
		f.events = append(f.events, ev)
		close(f.changed)
		f.changed = make(chan struct{})
	}()
	if f.ex == nil || f.broken {
		return nil, f.done
	}
	if f.next >= len(f.ex.Script) {
		f.miss = append(f.miss, fmt.Sprintf("%s after the script's end", what))
		f.broken = true
		return nil, f.done
	}
	i, s := f.next, &f.ex.Script[f.next]
	ev.Step = i
	if s.RPC != rpc || s.Upstream != source {
		f.miss = append(f.miss, fmt.Sprintf("step %d: got %s, want %s", i, what, s.what()))
		f.broken = true
		return nil, f.done
	}
	f.next++
	if gap := now.Sub(f.mark); s.AfterMs > 0 && gap < time.Duration(s.AfterMs-1)*time.Millisecond {
		f.miss = append(f.miss, fmt.Sprintf("step %d (%s): came %v after the previous step, want at least %d ms", i, s.what(), gap.Round(time.Microsecond), s.AfterMs))
	}
	for _, m := range check(s) {
		f.miss = append(f.miss, fmt.Sprintf("step %d (%s): %s", i, s.what(), m))
	}
	f.mark = now
	return s, f.done
}

// replied marks the moment a step's reply leaves: the start of the next
// step's after_ms.
func (f *Fake) replied() {
	f.mu.Lock()
	f.mark = time.Now()
	f.mu.Unlock()
}

func differ[T comparable](field string, got, want T) []string {
	if got == want {
		return nil
	}
	return []string{fmt.Sprintf("%s = %v, want %v", field, got, want)}
}
