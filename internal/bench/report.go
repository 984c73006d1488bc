package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// printPeer writes, for each Redis attempt cell with a peer cell, the
// ratio of redis-server's CPU per attempt cycle to its CPU per peer decision
// (the target: at most 2; with several rounds their median, and each), then what
// Redis did per operation for each: the commands the peer sent, and the
// connection reads each side's requests took.
func (r *Report) printPeer(w io.Writer) {
	for _, c := range r.cells {
		d := c.peer
		if d == nil || d.ops == 0 || c.ops == 0 || d.redis == nil || c.redis == nil {
			continue
		}
		ratio := "-"
		if d.redisCPUPerOp() > 0 {
			ratio = fmt.Sprintf("%.2f×", c.redisCPUPerOp()/d.redisCPUPerOp())
		}
		if len(c.peerRatios) > 1 {
			// The kept pair is the median of the sidecar's CPU, not of this
			// ratio: the ratio's own median is the one to judge.
			rounds := make([]string, len(c.peerRatios))
			for i, x := range c.peerRatios {
				rounds[i] = fmt.Sprintf("%.2f", x)
			}
			sorted := slices.Sorted(slices.Values(c.peerRatios))
			ratio = fmt.Sprintf("%.2f× (median of the rounds: %s)", sorted[(len(sorted)-1)/2], strings.Join(rounds, ", "))
		}
		if c.errs > 0 || d.errs > 0 {
			// A failed operation's Redis work is in the cell's CPU, not in
			// its count of operations.
			ratio += fmt.Sprintf(" (not comparable: %d attempt errors, %d ratelimit errors)", c.errs, d.errs)
		}
		fmt.Fprintf(w, "%s %s %v: redis CPU per attempt cycle %.1f µs ÷ ratelimit's per decision %.1f µs = %s (target ≤ 2×)\n",
			c.target, c.op, c.level, c.redisCPUPerOp(), d.redisCPUPerOp(), ratio)
		names := slices.Sorted(maps.Keys(d.redis.byName))
		per := make([]string, 0, len(names))
		for _, n := range names {
			if x := float64(d.redis.byName[n]) / float64(d.ops); x >= 0.005 {
				per = append(per, fmt.Sprintf("%s %.2f", n, x))
			}
		}
		fmt.Fprintf(w, "    Redis per decision: %.2f commands (%s)", float64(d.redis.calls)/float64(d.ops), strings.Join(per, ", "))
		if d.redis.reads >= 0 && c.redis.reads >= 0 {
			fmt.Fprintf(w, ", %.2f reads; per attempt cycle: %.2f reads, %.2f script calls",
				float64(d.redis.reads)/float64(d.ops), float64(c.redis.reads)/float64(c.ops), float64(c.redis.scriptCalls)/float64(c.ops))
		}
		fmt.Fprintln(w)
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Print writes the report: one table of every sidecar cell with the floor
// cell measured just before it at the same level and the ratios, then the
// held-waiters table.
func (r *Report) Print(w io.Writer) {
	ratio := func(a, b float64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\top\tcallers\tops/s\tfloor ops/s\t× floor ops/s\tCPU µs/op\tfloor CPU µs/op\t× floor CPU\tallocs/op\tB/op\tp50 µs\tp99 µs\tredis script µs/call\tops/script call\tredis CPU µs/op\terrors\t")
	for _, c := range r.cells {
		f := cell{}
		if c.floor != nil {
			f = *c.floor
		}
		script, shared, rcpu, nallocs, nbytes := "-", "-", "-", "-", "-"
		if c.allocs != nil && c.ops > 0 {
			nallocs = fmt.Sprintf("%.1f", c.allocs.objects/float64(c.ops))
			nbytes = fmt.Sprintf("%.0f", c.allocs.bytes/float64(c.ops))
		}
		if c.redis != nil {
			if c.redis.scriptCalls > 0 {
				script = fmt.Sprintf("%.1f", float64(c.redis.scriptUsec)/float64(c.redis.scriptCalls))
				if c.op != opHealth { // a health check calls no script: its cell's calls are the poller's
					shared = fmt.Sprintf("%.1f", float64(c.ops)/float64(c.redis.scriptCalls))
				}
			}
			if c.ops > 0 {
				rcpu = fmt.Sprintf("%.1f", us(c.redis.cpu)/float64(c.ops))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%.0f\t%.0f\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%d\t\n",
			c.target, c.op, c.level, c.perSec(), f.perSec(), ratio(c.perSec(), f.perSec()),
			us(c.cpuPerOp()), us(f.cpuPerOp()), ratio(us(c.cpuPerOp()), us(f.cpuPerOp())),
			nallocs, nbytes, us(c.p50), us(c.p99), script, shared, rcpu, c.errs)
	}
	_ = tw.Flush()
	r.printPeer(w)
	if r.note != "" {
		fmt.Fprintln(w, r.note)
	}
	for _, c := range r.cells {
		if c.err != nil {
			fmt.Fprintf(w, "first error of %s %s at %v: %v\n", c.target, c.op, c.level, c.err)
		}
	}
	if len(r.held) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\theld calls\tRSS KB/call\t× floor RSS\tCPU while held (% core)\tanswered after release\tfirst / median / last answer ms\twake CPU µs/call\tanswered early\twait log lines\tfailed\t")
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var floorRSS float64
	for _, h := range r.held {
		if h.target == "floor" {
			floorRSS = h.rssPerCall()
		}
	}
	for _, h := range r.held {
		wake, ratio := "-", "-"
		if h.answered > 0 {
			wake = fmt.Sprintf("%.1f", us(h.wakeCPU)/float64(h.answered))
		}
		if h.target != "floor" && floorRSS > 0 {
			ratio = fmt.Sprintf("%.2f", h.rssPerCall()/floorRSS)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%.2f\t%d\t%.0f / %.0f / %.0f\t%s\t%d\t%d\t%d\t\n", h.target, h.calls,
			h.rssPerCall(), ratio, 100*h.cpu.Seconds()/h.window.Seconds(),
			h.answered, ms(h.first), ms(h.median), ms(h.last), wake, h.early, h.logLines, h.failed)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tstacks KB/call\theap in use KB/call\theap objects KB/call\tfree heap kept KB/call\tGCs meanwhile\theap goal MB\tgoroutines/call\tGOGC\tallocated KB/call\tallocs/call\t")
	for _, h := range r.held {
		if h.mem == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", h.target)
			continue
		}
		kb := func(v float64) float64 { return v / float64(h.calls) / 1024 }
		allocated, nallocs := "-", "-"
		if a := h.allocated; a != nil {
			allocated, nallocs = fmt.Sprintf("%.1f", kb(a.bytes)), fmt.Sprintf("%.0f", a.objects/float64(h.calls))
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%.0f\t%.2f\t%.0f\t%s\t%s\t\n", h.target, kb(h.mem.stacks), kb(h.mem.heapInuse),
			kb(h.mem.heapAlloc), kb(h.mem.heapKept), h.mem.gcs, h.memAfter.heapGoal/(1<<20), h.mem.goroutines/float64(h.calls), h.memAfter.gogc,
			allocated, nallocs)
	}
	_ = tw.Flush()
	for _, h := range r.held {
		if h.err != nil {
			fmt.Fprintf(w, "first error of %s held: %v\n", h.target, h.err)
		}
	}
}
