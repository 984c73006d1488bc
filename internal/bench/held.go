package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

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
}

// hold opens n calls on the held scope with its source forced open, holds
// each in OnNoRunnable, measures the target's RSS and CPU while they wait,
// clears the override and times how long until every call is answered.
// settle is how long to let the target take the calls in before measuring.
func (c *client) hold(ctx context.Context, p *process, n int, settle, window time.Duration) (held, error) {
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
	h := held{calls: n, window: window}
	logs0 := countLines(logPath, "call waiting", "calls waiting")
	override := func(a admissionv1.OverrideAction) error {
		_, err := c.adm[0].OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{
			Scope: heldScope, Source: heldSource, Action: a, Actor: "polybench", Reason: "held-waiters benchmark",
		})
		return err
	}
	if err := override(admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN); err != nil {
		return h, fmt.Errorf("force open: %w", err)
	}
	mem0 := readMem()
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
	// The calls open at most pickers at a time, as a client's pool would:
	// what is measured is holding them, not a burst of 10 000 Picks.
	pickers := make(chan struct{}, 64)
	picked.Add(n)
	answers.Add(n)
	for i := range n {
		go func() {
			defer answers.Done()
			k := i % len(c.conns)
			pickers <- struct{}{}
			p, err := c.adm[k].Pick(ctx, &admissionv1.PickRequest{Scope: heldScope})
			<-pickers
			picked.Done()
			if err != nil {
				fail(fmt.Errorf("pick: %w", err))
				return
			}
			if p.GetNoRunnable() == nil {
				fail(fmt.Errorf("pick on a forced-open source: %v, want no_runnable", p))
				return
			}
			_, err = c.adm[k].OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: heldScope, CallId: p.GetCallId()})
			if err != nil {
				fail(fmt.Errorf("on_no_runnable: %w", err))
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
	t0 := time.Now()
	if err := override(admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR); err != nil {
		return h, fmt.Errorf("clear the override: %w", err)
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
