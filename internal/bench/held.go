package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/emptypb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// heldScope is the scope whose only source the held-waiters mode forces
// open: circuit_open wait, a long stall window, so every OnNoRunnable is held
// until the breaker changes.
const (
	heldScope  = "held"
	heldSource = "only"
)

// held is the result of the held-waiters mode.
type held struct {
	target   string
	calls    int
	rssDelta int64         // VmRSS after holding minus before
	cpu      time.Duration // the target's CPU over the hold window
	window   time.Duration
	answered int           // OnNoRunnable answers after the breaker was cleared
	early    int           // answers before it was cleared (should be 0)
	failed   int           // calls whose Pick or OnNoRunnable failed
	first    time.Duration // clear → the first answer (the wake-up itself)
	median   time.Duration // clear → the median answer
	last     time.Duration // clear → the last answer
	wakeCPU  time.Duration // the target's CPU from the clear to the last answer
	logLines int           // "call waiting" and "calls waiting" lines the target logged meanwhile
	err      error         // the first failed call
	// mem is the change of the target's Go runtime memory over the same
	// span as rssDelta, memAfter its state at the end (nil: the target has
	// no /metrics, or it could not be read).
	mem, memAfter *goMem
	// allocated is what the target allocated over the same span: the
	// garbage of taking the calls in as well as what it keeps (nil as mem).
	// Unlike RSS it does not depend on where the GC cycles fell.
	allocated *allocs
}

// rssPerCall is the target's RSS growth per held call, in KB.
func (h held) rssPerCall() float64 { return float64(h.rssDelta) / float64(h.calls) / 1024 }

// holding is what the held mode does on one kind of target: arm makes
// calls wait (nil: they always do), call opens one call and holds it
// (calling opened once the call is in, before it waits), release lets every
// held call go.
type holding struct {
	arm, release func(ctx context.Context) error
	call         func(ctx context.Context, k int, opened func()) error
}

// sidecarHolding holds calls in OnNoRunnable on the held scope, its source
// forced open, and clears the override to let them go.
func (c *client) sidecarHolding() holding {
	override := func(a admissionv1.OverrideAction) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.adm[0].OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{
				Scope: heldScope, Source: heldSource, Action: a, Actor: "polybench", Reason: "held-waiters benchmark",
			})
			return err
		}
	}
	// The calls open at most pickers at a time, as a client's pool would:
	// what is measured is holding them, not a burst of 10 000 Picks.
	pickers := make(chan struct{}, 64)
	return holding{
		arm:     override(admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN),
		release: override(admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR),
		call: func(ctx context.Context, k int, opened func()) error {
			pickers <- struct{}{}
			p, err := c.adm[k].Pick(ctx, &admissionv1.PickRequest{Scope: heldScope})
			<-pickers
			opened()
			if err != nil {
				return fmt.Errorf("pick: %w", err)
			}
			if p.GetNoRunnable() == nil {
				return fmt.Errorf("pick on a forced-open source: %v, want no_runnable", p)
			}
			if _, err := c.adm[k].OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: heldScope, CallId: p.GetCallId()}); err != nil {
				return fmt.Errorf("on_no_runnable: %w", err)
			}
			return nil
		},
	}
}

// floorHolding holds calls in the floor's Hold RPC (floorHold): what a
// held unary call costs grpc-go itself.
func (c *client) floorHolding() holding {
	return holding{
		release: func(ctx context.Context) error {
			return c.conns[0].Invoke(ctx, floorReleaseMethod, new(emptypb.Empty), new(emptypb.Empty))
		},
		call: func(ctx context.Context, k int, opened func()) error {
			opened()
			if err := c.conns[k].Invoke(ctx, floorHoldMethod, new(emptypb.Empty), new(emptypb.Empty)); err != nil {
				return fmt.Errorf("hold: %w", err)
			}
			return nil
		},
	}
}

// hold opens n calls on the target and holds each (how), measures the
// target's RSS and CPU while they wait, lets them go and times how long
// until every call is answered. settle is how long to let the target take
// the calls in before measuring.
func (c *client) hold(ctx context.Context, p *process, how holding, n int, settle, window time.Duration) (held, error) {
	pid, logPath, metrics := p.pid(), p.log, p.metricsURL()
	readMem := func() *goMem {
		if metrics == "" {
			return nil
		}
		m, err := readGoMem(ctx, metrics)
		if err != nil {
			return nil
		}
		return &m
	}
	readAlloc := func() *allocs {
		if metrics == "" {
			return nil
		}
		a, err := readAllocs(ctx, metrics)
		if err != nil {
			return nil
		}
		return &a
	}
	h := held{calls: n, window: window}
	logs0 := countLines(logPath, "call waiting", "calls waiting")
	if how.arm != nil {
		if err := how.arm(ctx); err != nil {
			return h, fmt.Errorf("make calls wait: %w", err)
		}
	}
	mem0 := readMem()
	alloc0 := readAlloc()
	rss0, err := procRSS(pid)
	if err != nil {
		return h, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		picked   sync.WaitGroup
		answers  sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		h.failed++
		if firstErr == nil {
			firstErr = err
		}
	}
	lastAnswer := make([]int64, n) // unix nanos of each call's answer
	picked.Add(n)
	answers.Add(n)
	for i := range n {
		go func() {
			defer answers.Done()
			if err := how.call(ctx, i%len(c.conns), picked.Done); err != nil {
				fail(err)
				return
			}
			lastAnswer[i] = time.Now().UnixNano()
		}()
	}
	picked.Wait()
	// The calls' OnNoRunnable requests are on their way: give the target
	// time to take them in, then measure it holding them.
	if !sleep(ctx, settle) {
		return h, ctx.Err()
	}
	cpu0, err := procCPU(pid)
	if err != nil {
		return h, err
	}
	if !sleep(ctx, window) {
		return h, ctx.Err()
	}
	cpu1, err := procCPU(pid)
	if err != nil {
		return h, err
	}
	rss1, err := procRSS(pid)
	if err != nil {
		return h, err
	}
	h.cpu, h.rssDelta = cpu1-cpu0, rss1-rss0
	if mem1 := readMem(); mem0 != nil && mem1 != nil {
		d := mem1.minus(*mem0)
		h.mem, h.memAfter = &d, mem1
	}
	if alloc1 := readAlloc(); alloc0 != nil && alloc1 != nil {
		h.allocated = &allocs{objects: alloc1.objects - alloc0.objects, bytes: alloc1.bytes - alloc0.bytes}
	}
	t0 := time.Now()
	if err := how.release(ctx); err != nil {
		return h, fmt.Errorf("let the calls go: %w", err)
	}
	done := make(chan struct{})
	go func() {
		answers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
	}
	cpu2, err := procCPU(pid)
	if err != nil {
		return h, err
	}
	h.wakeCPU = cpu2 - cpu1
	var after []time.Duration
	for _, at := range lastAnswer {
		switch {
		case at == 0:
		case at < t0.UnixNano():
			h.early++
		default:
			after = append(after, time.Duration(at-t0.UnixNano()))
		}
	}
	if h.answered = len(after); h.answered > 0 {
		slices.Sort(after)
		h.first, h.median, h.last = after[0], after[len(after)/2], after[len(after)-1]
	}
	h.err = firstErr
	h.logLines = countLines(logPath, "call waiting", "calls waiting") - logs0
	return h, nil
}

// countLines counts the occurrences in a file of each of substrs (0 if it
// cannot be read).
func countLines(path string, substrs ...string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, s := range substrs {
		n += strings.Count(string(b), s)
	}
	return n
}
