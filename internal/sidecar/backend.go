package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/server"
)

// backend is the configured gate.Backend with what Run needs around it.
type backend struct {
	gate.Backend
	// describe names it for DescribeScope, saying when it is degraded.
	describe func() string
	// subscribe, for a shared backend, delivers other replicas' breaker
	// announcements until ctx ends.
	subscribe func(ctx context.Context, handle func(scope string, e gate.Event)) error
	// check, for a shared backend, asks whether it answers; the answer is
	// reported through the health callback like any call's.
	check func(ctx context.Context) error
	close func() error
}

// openBackend builds the configured backend. onChange is told, once per
// change, when a shared backend becomes unavailable or comes back.
func openBackend(cfg *config.Config, log *slog.Logger, onChange func(degraded bool, cause error)) (*backend, error) {
	switch cfg.Backend.Kind {
	case "memory":
		mem, err := inmem.Open(inmem.Options{StatePath: cfg.Backend.Memory.StatePath, Log: log})
		if err != nil {
			return nil, fmt.Errorf("backend.memory.state_path: %w", err)
		}
		return &backend{Backend: mem, describe: func() string { return "memory" }, close: mem.Close}, nil
	case "redis":
		return openRedis(cfg.Backend.Redis, log, onChange)
	}
	return nil, fmt.Errorf("backend.kind %q is not supported", cfg.Backend.Kind)
}

func openRedis(r config.Redis, log *slog.Logger, onChange func(bool, error)) (*backend, error) {
	opts := &redis.UniversalOptions{
		Addrs: r.Addrs, IsClusterMode: r.Cluster, MasterName: r.MasterName,
		Username: r.Username, Password: r.Password, DB: r.DB,
		// Every operation is bounded by the configured timeout, never retried
		// behind the sidecar's back: an unavailable Redis answers UNAVAILABLE
		// (or falls back) within one timeout, not seconds later.
		DialTimeout: r.Timeout, ReadTimeout: r.Timeout, WriteTimeout: r.Timeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
	}
	tc, err := server.RedisTLSConfig(r)
	if err != nil {
		return nil, err
	}
	opts.TLSConfig = tc
	client := redis.NewUniversalClient(opts)
	shared, err := redisgate.New(client, redisgate.Options{Prefix: r.KeyPrefix})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("backend.redis.key_prefix: %w", err)
	}
	mode := fallback.FailClosed
	if r.OnUnavailable == "local" {
		mode = fallback.Local
	}
	fb := fallback.New(shared, fallback.Options{
		Mode: mode, Replicas: r.Replicas,
		OnChange: func(degraded bool, cause error) {
			if degraded {
				log.Error("redis backend unavailable", "on_unavailable", r.OnUnavailable, "replicas", r.Replicas, "err", cause)
			} else {
				log.Info("redis backend available again", "on_unavailable", r.OnUnavailable)
			}
			onChange(degraded, cause)
		},
	})
	return &backend{
		Backend: fb,
		describe: func() string {
			switch {
			case !fb.Degraded():
				return "redis"
			case mode == fallback.Local:
				return "redis (unavailable: local fallback)"
			}
			return "redis (unavailable: fail_closed)"
		},
		subscribe: shared.Subscribe,
		check:     fb.Check,
		close:     client.Close,
	}, nil
}

// announcements delivers other replicas' breaker announcements to the
// server's scopes until ctx ends.
func announcements(ctx context.Context, b *backend, announce func(scope string, e gate.Event), log *slog.Logger) {
	if b.subscribe == nil {
		return
	}
	for ctx.Err() == nil {
		err := b.subscribe(ctx, announce)
		if ctx.Err() != nil {
			return
		}
		log.Warn("redis announcements interrupted; cooldown memos may lag until resubscribed", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
