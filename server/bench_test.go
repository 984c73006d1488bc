package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// BenchmarkRoundPair measures one attempt over real loopback gRPC — Pick
// (opening a call) then RecordOutcome(SUCCESS) — with the full interceptor
// chain, serially and with parallel clients:
//
//	go test -run '^$' -bench RoundPair -benchmem ./server/
func BenchmarkRoundPair(b *testing.B) {
	cfg, err := config.Parse([]byte("scopes: {chat: {sources: [{name: a, max_concurrency: 100000}, {name: b, max_concurrency: 100000}]}}"), nil)
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := New(cfg, inmem.New(nil), log, Options{})
	gs := grpc.NewServer(ServerOptions(log, "", Interceptors{})...)
	admissionv1.RegisterAdmissionServiceServer(gs, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := admissionv1.NewAdmissionServiceClient(conn)
	ctx := context.Background()
	round := func(b *testing.B) {
		p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 100})
		if err != nil || p.GetGrant() == nil {
			b.Fatalf("Pick: %v %v", p, err)
		}
		if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{
			Scope: "chat", CallId: p.CallId, PermitId: p.GetGrant().PermitId, Outcome: admissionv1.Outcome_OUTCOME_SUCCESS,
		}); err != nil {
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
}
