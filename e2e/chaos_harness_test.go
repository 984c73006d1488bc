package e2e

// The chaos harness: faults injected into the real processes (the sidecar
// binary, redis-server) while a load of callers drives the sidecar over
// gRPC, and the invariants checked on what the callers saw.
//
//   - chaosSidecar: a sidecar whose configuration file stays put, so the test
//     can kill -9 it and start it again on the same file (and state_path).
//   - Redis faults come from internal/redistest: Server.Pause / Resume
//     (SIGSTOP / SIGCONT), Server.Stop then Start (kill -9, restart on the same
//     port and directory), and redistest.AppendFsyncAlways as Start's extra
//     arguments for a server that keeps every acknowledged write across that.
//   - loadDriver: N callers doing Pick → hold → RecordOutcome(SUCCESS), with
//     every answer's time recorded and the holders counted.
//   - waitInFlight: the "slots free again" check: DescribeScope's in_flight
//     equals the callers' real holders.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// chaosSidecar is a sidecar that can be killed and started again on the
// same configuration file.
type chaosSidecar struct {
	t    *testing.T
	file string
	proc *sidecartest.Sidecar
	raw  admissionv1.AdmissionServiceClient
	conn *grpc.ClientConn
}

// startChaosSidecar writes config to a file and starts the binary on it.
func startChaosSidecar(t *testing.T, config string) *chaosSidecar {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &chaosSidecar{t: t, file: file}
	c.start()
	return c
}

func (c *chaosSidecar) start() {
	c.t.Helper()
	proc := sidecartest.Start(c.t, []string{"--config", c.file, "--listen", "127.0.0.1:0"})
	c.t.Cleanup(func() {
		if c.t.Failed() {
			c.t.Logf("sidecar %s logs:\n%s", proc.Addr, proc.Logs())
		}
	})
	conn, err := grpc.NewClient(proc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	c.proc, c.raw, c.conn = proc, admissionv1.NewAdmissionServiceClient(conn), conn
}

// kill9 kills the sidecar with SIGKILL, as a crash or the OOM killer would
// (no drain, no last write), and waits until it is gone.
func (c *chaosSidecar) kill9() {
	c.t.Helper()
	c.proc.Signal(c.t, syscall.SIGKILL)
	if err := c.proc.Stop(c.t); err == nil {
		c.t.Fatal("the sidecar exited cleanly after SIGKILL")
	}
}

// restart starts the binary again on the same configuration file (on a new
// port); raw then talks to the new process.
func (c *chaosSidecar) restart() { c.t.Helper(); c.start() }

// source reads one source of a scope with DescribeScope.
func (c *chaosSidecar) source(ctx context.Context, scope, name string) (*admissionv1.SourceState, error) {
	d, err := c.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		return nil, err
	}
	for _, s := range d.GetScope().GetSources() {
		if s.GetName() == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("scope %s has no source %s", scope, name)
}

// protections are what a restart must not forget, set on two single-source
// scopes (source primary): an operator's FORCE_OPEN, with actor and reason,
// on forced, and a breaker OPEN by a SOURCE_DEAD outcome on dead.
type protections struct {
	forced, dead string
	// opened is a moment after the dead breaker opened.
	opened time.Time
}

const (
	protectActor  = "alice"
	protectReason = "INC-42 garbage answers"
)

// protect sets the protections on scopes forced and dead.
func (c *chaosSidecar) protect(ctx context.Context, forced, dead string) protections {
	c.t.Helper()
	if _, err := c.raw.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: forced, Source: "primary",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: protectActor, Reason: protectReason}); err != nil {
		c.t.Fatal(err)
	}
	pick, err := c.raw.Pick(ctx, &admissionv1.PickRequest{Scope: dead})
	if err != nil || pick.GetGrant() == nil {
		c.t.Fatalf("Pick(%s) = %v, %v; want a grant", dead, pick, err)
	}
	if _, err := c.raw.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: dead, CallId: pick.GetCallId(),
		PermitId: pick.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SOURCE_DEAD, HttpStatus: 401}); err != nil {
		c.t.Fatal(err)
	}
	return protections{forced: forced, dead: dead, opened: time.Now()}
}

// read reads both protected sources back, and when they were read.
func (p protections) read(ctx context.Context, c *chaosSidecar) (forced, dead *admissionv1.SourceState, at time.Time, err error) {
	at = time.Now()
	if forced, err = c.source(ctx, p.forced, "primary"); err != nil {
		return nil, nil, at, err
	}
	dead, err = c.source(ctx, p.dead, "primary")
	return forced, dead, at, err
}

// inForce reports whether what read returned shows both protections.
func inForce(forced, dead *admissionv1.SourceState) bool {
	return forced.GetOverride() == admissionv1.Override_OVERRIDE_FORCED_OPEN && dead.GetState() == admissionv1.BreakerState_BREAKER_STATE_OPEN
}

// roundings is what whole milliseconds (the backends', Redis's TIME, a
// re-asserted cooldown's rest) may add to a remaining cooldown read back.
const roundings = 5 * time.Millisecond

// check checks that both protections are in force as they were set (read
// at at): the override with its actor and reason; the OPEN with reopens 1,
// its cause, and no more than the rest of its cooldown left (plus later,
// how much later a re-asserted OPEN may end: the re-assert's round trip);
// and that a Pick of either scope is refused.
func (p protections) check(t *testing.T, ctx context.Context, c *chaosSidecar, forced, dead *admissionv1.SourceState, at time.Time, cooldown, later time.Duration) {
	t.Helper()
	if forced.GetOverride() != admissionv1.Override_OVERRIDE_FORCED_OPEN || forced.GetOverrideActor() != protectActor || forced.GetOverrideReason() != protectReason {
		t.Errorf("override = %v by %q (%q); want FORCED_OPEN by %s (%q)", forced.GetOverride(), forced.GetOverrideActor(), forced.GetOverrideReason(), protectActor, protectReason)
	}
	if ra := dead.GetRetryAfter().AsDuration(); dead.GetState() != admissionv1.BreakerState_BREAKER_STATE_OPEN || dead.GetReopens() != 1 ||
		dead.GetOpenCause() != admissionv1.OpenCause_OPEN_CAUSE_SOURCE_DEAD || ra <= 0 || ra > cooldown-at.Sub(p.opened)+later+roundings {
		t.Errorf("dead source: %v by %v, reopens %d, retry_after %v; want OPEN by source_dead for the rest of its %v cooldown",
			dead.GetState(), dead.GetOpenCause(), dead.GetReopens(), ra, cooldown)
	}
	for _, scope := range []string{p.forced, p.dead} {
		if pk, err := c.raw.Pick(ctx, &admissionv1.PickRequest{Scope: scope}); err != nil || pk.GetGrant() != nil {
			t.Errorf("Pick(%s) = %v, %v; want NoRunnable", scope, pk, err)
		}
	}
}

// answer is one RPC a caller of the load made.
type answer struct {
	rpc     string
	start   time.Time
	took    time.Duration
	code    codes.Code
	granted bool
}

// loadDriver runs callers against one scope. Each caller loops: Pick (a new
// call); on a grant it holds the permit for hold, then reports SUCCESS; on
// NoRunnable it cancels the call; on an error it pauses for pause. A caller
// is a holder from the grant's arrival until it sends RecordOutcome: the
// sidecar must never let more of them hold than max_concurrency.
type loadDriver struct {
	raw         admissionv1.AdmissionServiceClient
	scope       string
	tokens      int64
	hold, pause time.Duration
	max         int64

	holders    atomic.Int64
	peak       atomic.Int64
	grants     atomic.Int64
	violations atomic.Int64

	mu      sync.Mutex
	answers []answer

	stop chan struct{}
	wg   sync.WaitGroup
}

// startLoad starts n callers; maxHolders is the invariant's bound (the
// source's max_concurrency).
func startLoad(t *testing.T, raw admissionv1.AdmissionServiceClient, scope string, n, maxHolders int, hold, pause time.Duration) *loadDriver {
	l := &loadDriver{raw: raw, scope: scope, hold: hold, pause: pause, max: int64(maxHolders), stop: make(chan struct{})}
	for range n {
		l.wg.Go(l.caller)
	}
	t.Cleanup(l.drain)
	return l
}

func (l *loadDriver) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *loadDriver) record(rpc string, start time.Time, err error, granted bool) {
	a := answer{rpc: rpc, start: start, took: time.Since(start), code: status.Code(err), granted: granted}
	l.mu.Lock()
	l.answers = append(l.answers, a)
	l.mu.Unlock()
}

// wait sleeps d: the load's pacing, not a test's waiting for a condition.
func (l *loadDriver) wait(d time.Duration) {
	select {
	case <-l.stop:
	case <-time.After(d):
	}
}

func (l *loadDriver) caller() {
	// Every RPC is bounded by the harness's timeout, never by the fault.
	for !l.stopped() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		resp, err := l.raw.Pick(ctx, &admissionv1.PickRequest{Scope: l.scope, EstimatedTokens: l.tokens})
		g := resp.GetGrant()
		l.record("Pick", start, err, g != nil)
		switch {
		case err != nil:
			l.wait(l.pause)
		case g != nil:
			l.grants.Add(1)
			h := l.holders.Add(1)
			for p := l.peak.Load(); h > p && !l.peak.CompareAndSwap(p, h); p = l.peak.Load() {
			}
			if h > l.max {
				l.violations.Add(1)
			}
			time.Sleep(l.hold) // the attempt
			l.holders.Add(-1)
			start = time.Now()
			_, err = l.raw.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: l.scope, CallId: resp.GetCallId(),
				PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
			l.record("RecordOutcome", start, err, false)
		default:
			start = time.Now()
			_, err = l.raw.CancelCall(ctx, &admissionv1.CancelCallRequest{Scope: l.scope, CallId: resp.GetCallId()})
			l.record("CancelCall", start, err, false)
			l.wait(l.pause)
		}
		cancel()
	}
}

// drain stops the callers: each finishes its step (a held permit is
// reported) and returns. Afterwards nobody holds a permit.
func (l *loadDriver) drain() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// stats summarizes the answers to RPCs that started in [from, to).
type stats struct {
	n, errs, grants int
	worst           answer
	p50             time.Duration
}

func (l *loadDriver) stats(from, to time.Time) stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s stats
	var took []time.Duration
	for _, a := range l.answers {
		if a.start.Before(from) || !a.start.Before(to) {
			continue
		}
		s.n++
		took = append(took, a.took)
		if a.code != codes.OK {
			s.errs++
		}
		if a.granted {
			s.grants++
		}
		if a.took > s.worst.took {
			s.worst = a
		}
	}
	if len(took) > 0 {
		slices.Sort(took)
		s.p50 = took[len(took)/2]
	}
	return s
}

// worstBelow is the longest answer under limit to an RPC that started in
// [from, to) (0 if none).
func (l *loadDriver) worstBelow(from, to time.Time, limit time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var worst time.Duration
	for _, a := range l.answers {
		if !a.start.Before(from) && a.start.Before(to) && a.took < limit {
			worst = max(worst, a.took)
		}
	}
	return worst
}

func (s stats) String() string {
	return fmt.Sprintf("%d answers (%d errors, %d grants), p50 %v, worst %v (%s, %v)",
		s.n, s.errs, s.grants, s.p50.Round(time.Millisecond), s.worst.took.Round(time.Millisecond), s.worst.rpc, s.worst.code)
}

// freeAgain is what waitInFlight saw.
type freeAgain struct {
	// backAt: the first DescribeScope that read the shared backend again
	// (not a local fallback); freeAt: the first whose in_flight equalled
	// the real holders, at or after backAt. Zero if never.
	backAt, freeAt time.Time
	// firstInFlight is the in_flight of the first read at backAt (with a
	// drained load: the permits nobody holds); inFlight the last one.
	firstInFlight, inFlight int32
}

// waitInFlight polls DescribeScope until the source's in_flight, read from
// the shared backend (the scope's backend does not say "unavailable"),
// equals the load's real holders (read before and after, unchanged), or ctx
// ends. With the load drained the holders are 0, so the check is exact;
// under a running load it can only hold at a quiet moment.
func waitInFlight(ctx context.Context, sc *chaosSidecar, l *loadDriver, scope, source string) freeAgain {
	f := freeAgain{firstInFlight: -1, inFlight: -1}
	for {
		before := l.holders.Load()
		d, err := sc.raw.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
		if err == nil && !strings.Contains(d.GetScope().GetBackend(), "unavailable") {
			if f.backAt.IsZero() {
				f.backAt = time.Now()
			}
			for _, s := range d.GetScope().GetSources() {
				if s.GetName() == source {
					f.inFlight = s.GetInFlight()
				}
			}
			if f.firstInFlight < 0 {
				f.firstInFlight = f.inFlight
			}
			if int64(f.inFlight) == before && l.holders.Load() == before {
				f.freeAt = time.Now()
				return f
			}
		}
		select {
		case <-ctx.Done():
			return f
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// control measures the sidecar's own answer time, with no backend in it: a
// caller that asks the health service over and over until stop. On a loaded
// machine an answer can wait for a CPU far longer than for Redis; the worst
// control answer in a window is that window's scheduling delay.
type control struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	done    chan struct{}
}

func startControl(t *testing.T, conn *grpc.ClientConn, every time.Duration) *control {
	c := &control{stop: make(chan struct{}), done: make(chan struct{})}
	hc := healthpb.NewHealthClient(conn)
	go func() {
		defer close(c.done)
		for {
			select {
			case <-c.stop:
				return
			case <-time.After(every):
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			start := time.Now()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			c.mu.Lock()
			c.answers = append(c.answers, answer{rpc: "Health.Check", start: start, took: time.Since(start), code: status.Code(err)})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(c.end)
	return c
}

func (c *control) end() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// worst is the longest control answer that overlapped [from, to).
func (c *control) worst(from, to time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var w time.Duration
	for _, a := range c.answers {
		if a.start.Before(to) && a.start.Add(a.took).After(from) {
			w = max(w, a.took)
		}
	}
	return w
}
