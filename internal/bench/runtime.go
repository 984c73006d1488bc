package bench

import (
	"context"
	"fmt"

	dto "github.com/prometheus/client_model/go"

	"github.com/polygate/polygate/internal/promcheck"
)

// goMem is the sidecar's Go runtime memory as its /metrics reports it (the
// Prometheus Go collector's go_memstats_* gauges), to tell apart what RSS
// is made of: goroutine stacks, heap spans in use (live objects and garbage
// not yet collected), and freed heap the runtime keeps without returning it
// to the OS.
type goMem struct {
	heapInuse  float64 // go_memstats_heap_inuse_bytes: spans with objects, live or garbage
	heapAlloc  float64 // go_memstats_heap_alloc_bytes: objects, live or not yet swept
	heapKept   float64 // idle minus released: free spans still resident
	stacks     float64 // go_memstats_stack_inuse_bytes
	heapGoal   float64 // go_memstats_next_gc_bytes
	gcs        uint64  // go_gc_duration_seconds' count: GC cycles so far
	goroutines float64
	gogc       float64 // go_gc_gogc_percent: the GOGC in effect
}

// readGoMem scrapes url (a sidecar's /metrics).
func readGoMem(ctx context.Context, url string) (goMem, error) {
	fams, err := promcheck.Scrape(ctx, url)
	if err != nil {
		return goMem{}, err
	}
	var m goMem
	var missing []string
	gauge := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge() == nil {
			missing = append(missing, name)
			return 0
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	m.heapInuse = gauge("go_memstats_heap_inuse_bytes")
	m.heapAlloc = gauge("go_memstats_heap_alloc_bytes")
	m.heapKept = gauge("go_memstats_heap_idle_bytes") - gauge("go_memstats_heap_released_bytes")
	m.stacks = gauge("go_memstats_stack_inuse_bytes")
	m.heapGoal = gauge("go_memstats_next_gc_bytes")
	m.goroutines = gauge("go_goroutines")
	m.gogc = gauge("go_gc_gogc_percent")
	if f := fams["go_gc_duration_seconds"]; f != nil && len(f.GetMetric()) == 1 && f.GetType() == dto.MetricType_SUMMARY {
		m.gcs = f.GetMetric()[0].GetSummary().GetSampleCount()
	} else {
		missing = append(missing, "go_gc_duration_seconds")
	}
	if len(missing) > 0 {
		return m, fmt.Errorf("%s: no single %v", url, missing)
	}
	return m, nil
}

// allocs are the sidecar's heap allocations so far, as its /metrics reports
// them (go_memstats_mallocs_total, go_memstats_alloc_bytes_total).
type allocs struct{ objects, bytes float64 }

// readAllocs scrapes url (a sidecar's /metrics).
func readAllocs(ctx context.Context, url string) (allocs, error) {
	fams, err := promcheck.Scrape(ctx, url)
	if err != nil {
		return allocs{}, err
	}
	counter := func(name string) (float64, error) {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter() == nil {
			return 0, fmt.Errorf("%s: no single counter %s", url, name)
		}
		return f.GetMetric()[0].GetCounter().GetValue(), nil
	}
	var a allocs
	if a.objects, err = counter("go_memstats_mallocs_total"); err != nil {
		return a, err
	}
	a.bytes, err = counter("go_memstats_alloc_bytes_total")
	return a, err
}

// minus is the change from b to m (gcs: cycles in between).
func (m goMem) minus(b goMem) goMem {
	return goMem{
		heapInuse: m.heapInuse - b.heapInuse, heapAlloc: m.heapAlloc - b.heapAlloc, heapKept: m.heapKept - b.heapKept,
		stacks: m.stacks - b.stacks, heapGoal: m.heapGoal - b.heapGoal, gcs: m.gcs - b.gcs, goroutines: m.goroutines - b.goroutines,
		gogc: m.gogc,
	}
}
