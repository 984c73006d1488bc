package metrics

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RPC counts and times gRPC RPCs as go-grpc-middleware's ServerMetrics
// (providers/prometheus) does with its handling-time histogram: the same
// families, help, labels and values (grpc_server_started_total,
// grpc_server_handled_total, grpc_server_msg_received_total,
// grpc_server_msg_sent_total, grpc_server_handling_seconds), which
// dashboards of gRPC servers read. Its interceptors find a method's series
// with one map read: they are resolved once per method (Initialize), where
// go-grpc-middleware's builds and hashes the label values of five series on
// every RPC (6.5–7.3% of the sidecar's CPU at 64 callers,
// docs/performance.md). They do not keep the request: a call held in
// OnNoRunnable keeps its interceptors' frames as long as it is held.
type RPC struct {
	started, handled, received, sent *prometheus.CounterVec
	seconds                          *prometheus.HistogramVec
	// methods are the series of each full method name; read-only once
	// stored.
	methods atomic.Pointer[map[string]*rpcSeries]
}

// rpcSeries are one method's series. Those of a method Initialize did not
// see are resolved as they are used (all but started nil until then: the
// handling time too, while the RPC runs or after its handler panicked), so
// that only what was counted is exported, as go-grpc-middleware's.
type rpcSeries struct {
	m                       *RPC
	labels                  [3]string // grpc_type, grpc_service, grpc_method
	started, received, sent prometheus.Counter
	handled                 [codes.Unauthenticated + 1]prometheus.Counter // by code
	seconds                 prometheus.Observer
}

// NewRPC returns RPC metrics whose handling-time histogram has buckets
// (seconds). Register it, then Initialize it with the server's services
// before the server serves.
func NewRPC(buckets []float64) *RPC {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &RPC{
		started:  counter("grpc_server_started_total", "Total number of RPCs started on the server.", labels...),
		handled:  counter("grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success or failure.", "grpc_type", "grpc_service", "grpc_method", "grpc_code"),
		received: counter("grpc_server_msg_received_total", "Total number of RPC stream messages received on the server.", labels...),
		sent:     counter("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server.", labels...),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: buckets,
		}, labels),
	}
	m.methods.Store(&map[string]*rpcSeries{})
	return m
}

// Describe implements prometheus.Collector.
func (m *RPC) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *RPC) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *RPC) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.started, m.handled, m.received, m.sent, m.seconds}
}

// Initialize resolves the series of every method of s's services, each
// exported at zero (every code of the handled counter too) as
// go-grpc-middleware's InitializeMetrics does. Call it once every service
// is registered and before s serves; a method it did not see is counted all
// the same, resolving its series on each RPC.
func (m *RPC) Initialize(s interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}) {
	methods := make(map[string]*rpcSeries)
	for service, info := range s.GetServiceInfo() {
		for _, mi := range info.Methods {
			methods["/"+service+"/"+mi.Name] = m.series(rpcType(mi.IsClientStream, mi.IsServerStream), service, mi.Name, true)
		}
	}
	m.methods.Store(&methods)
}

// series resolves a method's series: all of them (Initialize's), or the
// one every RPC uses at its start.
func (m *RPC) series(typ, service, method string, all bool) *rpcSeries {
	s := &rpcSeries{m: m, labels: [3]string{typ, service, method}}
	s.started = m.started.WithLabelValues(s.labels[:]...)
	if all {
		s.seconds = m.seconds.WithLabelValues(s.labels[:]...)
		s.received = m.received.WithLabelValues(s.labels[:]...)
		s.sent = m.sent.WithLabelValues(s.labels[:]...)
		for c := range s.handled {
			s.handled[c] = m.handled.WithLabelValues(typ, service, method, codes.Code(c).String())
		}
	}
	return s
}

// of is the series of fullMethod, an RPC of typ.
func (m *RPC) of(fullMethod, typ string) *rpcSeries {
	if s, ok := (*m.methods.Load())[fullMethod]; ok {
		return s
	}
	service, method := "unknown", "unknown"
	if svc, meth, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/"); ok {
		service, method = svc, meth
	}
	return m.series(typ, service, method, false)
}

// Started counts a unary RPC that began (its request received); Ended
// counts it when it ends. polygate's chain calls them from its own
// interceptor (server.RPCCounter), which saves an interceptor's frame and
// grpc-go's chaining closure per RPC.
func (m *RPC) Started(fullMethod string) {
	s := m.of(fullMethod, "unary")
	s.started.Inc()
	s.receivedOne()
}

// Ended counts a unary RPC that ended with err (a status error, or nil)
// after d.
func (m *RPC) Ended(fullMethod string, err error, d time.Duration) {
	s := m.of(fullMethod, "unary")
	if err == nil {
		s.sentOne()
	}
	s.handle(err, d)
}

// Unary counts and times a unary RPC, as an interceptor of its own (for a
// chain that does not call Started and Ended).
func (m *RPC) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	m.Started(info.FullMethod)
	resp, err := handler(ctx, req)
	m.Ended(info.FullMethod, err, time.Since(start))
	return resp, err
}

// Stream counts and times a streaming RPC and its messages.
func (m *RPC) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	s := m.of(info.FullMethod, rpcType(info.IsClientStream, info.IsServerStream))
	s.started.Inc()
	err := handler(srv, &countedStream{ServerStream: ss, s: s})
	s.handle(err, time.Since(start))
	return err
}

// handle counts an ended RPC by its code and observes its time d.
func (s *rpcSeries) handle(err error, d time.Duration) {
	c := code(err)
	if int(c) < len(s.handled) && s.handled[c] != nil {
		s.handled[c].Inc()
	} else {
		s.m.handled.WithLabelValues(s.labels[0], s.labels[1], s.labels[2], c.String()).Inc()
	}
	if s.seconds == nil {
		s.seconds = s.m.seconds.WithLabelValues(s.labels[:]...)
	}
	s.seconds.Observe(d.Seconds())
}

func (s *rpcSeries) receivedOne() {
	if s.received == nil {
		s.received = s.m.received.WithLabelValues(s.labels[:]...)
	}
	s.received.Inc()
}

func (s *rpcSeries) sentOne() {
	if s.sent == nil {
		s.sent = s.m.sent.WithLabelValues(s.labels[:]...)
	}
	s.sent.Inc()
}

// code is err's code as grpc-go answers it: a context error takes its
// context code.
func code(err error) codes.Code {
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return status.FromContextError(err).Code()
}

// rpcType is the grpc_type label of a method.
func rpcType(clientStream, serverStream bool) string {
	switch {
	case !clientStream && !serverStream:
		return "unary"
	case clientStream && !serverStream:
		return "client_stream"
	case !clientStream && serverStream:
		return "server_stream"
	}
	return "bidi_stream"
}

// countedStream counts the messages a stream receives and sends.
type countedStream struct {
	grpc.ServerStream
	s *rpcSeries
}

func (c *countedStream) SendMsg(m any) error {
	err := c.ServerStream.SendMsg(m)
	if err == nil {
		c.s.sentOne()
	}
	return err
}

func (c *countedStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if err == nil {
		c.s.receivedOne()
	}
	return err
}
