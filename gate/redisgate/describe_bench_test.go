package redisgate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// BenchmarkDescribeFullLine measures what DescribeScope costs the shared
// Redis when a source's line is full (gate.LineCap waiters): a describe
// reads the first gate.DescribeMax of them, not the whole line.
//
//	go test -run '^$' -bench DescribeFullLine -benchtime 20x ./gate/redisgate/
func BenchmarkDescribeFullLine(b *testing.B) {
	client := redistest.Start(b).Client(b)
	rb, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	src := gatetest.Src("s")
	read := func(r *gate.LineRead) gate.LineView {
		s, err := rb.Peek(ctx, gate.PeekRequest{Scope: "bench", Sources: []*gate.Source{src}, Line: r})
		if err != nil {
			b.Fatal(err)
		}
		return s.Sources[0].Line
	}
	for i := range gate.LineCap {
		w := &gate.Waiter{ID: fmt.Sprint("w", i), Replica: "r1", Tenant: fmt.Sprint("t", i%4), Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Hour}
		if v := read(&gate.LineRead{Replica: "r1", Lease: time.Hour, Join: w, Joins: []string{src.Name}}); v.Place == "" {
			b.Fatalf("waiter %d: no place", i)
		}
	}
	usec, cmds := scriptStats(b, client)
	for b.Loop() {
		if v := read(&gate.LineRead{Replica: "r1", Lease: time.Hour, Describe: true}); v.Length != gate.LineCap {
			b.Fatalf("length %d, want %d", v.Length, gate.LineCap)
		}
	}
	usec1, cmds1 := scriptStats(b, client)
	b.ReportMetric(float64(usec1-usec)/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(cmds1-cmds)/float64(b.N), "redis-cmds/op")
}
