package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// op is one kind of operation the generator repeats.
type op string

const (
	opHealth     op = "health"     // grpc.health.v1.Health/Check
	opRetryAfter op = "retryafter" // RetryAfter on the bench scope
	opAttempt    op = "attempt"    // Pick + RecordOutcome(SUCCESS): two RPCs
)

// level is how hard a cell pushes: callers in a closed loop, or, with rate
// set, callers sharing a fixed rate (operations per second).
type level struct {
	callers int
	rate    float64
}

func (l level) String() string {
	if l.rate > 0 {
		return fmt.Sprintf("%.0f/s", l.rate)
	}
	return fmt.Sprint(l.callers)
}

// client is the generator's side: a fixed number of connections, callers
// spread over them round robin.
type client struct {
	conns  []*grpc.ClientConn
	adm    []admissionv1.AdmissionServiceClient
	health []healthpb.HealthClient
}

func dial(addr string, n int) (*client, error) {
	c := &client{}
	for range n {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		c.conns = append(c.conns, cc)
		c.adm = append(c.adm, admissionv1.NewAdmissionServiceClient(cc))
		c.health = append(c.health, healthpb.NewHealthClient(cc))
	}
	return c, nil
}

func (c *client) close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}

// benchScope is the scope the sidecar serves for attempts and RetryAfter:
// one source whose limits never refuse the generator.
const benchScope = "bench"

// do runs one operation as caller i.
func (c *client) do(ctx context.Context, o op, i int) error {
	k := i % len(c.conns)
	switch o {
	case opHealth:
		_, err := c.health[k].Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	case opRetryAfter:
		_, err := c.adm[k].RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: benchScope})
		return err
	case opAttempt:
		p, err := c.adm[k].Pick(ctx, &admissionv1.PickRequest{Scope: benchScope})
		if err != nil {
			return err
		}
		g := p.GetGrant()
		if g == nil {
			return fmt.Errorf("pick: no grant (%v)", p)
		}
		_, err = c.adm[k].RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{
			Scope: benchScope, CallId: p.GetCallId(), PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS,
		})
		return err
	case opDecide:
		return c.decide(ctx, k)
	}
	return fmt.Errorf("unknown operation %q", o)
}

// cell is one measured run: one operation, one level, one target.
type cell struct {
	target string
	op     op
	level  level
	ops    int64
	wall   time.Duration
	cpu    time.Duration // the target process's CPU over the window
	allocs *allocs       // the target's heap allocations over the window (nil: not read)
	p50    time.Duration
	p99    time.Duration
	errs   int64
	err    error // the first error
	redis  *redisDelta
	floor  *cell // the floor's health cell measured just before, same level
	// peer is, on a Redis attempt cell, the peer's decision cell measured
	// just after it at the same level (nil: no peer).
	peer *cell
	// peerRatios are, with a peer, each round's redis CPU per operation
	// of this cell's kind ÷ the peer's cell of the same round.
	peerRatios []float64
}

func (c cell) perSec() float64 { return float64(c.ops) / c.wall.Seconds() }

// cpuPerOp is the target's CPU per operation; 0 when nothing ran.
func (c cell) cpuPerOp() time.Duration {
	if c.ops == 0 {
		return 0
	}
	return c.cpu / time.Duration(c.ops)
}

// redisCPUPerOp is redis-server's CPU per operation over the cell, in µs (0:
// no Redis reading, or nothing ran).
func (c cell) redisCPUPerOp() float64 {
	if c.redis == nil || c.ops == 0 {
		return 0
	}
	return us(c.redis.cpu) / float64(c.ops)
}

// probe reads the state that a cell measures the change of.
type probe struct {
	pid   int
	redis func(context.Context) (redisStats, error) // nil: no Redis
	// allocs reads the target's allocations so far (nil: the floor, which
	// has no /metrics).
	allocs func(context.Context) (allocs, error)
}

// run drives one cell: callers start, run for warm unmeasured, then for dur
// (or until the first operation ends, if later) measured (operations, CPU,
// latencies, Redis work), then stop.
func (c *client) run(ctx context.Context, o op, lv level, warm, dur time.Duration, pr probe) (cell, error) {
	res := cell{op: o, level: lv}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		measuring atomic.Bool
		ops, errs atomic.Int64
		firstErr  atomic.Pointer[error]
		wg        sync.WaitGroup
		lats      = make([][]time.Duration, lv.callers)
	)
	start := time.Now()
	for w := range lv.callers {
		wg.Go(func() {
			var interval time.Duration
			if lv.rate > 0 {
				interval = time.Duration(float64(lv.callers) / lv.rate * float64(time.Second))
			}
			next := start.Add(time.Duration(w) * interval / time.Duration(lv.callers))
			for ctx.Err() == nil {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						t := time.NewTimer(d)
						select {
						case <-ctx.Done():
							t.Stop()
							return
						case <-t.C:
						}
					}
					next = next.Add(interval)
				}
				t0 := time.Now()
				err := c.do(ctx, o, w)
				if !measuring.Load() {
					continue
				}
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				ops.Add(1)
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	stopAll := func() {
		cancel()
		wg.Wait()
	}
	if !sleep(ctx, warm) {
		stopAll()
		return res, ctx.Err()
	}
	// The readings nest around the measured window, the cheap ones inside:
	// the allocations (an HTTP scrape of the target, milliseconds) outside
	// Redis's and the CPU's, so that neither Redis's work nor the target's
	// CPU includes operations done while a scrape ran and not counted.
	var (
		a0  allocs
		r0  redisStats
		err error
	)
	if pr.allocs != nil {
		if a0, err = pr.allocs(ctx); err != nil {
			stopAll()
			return res, err
		}
	}
	if pr.redis != nil {
		if r0, err = pr.redis(ctx); err != nil {
			stopAll()
			return res, err
		}
	}
	cpu0, err := procCPU(pr.pid)
	if err != nil {
		stopAll()
		return res, err
	}
	t0 := time.Now()
	measuring.Store(true)
	// At least dur, and until an operation ended: on a machine busy enough
	// to stall the target for all of dur, a cell of nothing measures
	// nothing.
	for ok := sleep(ctx, dur); ok && ops.Load()+errs.Load() == 0; {
		ok = sleep(ctx, dur/10+time.Millisecond)
	}
	measuring.Store(false)
	res.wall = time.Since(t0)
	res.ops, res.errs = ops.Load(), errs.Load()
	cpu1, err := procCPU(pr.pid)
	if err != nil {
		stopAll()
		return res, err
	}
	res.cpu = cpu1 - cpu0
	if pr.redis != nil {
		r1, err := pr.redis(ctx)
		if err != nil {
			stopAll()
			return res, err
		}
		d := r1.sub(r0)
		res.redis = &d
	}
	if pr.allocs != nil {
		a1, err := pr.allocs(ctx)
		if err != nil {
			stopAll()
			return res, err
		}
		res.allocs = &allocs{objects: a1.objects - a0.objects, bytes: a1.bytes - a0.bytes}
	}
	stopAll()
	if e := firstErr.Load(); e != nil {
		res.err = *e
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	if len(all) > 0 {
		res.p50 = all[len(all)/2]
		res.p99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return res, nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
