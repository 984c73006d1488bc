package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// BenchmarkDecisionCycle measures decision throughput — Pick (opening a
// call), then RecordOutcome(SUCCESS), which ends it — on a sidecar wired as
// Run wires it (log, event hub and metrics observers, the interceptor chain),
// with telemetry off and on, serially and from parallel goroutines, in two
// places:
//
//   - grpc: a client over loopback TCP, as an application sees the sidecar;
//   - handlers: the handlers called in-process, without a transport: the
//     worst case, where telemetry's writer competes with decisions that cost
//     a few microseconds.
//
// Run it with:
//
//	go test -run '^$' -bench DecisionCycle -benchmem -count 6 ./server/
//
// With telemetry on, each cycle queues two records (the attempt and the
// call); records/op and dropped/op say how many the writer kept up with.
func BenchmarkDecisionCycle(b *testing.B) {
	for _, via := range []string{"grpc", "handlers"} {
		for _, mode := range []string{"serial", "parallel"} {
			for _, telemetry := range []string{"off", "on"} {
				b.Run(fmt.Sprintf("%s/%s/telemetry=%s", via, mode, telemetry), func(b *testing.B) {
					benchCycles(b, via, mode, telemetry == "on")
				})
			}
		}
	}
}

func benchCycles(b *testing.B, via, mode string, telemetry bool) {
	yaml := "listen: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n" +
		"scopes: {chat: {sources: [{name: a, max_concurrency: 1000000}, {name: b, max_concurrency: 1000000}]}}\n"
	if telemetry {
		yaml += "telemetry: {path: " + filepath.Join(b.TempDir(), "t.db") + "}\n"
	}
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sc, err := startSidecar(cfg, log, sidecarDeps{backend: inmem.New(nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer sc.stop()
	var (
		pick   func(context.Context, *admissionv1.PickRequest) (*admissionv1.PickResponse, error)
		record func(context.Context, *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error)
	)
	if via == "handlers" {
		pick, record = sc.srv.Pick, sc.srv.RecordOutcome
	} else {
		conn, err := grpc.NewClient(sc.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		client := admissionv1.NewAdmissionServiceClient(conn)
		pick = func(ctx context.Context, r *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
			return client.Pick(ctx, r)
		}
		record = func(ctx context.Context, r *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
			return client.RecordOutcome(ctx, r)
		}
	}
	ctx := context.Background()
	cycle := func(b *testing.B) {
		p, err := pick(ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 100})
		if err != nil || p.GetGrant() == nil {
			b.Fatalf("Pick: %v %v", p, err)
		}
		if _, err := record(ctx, &admissionv1.RecordOutcomeRequest{
			Scope: "chat", CallId: p.CallId, PermitId: p.GetGrant().PermitId, Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, HttpStatus: 200,
		}); err != nil {
			b.Fatal(err)
		}
	}
	if mode == "serial" {
		for b.Loop() {
			cycle(b)
		}
	} else {
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				cycle(b)
			}
		})
	}
	b.StopTimer()
	if sc.sink != nil {
		if err := sc.sink.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		n := sc.sink.Counts()
		b.ReportMetric(float64(n.Calls+n.Attempts)/float64(b.N), "records/op")
		b.ReportMetric(float64(n.DroppedQueueFull+n.DroppedWriteFailed)/float64(b.N), "dropped/op")
	}
}
