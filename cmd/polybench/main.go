// Command polybench measures what a decision costs: it drives the real
// sidecar binary (memory and Redis backends) and a bare grpc-go health
// server (the floor, served by polybench floor) with the same load and prints
// the ratios; with -ratelimit, envoy's ratelimit service (the peer) against
// the same redis-server, and the ratio of Redis's work per attempt cycle to
// its per decision. make bench builds the sidecar and runs it; see
// docs/performance.md.
//
//	polybench -sidecar PATH [-ratelimit PATH] [flags]
//	polybench floor [-listen ADDR]
//	polybench sidecar [-cpuprofile FILE] [-memprofile FILE] -- [sidecar flags]
//
// The last form is the sidecar (server.Run) inside polybench, CPU-profiled
// until it stops and its allocations written when it stops; polybench
// -cpuprofile FILE (or -memprofile FILE) runs the memory backend's sidecar
// that way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/polygate/polygate/internal/bench"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/internal/sidecar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "floor" {
		fs := flag.NewFlagSet("floor", flag.ExitOnError)
		listen := fs.String("listen", "127.0.0.1:0", "address to serve the bare health server on")
		_ = fs.Parse(os.Args[2:])
		err = bench.ServeFloor(ctx, *listen, os.Stdout)
	} else if len(os.Args) > 1 && os.Args[1] == "sidecar" {
		err = profiledSidecar(ctx, os.Args[2:])
	} else {
		err = run(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "polybench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) (err error) {
	fs := flag.NewFlagSet("polybench", flag.ExitOnError)
	var (
		o       bench.Options
		callers string
		ops     string
		noRedis bool
		profile string
		memProf string
		env     string
		rlEnv   string
	)
	fs.StringVar(&o.Sidecar, "sidecar", "", "the sidecar binary (required; make bench builds it)")
	fs.IntVar(&o.Conns, "conns", 1, "connections to each target")
	fs.StringVar(&callers, "callers", "1,16,64", "closed-loop concurrency levels, comma separated")
	fs.Float64Var(&o.Rate, "rate", 1000, "the paced level, operations per second (0: none)")
	fs.IntVar(&o.RateCallers, "rate-callers", 16, "callers sharing the paced rate")
	fs.DurationVar(&o.Warm, "warm", 300*time.Millisecond, "unmeasured warm-up of each cell")
	fs.DurationVar(&o.Cell, "cell", 2*time.Second, "measured time of each cell")
	fs.IntVar(&o.Rounds, "rounds", 1, "runs of each (floor, sidecar) pair; the pair with the median CPU ratio is reported")
	fs.IntVar(&o.Held, "held", 10000, "calls held in OnNoRunnable (0: skip the mode)")
	fs.DurationVar(&o.Settle, "settle", 2*time.Second, "time the sidecar gets to take the held calls in")
	fs.DurationVar(&o.HoldWindow, "hold-window", 3*time.Second, "time the sidecar's CPU is measured over while calls are held")
	fs.BoolVar(&noRedis, "no-redis", false, "skip the Redis backend")
	fs.StringVar(&o.Ratelimit, "ratelimit", "", "envoy's ratelimit service's binary (make tools builds bin/ratelimit): the peer, measured against the same redis-server beside each Redis attempt cell (empty: no peer)")
	fs.StringVar(&rlEnv, "ratelimit-env", "", "settings of the peer, e.g. REDIS_POOL_SIZE=64: NAME=VALUE, comma separated (it gets nothing else of polybench's environment: its defaults otherwise)")
	fs.StringVar(&ops, "ops", "health,retryafter,attempt", "operations measured on the sidecars, comma separated")
	fs.StringVar(&env, "sidecar-env", "", "environment added to the sidecars only (not the floor), e.g. GOGC=50,GOMEMLIMIT=200MiB: NAME=VALUE, comma separated")
	fs.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the memory backend's sidecar (run inside polybench) to this file")
	fs.StringVar(&memProf, "memprofile", "", "write the allocations of the memory backend's sidecar (run inside polybench) to this file (go tool pprof -sample_index=alloc_space)")
	_ = fs.Parse(args)
	if o.Sidecar == "" {
		return fmt.Errorf("-sidecar: the sidecar binary is required (go build -o PATH ./cmd/sidecar)")
	}
	if o.Ratelimit != "" {
		if _, err := os.Stat(o.Ratelimit); err != nil {
			return fmt.Errorf("-ratelimit: %w (make tools builds bin/ratelimit)", err)
		}
	}
	if rlEnv != "" {
		for _, kv := range strings.Split(rlEnv, ",") {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || len(kv) > 1000 {
				return fmt.Errorf("-ratelimit-env %q: want NAME=VALUE pairs, comma separated", clip(rlEnv))
			}
			o.RatelimitEnv = append(o.RatelimitEnv, kv)
		}
	}
	for _, s := range strings.Split(callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 100000 {
			return fmt.Errorf("-callers %q: want numbers from 1 to 100000, comma separated", callers)
		}
		o.Callers = append(o.Callers, n)
	}
	if o.Conns < 1 || o.Conns > 1000 || o.RateCallers < 1 || o.Held < 0 || o.Held > 1000000 || o.Rounds < 1 || o.Rounds > 100 {
		return fmt.Errorf("-conns (1..1000), -rate-callers (≥ 1), -held (0..1000000) or -rounds (1..100) out of range")
	}
	if env != "" {
		for _, kv := range strings.Split(env, ",") {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || len(kv) > 1000 {
				return fmt.Errorf("-sidecar-env %q: want NAME=VALUE pairs, comma separated", clip(env))
			}
			o.SidecarEnv = append(o.SidecarEnv, kv)
		}
	}
	for _, s := range strings.Split(ops, ",") {
		o.Ops = append(o.Ops, strings.TrimSpace(s))
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Floor = []string{self, "floor"}
	if profile != "" || memProf != "" {
		o.MemorySidecar = []string{self, "sidecar", "-cpuprofile", profile, "-memprofile", memProf, "--"}
	}
	h := &harness{}
	defer h.cleanup()
	defer func() {
		r := recover()
		if f, ok := r.(fatal); ok {
			err = f.error
		} else if r != nil {
			panic(r)
		}
	}()
	o.Dir = h.TempDir()
	if !noRedis {
		o.RedisAddr = redistest.Start(h).Addr
	}
	rep, err := bench.Run(ctx, o, os.Stderr)
	if rep != nil {
		fmt.Printf("\npolybench: %d connection(s), cells of %v after %v warm-up, median of %d round(s)", o.Conns, o.Cell, o.Warm, o.Rounds)
		if o.Rate > 0 {
			fmt.Printf(", paced level %g/s over %d callers", o.Rate, o.RateCallers)
		}
		if len(o.RatelimitEnv) > 0 {
			fmt.Printf(", the peer with %s (not its defaults)", strings.Join(o.RatelimitEnv, " "))
		}
		fmt.Print("\n\n")
		rep.Print(os.Stdout)
	}
	return err
}

// clip bounds a flag's value echoed in an error.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

// harness lets the bench start redis-server with internal/redistest, which
// tests use: it gives redistest the few testing.TB methods it calls. The
// embedded TB is nil; any other method would panic.
type harness struct {
	testing.TB
	cleanups []func()
}

type fatal struct{ error }

func (h *harness) Helper()                        {}
func (h *harness) Cleanup(f func())               { h.cleanups = append(h.cleanups, f) }
func (h *harness) Fatal(args ...any)              { panic(fatal{fmt.Errorf("%s", fmt.Sprint(args...))}) }
func (h *harness) Fatalf(format string, a ...any) { panic(fatal{fmt.Errorf(format, a...)}) }
func (h *harness) TempDir() string {
	d, err := os.MkdirTemp("", "polybench-")
	if err != nil {
		h.Fatal(err)
	}
	h.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func (h *harness) cleanup() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
}

// profiledSidecar runs the sidecar in this process with a CPU profile
// written to -cpuprofile, and its allocations to -memprofile, when it stops.
func profiledSidecar(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sidecar", flag.ExitOnError)
	path := fs.String("cpuprofile", "", "the CPU profile to write")
	memPath := fs.String("memprofile", "", "the allocation profile to write")
	_ = fs.Parse(args)
	if *path != "" {
		f, err := os.Create(*path)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var mem *os.File
	if *memPath != "" {
		var err error
		if mem, err = os.Create(*memPath); err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
		defer mem.Close()
	}
	err := sidecar.Run(ctx, fs.Args(), os.Environ(), os.Stdout, os.Stderr)
	if mem != nil {
		if werr := pprof.Lookup("allocs").WriteTo(mem, 0); werr != nil {
			return errors.Join(err, fmt.Errorf("-memprofile: %w", werr))
		}
	}
	return err
}
