package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

var silentStreams = flag.Int("silent-streams", 2000, "streams TestSilentStreamsAreClosed opens (250 per connection)")

// Streams that open and never send their request (headers, then nothing),
// with no token while auth.token is set, are closed once
// limits.first_message_timeout has passed, and the goroutines they held
// are gone; a call that did send its request and is held in OnNoRunnable
// for longer than that bound is not cut.
func TestSilentStreamsAreClosed(t *testing.T) {
	const (
		bound   = 2 * time.Second
		perConn = 250 // under limits.max_streams_per_connection (256)
		token   = "s3cret-token"
	)
	metricsAddr := freeAddr(t)
	sc := startWith(t, fmt.Sprintf(`
metrics_listen: %s
limits: {first_message_timeout: %s}
auth: {token: %s}
scopes:
  chat:
    quota_full: wait
    backpressure: {stall_window: 300s, poll_interval: 50ms}
    sources: [{name: only, max_concurrency: 1, timeout: 300s}]
`, metricsAddr, bound, token))
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+token)
	c := dial(t, sc.Addr, insecure.NewCredentials())

	// A call held in OnNoRunnable from before the silent streams until
	// after they are closed.
	holder, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || holder.GetGrant() == nil {
		t.Fatalf("Pick: %v %v; want a grant", holder, err)
	}
	waiter, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || waiter.GetNoRunnable() == nil {
		t.Fatalf("Pick: %v %v; want a refusal", waiter, err)
	}
	held := make(chan error, 1)
	heldSince := time.Now()
	go func() {
		d, err := c.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: waiter.GetCallId()})
		if err == nil && !d.GetWait().GetWoken() {
			err = fmt.Errorf("answered %v; want woken by the release", d)
		}
		held <- err
	}()

	conns := (*silentStreams + perConn - 1) / perConn
	silent := make([]*silentConn, conns)
	for i := range silent {
		silent[i] = dialSilent(t, sc.Addr)
	}
	before := scrapeGauges(t, metricsAddr)
	opened := time.Now()
	n := 0
	for _, sconn := range silent {
		k := min(perConn, *silentStreams-n)
		sconn.open(t, k, "/"+admissionv1.AdmissionService_ServiceDesc.ServiceName+"/Pick")
		n += k
	}
	for _, sconn := range silent {
		sconn.sync(t)
	}
	during := scrapeGauges(t, metricsAddr)
	first, last := time.Duration(1<<62), time.Duration(0)
	for _, sconn := range silent {
		f, l := sconn.waitClosed(t, opened.Add(timeout))
		first, last = min(first, f.Sub(opened)), max(last, l.Sub(opened))
	}
	t.Logf("%d silent streams on %d connections: goroutines %v before, %v with them open; closed from %v to %v after the first opened (limits.first_message_timeout %v)",
		n, conns, before["go_goroutines"], during["go_goroutines"], first.Round(time.Millisecond), last.Round(time.Millisecond), bound)
	if first < bound {
		t.Errorf("a silent stream was closed %v after it opened, before the bound %v", first, bound)
	}
	// The streams' goroutines and memory go with them; the connections,
	// still open, keep theirs.
	eventually(t, "the silent streams' goroutines are gone", func() bool {
		return scrapeGauges(t, metricsAddr)["go_goroutines"] <= before["go_goroutines"]+10
	})
	after := scrapeGauges(t, metricsAddr)
	for _, g := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "process_resident_memory_bytes"} {
		t.Logf("%s: %v before, %v with the streams open, %v after", g, before[g], during[g], after[g])
	}

	if _, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: holder.GetCallId(),
		PermitId: holder.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatalf("the call held %v in OnNoRunnable (over the bound %v): %v", time.Since(heldSince).Round(time.Millisecond), bound, err)
	}
}

// silentConn is a raw HTTP/2 connection whose streams send headers and
// nothing else; a reader notes when the server closes each of them.
type silentConn struct {
	conn   net.Conn
	framer *http2.Framer
	wmu    sync.Mutex // framer writes

	mu     sync.Mutex
	opened int
	closed map[uint32]time.Time
	done   chan struct{} // closed when every opened stream is closed
	err    error
	// ready is closed when the server acknowledged the client's settings:
	// it serves the connection (its goroutines run).
	ready chan struct{}
	// pong is sent the ack of the client's ping: the server has read every
	// frame sent before it.
	pong chan struct{}
}

func dialSilent(t *testing.T, addr string) *silentConn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &silentConn{conn: conn, framer: http2.NewFramer(conn, bufio.NewReader(conn)), closed: map[uint32]time.Time{},
		done: make(chan struct{}), ready: make(chan struct{}), pong: make(chan struct{}, 1)}
	s.framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := s.framer.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go s.read()
	select {
	case <-s.ready:
	case <-time.After(timeout):
		t.Fatalf("the server did not acknowledge the settings of a connection within %v", timeout)
	}
	return s
}

// open opens n streams to method: headers with no token, no message.
func (s *silentConn) open(t *testing.T, n int, method string) {
	t.Helper()
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{{":method", http.MethodPost}, {":scheme", "http"}, {":path", method},
		{":authority", s.conn.RemoteAddr().String()}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	s.opened = n
	s.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for i := range n {
		if err := s.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: buf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
}

// sync waits until the server has read every frame sent so far: the ack of
// a ping sent after them.
func (s *silentConn) sync(t *testing.T) {
	t.Helper()
	s.wmu.Lock()
	err := s.framer.WritePing(false, [8]byte{'s', 'y', 'n', 'c'})
	s.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.pong:
	case <-time.After(timeout):
		t.Fatalf("no ping ack within %v", timeout)
	}
}

// read notes each stream the server ends (trailers, or a reset) and answers
// the server's settings and pings.
func (s *silentConn) read() {
	for {
		f, err := s.framer.ReadFrame()
		if err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				s.ended(f.StreamID)
			}
		case *http2.RSTStreamFrame:
			s.ended(f.StreamID)
		case *http2.SettingsFrame:
			if f.IsAck() {
				close(s.ready)
			} else {
				s.wmu.Lock()
				_ = s.framer.WriteSettingsAck()
				s.wmu.Unlock()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				s.pong <- struct{}{}
			} else {
				s.wmu.Lock()
				_ = s.framer.WritePing(true, f.Data)
				s.wmu.Unlock()
			}
		}
	}
}

func (s *silentConn) ended(id uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.closed[id]; ok {
		return
	}
	s.closed[id] = time.Now()
	if len(s.closed) == s.opened {
		close(s.done)
	}
}

// waitClosed waits until the server has closed every stream opened, and
// returns when it closed the first and the last; it fails the test at
// deadline.
func (s *silentConn) waitClosed(t *testing.T, deadline time.Time) (first, last time.Time) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(time.Until(deadline)):
		s.mu.Lock()
		defer s.mu.Unlock()
		t.Fatalf("%d of %d silent streams closed by %v (read: %v)", len(s.closed), s.opened, deadline.Format(time.TimeOnly), s.err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.closed {
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	return first, last
}

// freeAddr is a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeGauges reads the Go runtime's gauges from the sidecar's /metrics.
func scrapeGauges(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out
}
