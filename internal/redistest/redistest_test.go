package redistest_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/internal/redistest"
)

func TestServerStopStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := redistest.Start(t)
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a stopped server")
	}
	s.Start()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("a server without persistence kept a key: %d %v", n, err)
	}
}

func TestServerRestartWithPersistence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := redistest.Start(t, redistest.AppendFsyncAlways...)
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop() // kill -9
	s.Start()
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after kill -9 and restart with AOF always = %q, %v; want v", v, err)
	}
}

func TestServerPauseResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a paused server")
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}
}

func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := redistest.StartCluster(t)
	c := cl.Client(t)
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO: %v %q", err, info)
	}
	// Keys of different slots live on different masters.
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if err := c.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	var masters atomic.Int32
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return nil
	}); err != nil || masters.Load() != 3 {
		t.Fatalf("masters = %d, %v", masters.Load(), err)
	}
}
