package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options say what to run and for how long. Zero values are not defaults:
// cmd/polybench's flags are.
type Options struct {
	// Sidecar is the sidecar binary; Floor the command that serves the floor
	// (it prints "listening on ADDR").
	Sidecar string
	Floor   []string
	// MemorySidecar, when set, is the command that runs the memory
	// backend's sidecar instead of Sidecar (a profiled one).
	MemorySidecar []string
	// SidecarEnv is added to the sidecars' environment (not the floor's),
	// e.g. GOGC=50: NAME=VALUE each.
	SidecarEnv []string
	// Ops are the operations measured on the sidecars: health, retryafter,
	// attempt.
	Ops []string
	// RedisAddr is a redis-server the Redis rows use ("" skips them).
	RedisAddr string
	// Ratelimit is envoy's ratelimit service's binary ("": no peer). It runs
	// against RedisAddr, a decision cell beside each Redis attempt cell at
	// the same level (none without Redis or the attempt operation: the
	// report says so). RatelimitEnv (NAME=VALUE each) is added to the
	// service's environment, which holds nothing else of polybench's.
	Ratelimit    string
	RatelimitEnv []string
	// Conns is the number of connections every target gets.
	Conns int
	// Callers are the closed-loop concurrency levels; Rate (ops/s, shared by
	// RateCallers callers) adds a paced level when > 0.
	Callers     []int
	Rate        float64
	RateCallers int
	// Warm and Cell are the unmeasured and measured time of each cell.
	Warm, Cell time.Duration
	// Rounds is how many times each pair (floor cell, sidecar cell) runs;
	// the report keeps the pair with the median CPU ratio.
	Rounds int
	// Held calls are held in OnNoRunnable (0 skips the mode); Settle is the
	// time given to the sidecar to take them in, HoldWindow the time their
	// CPU is measured over.
	Held               int
	Settle, HoldWindow time.Duration
	// Dir holds the generated configurations and the servers' logs.
	Dir string
}

// Report is what a run measured.
type Report struct {
	cells []cell
	held  []held
	note  string // why an asked-for part did not run
}

// Run starts the floor and the sidecar on memory and (with RedisAddr) on
// Redis, then measures every operation at every level on each sidecar, each
// cell right after a floor cell at the same level (on a shared machine the
// pair sees the same neighbours), then the held-waiters mode. It prints
// progress to progress.
func Run(ctx context.Context, o Options, progress io.Writer) (*Report, error) {
	levels := make([]level, 0, len(o.Callers)+1)
	for _, n := range o.Callers {
		levels = append(levels, level{callers: n})
	}
	if o.Rate > 0 {
		levels = append(levels, level{callers: o.RateCallers, rate: o.Rate})
	}
	type target struct {
		name string
		p    *process
		cl   *client
		pr   probe
	}
	// attach dials a started process (stopped if that fails).
	attach := func(name string, p *process) (*target, error) {
		cl, err := dial(p.addr, o.Conns)
		if err != nil {
			p.stop()
			return nil, err
		}
		return &target{name: name, p: p, cl: cl, pr: probe{pid: p.pid()}}, nil
	}
	start := func(name string, argv, env []string) (*target, error) {
		p, err := startProcess(name, argv, env, filepath.Join(o.Dir, name+".log"))
		if err != nil {
			return nil, err
		}
		return attach(name, p)
	}
	var started []*target
	defer func() {
		for _, t := range started {
			t.cl.close()
			t.p.stop()
		}
	}()
	floor, err := start("floor", o.Floor, nil)
	if err != nil {
		return nil, err
	}
	started = append(started, floor)
	backends := []string{"memory"}
	if o.RedisAddr != "" {
		backends = append(backends, "redis")
	}
	var sidecars []*target
	// redisInfo reads the Redis work so far: the Redis rows and the peer's
	// read it alike.
	var redisInfo func(context.Context) (redisStats, error)
	if o.RedisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: o.RedisAddr})
		defer rdb.Close()
		redisInfo = func(ctx context.Context) (redisStats, error) {
			s, err := rdb.Info(ctx, "commandstats", "cpu", "stats").Result()
			if err != nil {
				return redisStats{}, err
			}
			return parseInfo(s)
		}
	}
	for _, b := range backends {
		cfg := filepath.Join(o.Dir, b+".yaml")
		if err := os.WriteFile(cfg, []byte(sidecarConfig(b, o.RedisAddr, o.Held)), 0o600); err != nil {
			return nil, err
		}
		argv := []string{o.Sidecar}
		if b == "memory" && len(o.MemorySidecar) > 0 {
			argv = o.MemorySidecar
		}
		t, err := start(b, append(slices.Clone(argv), "--config", cfg, "--listen", "127.0.0.1:0"), o.SidecarEnv)
		if err != nil {
			return nil, err
		}
		started = append(started, t)
		sidecars = append(sidecars, t)
		if url := t.p.metricsURL(); url != "" {
			t.pr.allocs = func(ctx context.Context) (allocs, error) { return readAllocs(ctx, url) }
		}
		if b == "redis" {
			t.pr.redis = redisInfo
		}
	}
	var ops []op
	for _, name := range o.Ops {
		if !slices.Contains([]op{opHealth, opRetryAfter, opAttempt}, op(name)) {
			return nil, fmt.Errorf("operation %q: allowed: health, retryafter, attempt", name)
		}
		ops = append(ops, op(name))
	}
	rep := &Report{}
	var peer *target
	if o.Ratelimit != "" && (o.RedisAddr == "" || !slices.Contains(ops, opAttempt)) {
		// make bench always passes the peer; its one-cell recipes run no
		// Redis attempt cell to measure it beside.
		rep.note = "ratelimit (the peer) not started: it is measured beside the Redis attempt cells, and this run has none"
		fmt.Fprintln(progress, rep.note)
	} else if o.Ratelimit != "" {
		p, err := startRatelimit(ctx, o.Ratelimit, o.RedisAddr, o.Dir, peerLimit, o.RatelimitEnv)
		if err != nil {
			return nil, err
		}
		if peer, err = attach("ratelimit", p); err != nil {
			return nil, err
		}
		peer.pr.redis = redisInfo
		started = append(started, peer)
	}
	for _, t := range sidecars {
		for _, op := range ops {
			for _, lv := range levels {
				var pairs []cell
				var peerRatios []float64
				for round := range max(1, o.Rounds) {
					// The peer's cell runs beside the Redis attempt cell:
					// after it, and in every other round before its floor
					// cell (the attempt cell keeps its floor right before
					// it), so that a drift of the machine's speed within a
					// round does not favour one side.
					var d *cell
					decide := func() error {
						if peer == nil || t.name != "redis" || op != opAttempt {
							return nil
						}
						c, err := peer.cl.run(ctx, opDecide, lv, o.Warm, o.Cell, peer.pr)
						if err != nil {
							return fmt.Errorf("ratelimit decide at %v: %w", lv, err)
						}
						c.target, d = peer.name, &c
						fmt.Fprintf(progress, "%-7s %-10s %6v  %8.0f ops/s  %6.1f µs CPU/op  redis %6.1f µs CPU/op  errors %d\n",
							peer.name, opDecide, lv, c.perSec(), us(c.cpuPerOp()), c.redisCPUPerOp(), c.errs)
						return nil
					}
					if round%2 == 1 {
						if err := decide(); err != nil {
							return rep, err
						}
					}
					f, err := floor.cl.run(ctx, opHealth, lv, o.Warm, o.Cell, floor.pr)
					if err != nil {
						return rep, fmt.Errorf("floor health at %v: %w", lv, err)
					}
					f.target = floor.name
					c, err := t.cl.run(ctx, op, lv, o.Warm, o.Cell, t.pr)
					if err != nil {
						return rep, fmt.Errorf("%s %s at %v: %w", t.name, op, lv, err)
					}
					c.target, c.floor = t.name, &f
					alloc := ""
					if c.allocs != nil && c.ops > 0 {
						alloc = fmt.Sprintf("  %.1f allocs/op %.0f B/op", c.allocs.objects/float64(c.ops), c.allocs.bytes/float64(c.ops))
					}
					fmt.Fprintf(progress, "%-7s %-10s %6v  %8.0f ops/s  %6.1f µs CPU/op (floor %8.0f ops/s %6.1f µs)%s  errors %d\n",
						t.name, op, lv, c.perSec(), us(c.cpuPerOp()), f.perSec(), us(f.cpuPerOp()), alloc, c.errs)
					if round%2 == 0 {
						if err := decide(); err != nil {
							return rep, err
						}
					}
					if d != nil {
						d.floor, c.peer = &f, d
						if d.redisCPUPerOp() > 0 {
							peerRatios = append(peerRatios, c.redisCPUPerOp()/d.redisCPUPerOp())
						}
					}
					pairs = append(pairs, c)
				}
				kept := medianPair(pairs)
				kept.peerRatios = peerRatios
				rep.cells = append(rep.cells, kept)
				if kept.peer != nil {
					rep.cells = append(rep.cells, *kept.peer)
				}
			}
		}
		if o.Held > 0 {
			if len(rep.held) == 0 {
				// The floor holds as many calls once, before the first
				// sidecar does: what grpc-go alone spends per held call.
				if err := holdOn(ctx, rep, progress, floor.name, floor.p, floor.cl, floor.cl.floorHolding(), o); err != nil {
					return rep, err
				}
			}
			if err := holdOn(ctx, rep, progress, t.name, t.p, t.cl, t.cl.sidecarHolding(), o); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// holdOn runs the held mode on one target and adds it to rep.
func holdOn(ctx context.Context, rep *Report, progress io.Writer, name string, p *process, cl *client, how holding, o Options) error {
	h, err := cl.hold(ctx, p, how, o.Held, o.Settle, o.HoldWindow)
	if err != nil {
		return fmt.Errorf("%s held waiters: %w", name, err)
	}
	h.target = name
	rep.held = append(rep.held, h)
	fmt.Fprintf(progress, "%-7s held      %6d  %6.1f KB RSS/call, last answer %v after the release\n",
		name, h.calls, h.rssPerCall(), h.last.Round(time.Millisecond))
	return nil
}

// medianPair returns the pair whose CPU per operation relative to its floor
// is the median of pairs (the lower middle one of an even count).
func medianPair(pairs []cell) cell {
	ratio := func(c cell) float64 {
		if c.floor == nil || c.floor.cpuPerOp() == 0 {
			return 0
		}
		return float64(c.cpuPerOp()) / float64(c.floor.cpuPerOp())
	}
	sorted := slices.SortedFunc(slices.Values(pairs), func(a, b cell) int { return cmp.Compare(ratio(a), ratio(b)) })
	return sorted[(len(sorted)-1)/2]
}

// sidecarConfig is the sidecar's configuration for the bench: the bench
// scope (one source no limit refuses) and the held scope (one source whose
// breaker the held mode forces open; callers wait for it).
func sidecarConfig(backend, redisAddr string, held int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backend:\n  kind: %s\n", backend)
	if backend == "redis" {
		fmt.Fprintf(&b, "  redis: {addrs: [%q], key_prefix: \"polybench-%d:\"}\n", redisAddr, time.Now().UnixNano())
	}
	fmt.Fprintf(&b, "calls: {max_live: %d}\n", max(10000, 2*held+1000))
	// Every held call keeps a stream open, on one connection by default.
	fmt.Fprintf(&b, "limits: {max_streams_per_connection: %d}\n", min(65536, max(256, held+1000)))
	// /metrics on a free port: the held mode reads the Go runtime's memory there.
	b.WriteString(`metrics_listen: 127.0.0.1:0
log: {level: info}
scopes:
  bench:
    sources:
      - {name: only, max_concurrency: 1000, timeout: 60s}
  held:
    circuit_open: wait
    backpressure: {stall_window: 600s, poll_interval: 50ms}
    sources:
      - {name: only, max_concurrency: 1000, timeout: 60s}
`)
	return b.String()
}
