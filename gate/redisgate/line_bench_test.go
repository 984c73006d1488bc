package redisgate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// BenchmarkLineAfterAReplicaDies measures what the first read of a line
// costs the shared Redis after the replica that held all its waiters (a
// full line, gate.LineCap) died: the read takes every one of them out.
//
//	go test -run '^$' -bench LineAfterAReplicaDies -benchtime 3x ./gate/redisgate/
func BenchmarkLineAfterAReplicaDies(b *testing.B) {
	client, src, read := lineBench(b)
	ctx := context.Background()
	const lease = 50 * time.Millisecond
	var (
		usec, cmds int64
		cpu        time.Duration
	)
	for b.Loop() {
		b.StopTimer()
		for i := range gate.LineCap {
			w := &gate.Waiter{ID: fmt.Sprint("w", i), Replica: "gone", Tenant: fmt.Sprint("t", i%4), Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: lease}
			read(&gate.LineRead{Replica: "gone", Lease: lease, Join: w, Joins: []string{src.Name}})
		}
		// The replica is silent past its lease by Redis's clock (TIME).
		joined, err := client.Time(ctx).Result()
		if err != nil {
			b.Fatal(err)
		}
		for {
			now, err := client.Time(ctx).Result()
			if err != nil {
				b.Fatal(err)
			}
			if now.Sub(joined) > lease {
				break
			}
			time.Sleep(lease / 10)
		}
		u, c, t := scriptStats2(b, client)
		b.StartTimer()
		v := read(&gate.LineRead{Replica: "live", Lease: time.Hour})
		b.StopTimer()
		u1, c1, t1 := scriptStats2(b, client)
		usec, cmds, cpu = usec+u1-u, cmds+c1-c, cpu+t1-t
		if v.Length != 0 {
			b.Fatalf("after the read, length %d; want every waiter of the replica gone taken out", v.Length)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(usec)/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(cmds)/float64(b.N), "redis-cmds/op")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "redis-cpu-µs/op")
}

// scriptStats2 is scriptStats and the server's CPU time (redisCPU), which
// unlike the script's time leaves out the time the server waited for a core.
func scriptStats2(b *testing.B, c redis.UniversalClient) (usec, cmds int64, cpu time.Duration) {
	cpu = redisCPU(b, c)
	usec, cmds = scriptStats(b, c)
	return usec, cmds, cpu
}

// BenchmarkDescribeFullLine measures what DescribeScope costs the shared
// Redis when a source's line is full (gate.LineCap waiters): a describe
// reads the first gate.DescribeMax of them, not the whole line.
//
//	go test -run '^$' -bench DescribeFullLine -benchtime 20x ./gate/redisgate/
func BenchmarkDescribeFullLine(b *testing.B) {
	client, src, read := lineBench(b)
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

// lineBench is a line benchmark's Redis (a server of its own), its source,
// and a read of that source's line (a Peek of scope "bench").
func lineBench(b *testing.B) (*redis.Client, *gate.Source, func(*gate.LineRead) gate.LineView) {
	client := redistest.Start(b).Client(b)
	rb, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	src := gatetest.Src("s")
	return client, src, func(r *gate.LineRead) gate.LineView {
		s, err := rb.Peek(context.Background(), gate.PeekRequest{Scope: "bench", Sources: []*gate.Source{src}, Line: r})
		if err != nil {
			b.Fatal(err)
		}
		return s.Sources[0].Line
	}
}
