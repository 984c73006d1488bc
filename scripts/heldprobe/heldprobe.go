//go:build heldprobe

// The held-call probe: a file built into the sidecar (never shipped: it
// needs the heldprobe tag and an overlay) that measures what the calls held
// in OnNoRunnable keep. Once HELD_PROBE_N goroutines are up (default 10 000,
// make bench's held mode), it waits 4 s for the last calls to park, reads
// runtime/metrics, runs two GCs and reads them again, and writes to
// $HELD_PROBE_OUT.<pid>: .txt (each metric before the held phase, with
// every call held, and the change per held call), .heap0 and .heap (heap
// profiles before and while held: -diff_base gives the held phase's
// allocations by call site, -sample_index=inuse_space what the held calls
// keep) and .goroutine. The recipe:
//
//	echo "{\"Replace\":{\"$PWD/cmd/sidecar/heldprobe.go\":\"$PWD/scripts/heldprobe/heldprobe.go\"}}" > /tmp/probe.json
//	go build -tags heldprobe -overlay /tmp/probe.json -o /tmp/sc-probe ./cmd/sidecar
//	go build -o /tmp/pb ./cmd/polybench
//	/tmp/pb -sidecar /tmp/sc-probe -sidecar-env GODEBUG=memprofilerate=1,HELD_PROBE_OUT=/tmp/probe \
//	    -ops health -callers 1 -rate 0 -cell 200ms -warm 10ms -held 10000 -hold-window 10s
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"time"
)

func init() {
	out := os.Getenv("HELD_PROBE_OUT")
	if out == "" {
		return
	}
	n, err := strconv.Atoi(os.Getenv("HELD_PROBE_N"))
	if err != nil || n <= 0 {
		n = 10000
	}
	go probe(fmt.Sprintf("%s.%d", out, os.Getpid()), n)
}

var probeMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/stacks:bytes",
	"/memory/classes/total:bytes",
	"/gc/stack/starting-size:bytes",
	"/gc/scan/stack:bytes",
	"/gc/heap/goal:bytes",
	"/gc/heap/allocs:bytes",
	"/gc/heap/allocs:objects",
	"/gc/cycles/total:gc-cycles",
	"/sched/goroutines:goroutines",
}

func readProbe() []metrics.Sample {
	s := make([]metrics.Sample, len(probeMetrics))
	for i, name := range probeMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	return s
}

func writeProfile(path, name string, debug int) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.Lookup(name).WriteTo(f, debug)
}

func probe(prefix string, n int) {
	// Before: the held mode's first calls are coming in.
	for runtime.NumGoroutine() < 200 {
		time.Sleep(20 * time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	base := readProbe()
	writeProfile(prefix+".heap0", "heap", 0)
	for runtime.NumGoroutine() < n {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(4 * time.Second)
	held := readProbe()
	runtime.GC()
	runtime.GC()
	collected := readProbe()
	if os.Getenv("HELD_PROBE_DUMP") != "" {
		// Every live object with its address, before the probe allocates
		// anything more: scripts/heldprobe/frag reads the free slots of each
		// size class's spans from it.
		if d, err := os.Create(prefix + ".dump"); err == nil {
			debug.WriteHeapDump(d.Fd())
			d.Close()
		}
	}
	f, err := os.Create(prefix + ".txt")
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%d held calls (goroutines %d); per held call: (value - before) / %d\n", n, runtime.NumGoroutine(), n)
	for _, phase := range []struct {
		name string
		s    []metrics.Sample
	}{{"held", held}, {"held, after two GCs", collected}} {
		fmt.Fprintf(f, "\n%s\n", phase.name)
		for i, s := range phase.s {
			if s.Value.Kind() != metrics.KindUint64 {
				continue
			}
			a, b := base[i].Value.Uint64(), s.Value.Uint64()
			fmt.Fprintf(f, "%-38s before %12d now %12d per held call %9.1f\n", s.Name, a, b, (float64(b)-float64(a))/float64(n))
		}
	}
	writeProfile(prefix+".heap", "heap", 0)
	writeProfile(prefix+".goroutine", "goroutine", 1)
}
