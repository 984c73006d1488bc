package bench

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/internal/sidecartest"
)

// TestMain lets the test binary serve the floor: Run starts it as
// "<test binary> floor", as polybench starts itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "floor" {
		if err := ServeFloor(context.Background(), "127.0.0.1:0", os.Stdout); err != nil {
			os.Exit(1)
		}
		return
	}
	sidecartest.Main(m)
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     time.Duration
		bad      bool
	}{
		{name: "plain", in: "1234 (sidecar) S 1 1234 1234 0 -1 4194560 2725 0 0 0 150 37 0 0 20 0 9 0 1000 1300000000 4000 18446744073709551615",
			want: 187 * clockTick},
		{name: "command with spaces and parentheses", in: "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1 1",
			want: 7 * clockTick},
		{name: "truncated", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 3", bad: true},
		{name: "no command", in: "7 x R", bad: true},
		{name: "negative ticks", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 -3 4 0", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("parseStat(%q) = %v, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseStat(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseRSS(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int64
		bad      bool
	}{
		{name: "status", in: "Name:\tsidecar\nVmPeak:\t 1000 kB\nVmRSS:\t   19456 kB\nRssAnon:\t 100 kB\n", want: 19456 * 1024},
		{name: "no VmRSS", in: "Name:\tsidecar\n", bad: true},
		{name: "other unit", in: "VmRSS:\t 19 MB\n", bad: true},
		{name: "not a number", in: "VmRSS:\t x kB\n", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRSS(bufio.NewScanner(strings.NewReader(tc.in)))
			if tc.bad {
				if err == nil {
					t.Fatalf("parseRSS = %d, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseRSS = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestMedianPair(t *testing.T) {
	pair := func(cpu, floorCPU time.Duration) cell {
		return cell{ops: 1, cpu: cpu, floor: &cell{ops: 1, cpu: floorCPU}}
	}
	for _, tc := range []struct {
		name  string
		pairs []cell
		want  time.Duration // the cpu of the pair kept
	}{
		{name: "one", pairs: []cell{pair(3, 1)}, want: 3},
		{name: "odd: the middle ratio, not the middle cpu", pairs: []cell{pair(9, 1), pair(4, 2), pair(10, 4)}, want: 10},
		{name: "even: the lower middle", pairs: []cell{pair(4, 1), pair(1, 1), pair(3, 1), pair(2, 1)}, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := medianPair(tc.pairs); got.cpu != tc.want {
				t.Fatalf("medianPair kept the pair with cpu %v, want %v", got.cpu, tc.want)
			}
		})
	}
}

func TestParseInfoAndDelta(t *testing.T) {
	before, err := parseInfo("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=400,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=90,usec_per_call=30.00\r\n\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.500000\r\nused_cpu_sys_children:9.0\r\n" +
		"# Stats\r\ntotal_reads_processed:100\r\ntotal_writes_processed:90\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if before.cpu != 2*time.Second || before.cmds["evalsha"] != (cmdStat{calls: 10, usec: 400}) {
		t.Fatalf("parseInfo = %+v", before)
	}
	after, err := parseInfo("cmdstat_evalsha:calls=30,usec=1400,usec_per_call=46.67\ncmdstat_fcall:calls=5,usec=100,usec_per_call=20.00\n" +
		"cmdstat_get:calls=7,usec=7,usec_per_call=1.00\ncmdstat_info:calls=5,usec=150,usec_per_call=30.00\nused_cpu_sys:1.750000\nused_cpu_user:0.750000\n" +
		"total_reads_processed:150\ntotal_writes_processed:130\n")
	if err != nil {
		t.Fatal(err)
	}
	got := after.sub(before)
	want := redisDelta{cpu: 500 * time.Millisecond, calls: 32, usec: 1107, scriptCalls: 25, scriptUsec: 1100,
		byName: map[string]int64{"evalsha": 20, "fcall": 5, "get": 7}, reads: 50, writes: 40}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("delta = %+v, want %+v (INFO itself excluded, scripts and functions counted)", got, want)
	}
	// Without the stats section, no reads nor writes: -1, not 0.
	noStats, err := parseInfo("used_cpu_sys:1\nused_cpu_user:1\n")
	if err != nil || noStats.reads != -1 || noStats.writes != -1 {
		t.Fatalf("parseInfo without the stats section = %+v, %v; want reads and writes -1", noStats, err)
	}
	if d := noStats.sub(before); d.reads != -1 || d.writes != -1 {
		t.Fatalf("delta from a reading without the stats section: reads %d, writes %d; want -1", d.reads, d.writes)
	}
	for _, bad := range []string{
		"used_cpu_sys:1\nused_cpu_user:1\ntotal_reads_processed:-4\n",
		"used_cpu_sys:1\nused_cpu_user:1\ntotal_writes_processed:x\n",
		"cmdstat_get:calls=x,usec=1\nused_cpu_sys:1\nused_cpu_user:1\n",
		"used_cpu_sys:1\n",
		"used_cpu_sys:-1\nused_cpu_user:1\n",
	} {
		if _, err := parseInfo(bad); err == nil {
			t.Errorf("parseInfo(%q) gave no error", bad)
		}
	}
}

// TestRunSmoke runs every mode of the generator for a fraction of a second
// against the real sidecar binary (memory and Redis) and the floor, and
// checks that each cell did work without errors and that every held call was
// answered once the breaker was cleared. It asserts no timing.
func TestRunSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := Options{
		Sidecar: sidecartest.Binary(t), Floor: []string{os.Args[0], "floor"}, RedisAddr: redistest.Start(t).Addr,
		Ops: []string{"health", "retryafter", "attempt"}, Rounds: 1, Conns: 2, Callers: []int{2}, Rate: 200, RateCallers: 2, Warm: 50 * time.Millisecond, Cell: 200 * time.Millisecond,
		Held: 20, Settle: 100 * time.Millisecond, HoldWindow: 100 * time.Millisecond, Dir: t.TempDir(),
		SidecarEnv: []string{"GOGC=37"}, Ratelimit: ratelimitBinary(t),
	}
	rep, err := Run(ctx, o, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if want := 2*3*2 + 2; len(rep.cells) != want {
		t.Fatalf("%d cells, want %d (3 operations on memory and on Redis, 2 levels each, and the peer's decisions after the Redis attempts)", len(rep.cells), want)
	}
	var peers int
	for i, c := range rep.cells {
		if c.target != "ratelimit" {
			continue
		}
		peers++
		// The peer's cell follows the Redis attempt cell it is compared with.
		if i == 0 || rep.cells[i-1].peer == nil || rep.cells[i-1].target != "redis" || rep.cells[i-1].op != opAttempt || rep.cells[i-1].level != c.level {
			t.Errorf("the peer's cell at %v does not follow a Redis attempt cell at its level", c.level)
		}
		if c.op != opDecide || c.ops == 0 || c.errs != 0 || c.redis == nil || c.redis.byName["incrby"] == 0 || c.floor == nil {
			t.Errorf("ratelimit at %v: %+v; want decisions, no errors, INCRBYs in Redis and the attempt cell's floor", c.level, c)
		}
	}
	if peers != 2 {
		t.Errorf("%d peer cells, want 2 (one per level)", peers)
	}
	for _, c := range rep.cells {
		if c.target == "ratelimit" {
			continue
		}
		if c.floor == nil || c.floor.ops == 0 || c.floor.errs != 0 {
			t.Errorf("%s %s at %v: the floor cell before it is %+v; want some operations and no errors", c.target, c.op, c.level, c.floor)
		}
		if c.ops == 0 || c.errs != 0 {
			t.Errorf("%s %s at %v: %d operations, %d errors (first: %v); want some and none", c.target, c.op, c.level, c.ops, c.errs, c.err)
		}
		// Allocations come from the sidecar's /metrics: every operation
		// allocates (a request, at least).
		if c.allocs == nil || c.allocs.objects < float64(c.ops) || c.allocs.bytes <= c.allocs.objects {
			t.Errorf("%s %s at %v: allocations %+v over %d operations; want at least one object per operation", c.target, c.op, c.level, c.allocs, c.ops)
		}
		if c.floor != nil && c.floor.allocs != nil {
			t.Errorf("floor cell before %s %s at %v: allocations %+v; the floor has no /metrics", c.target, c.op, c.level, c.floor.allocs)
		}
		if c.target == "redis" && c.op == opAttempt && (c.redis == nil || c.redis.scriptCalls == 0) {
			t.Errorf("redis attempts at %v: Redis reports no script calls: %+v", c.level, c.redis)
		}
	}
	if len(rep.held) != 3 || rep.held[0].target != "floor" {
		t.Fatalf("%d held results, want the floor's, then memory and redis", len(rep.held))
	}
	for _, h := range rep.held {
		if h.answered != o.Held || h.early != 0 || h.err != nil {
			t.Errorf("%s: %d of %d held calls answered after the release, %d before; first error %v", h.target, h.answered, o.Held, h.early, h.err)
		}
		if h.target == "floor" {
			continue // no /metrics
		}
		// The runtime breakdown comes from the sidecar's /metrics; the held
		// calls' goroutines are in it (on the server's stream workers, so
		// they need not be new ones).
		if h.mem == nil || h.memAfter == nil || h.memAfter.goroutines < float64(o.Held) || h.memAfter.stacks <= 0 {
			t.Errorf("%s: runtime memory %+v, at the end %+v; want the state with %d held goroutines", h.target, h.mem, h.memAfter, o.Held)
		}
		if h.memAfter != nil && h.memAfter.gogc != 37 {
			t.Errorf("%s: the sidecar runs with GOGC %v, want 37 from SidecarEnv", h.target, h.memAfter.gogc)
		}
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "× floor CPU") || !strings.Contains(out.String(), "× floor RSS") || !strings.Contains(out.String(), "allocs/op") {
		t.Errorf("the report has no ratio column:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "÷ ratelimit's per decision"); n != 2 {
		t.Errorf("the report has %d lines comparing Redis's work with the peer's, want 2:\n%s", n, out.String())
	}
}

func TestReadGoMem(t *testing.T) {
	const scrape = `# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 4000
# TYPE go_memstats_heap_alloc_bytes gauge
go_memstats_heap_alloc_bytes 3000
# TYPE go_memstats_heap_idle_bytes gauge
go_memstats_heap_idle_bytes 900
# TYPE go_memstats_heap_released_bytes gauge
go_memstats_heap_released_bytes 600
# TYPE go_memstats_stack_inuse_bytes gauge
go_memstats_stack_inuse_bytes 8192
# TYPE go_memstats_next_gc_bytes gauge
go_memstats_next_gc_bytes 5000
# TYPE go_goroutines gauge
go_goroutines 12
# TYPE go_gc_gogc_percent gauge
go_gc_gogc_percent 100
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 7
`
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) }))
		t.Cleanup(srv.Close)
		return srv.URL + "/metrics"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := readGoMem(ctx, serve(scrape))
	want := goMem{heapInuse: 4000, heapAlloc: 3000, heapKept: 300, stacks: 8192, heapGoal: 5000, gcs: 7, goroutines: 12, gogc: 100}
	if err != nil || got != want {
		t.Fatalf("readGoMem = %+v, %v; want %+v", got, err, want)
	}
	if d := want.minus(goMem{stacks: 4096, gcs: 2}); d.stacks != 4096 || d.gcs != 5 {
		t.Fatalf("minus: %+v, want stacks 4096 and 5 GCs", d)
	}
	// A scrape without a gauge the breakdown needs is an error, not a zero.
	if _, err := readGoMem(ctx, serve(strings.Replace(scrape, "go_memstats_stack_inuse_bytes 8192\n", "", 1))); err == nil {
		t.Fatal("readGoMem without go_memstats_stack_inuse_bytes: no error")
	}
	const counters = `# TYPE go_memstats_mallocs_total counter
go_memstats_mallocs_total 1234
# TYPE go_memstats_alloc_bytes_total counter
go_memstats_alloc_bytes_total 56789
`
	if a, err := readAllocs(ctx, serve(counters)); err != nil || a != (allocs{objects: 1234, bytes: 56789}) {
		t.Fatalf("readAllocs = %+v, %v; want 1234 objects, 56789 bytes", a, err)
	}
	if _, err := readAllocs(ctx, serve(strings.Replace(counters, "go_memstats_mallocs_total 1234\n", "", 1))); err == nil {
		t.Fatal("readAllocs without go_memstats_mallocs_total: no error")
	}
}

// ratelimitEnv names envoy's ratelimit service's binary for the tests (make
// gotest sets it). Not POLYGATE_…: the sidecars the tests start inherit the
// environment, and the sidecar reads every POLYGATE_ variable as its
// configuration (config.EnvPrefix) and refuses one it does not know.
const ratelimitEnv = "POLYBENCH_RATELIMIT"

// ratelimitBinary is envoy's ratelimit service's binary: $POLYBENCH_RATELIMIT,
// else bin/ratelimit at the repository's root. The test fails without it:
// make tools builds it.
func ratelimitBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(ratelimitEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v (make tools builds bin/ratelimit)", ratelimitEnv, p, err)
		}
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/polygate/polygate\n") {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no polygate repository root above the test's directory to find bin/ratelimit in; set %s", ratelimitEnv)
		}
		dir = parent
	}
	p := filepath.Join(dir, "bin", "ratelimit")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("envoy's ratelimit service is not built (%v): make tools builds bin/ratelimit from tools/ratelimit/go.mod", err)
	}
	return p
}

// TestRatelimitEnv: the variable make gotest passes is the one the tests
// read, and the sidecar does not take it for its own.
func TestRatelimitEnv(t *testing.T) {
	if strings.HasPrefix(ratelimitEnv, config.EnvPrefix) {
		t.Fatalf("%s starts with the sidecar's %s: every sidecar a test starts would refuse it", ratelimitEnv, config.EnvPrefix)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), ratelimitEnv+"=$(BIN)/ratelimit go test") {
		t.Fatalf("the Makefile's gotest does not pass %s=$(BIN)/ratelimit", ratelimitEnv)
	}
}

func TestDecisionWire(t *testing.T) {
	// RateLimitRequest{domain: "polybench", descriptors: [{entries: [{key: "bench", value: "only"}]}], hits_addend: 1}
	want := []byte("\x0a\x09polybench\x12\x0f\x0a\x0d\x0a\x05bench\x12\x04only\x18\x01")
	if !bytes.Equal(decisionRequest, want) {
		t.Fatalf("decisionRequest = %q, want %q", decisionRequest, want)
	}
	// A status: {code OK, current_limit {requests_per_unit 4e9, unit HOUR}, limit_remaining 5}.
	const limitedOK = "\x12\x0e\x08\x01\x12\x08\x08\x80\xd0\xac\xf3\x0e\x10\x03\x18\x05"
	for _, tc := range []struct {
		name    string
		in      string
		want    uint64
		limited bool
		bad     bool
	}{
		{name: "ok with a limit", in: "\x08\x01" + limitedOK, want: codeOK, limited: true},
		{name: "status first", in: limitedOK + "\x08\x01", want: codeOK, limited: true},
		{name: "over the limit", in: "\x12\x06\x08\x02\x12\x02\x08\x14\x08\x02", want: codeOverLimit, limited: true},
		{name: "ok, no limit matched", in: "\x08\x01\x12\x02\x08\x01", want: codeOK},
		{name: "ok, no status", in: "\x08\x01", want: codeOK},
		{name: "one of two statuses without a limit", in: "\x08\x01" + limitedOK + "\x12\x00", want: codeOK},
		{name: "unknown fields skipped", in: "\x3a\x03abc\x08\x01\x45\x01\x02\x03\x04" + limitedOK, want: codeOK, limited: true},
		{name: "empty: no overall_code", in: "", bad: true},
		{name: "overall_code as bytes", in: "\x0a\x01\x01", bad: true},
		{name: "truncated varint", in: "\x08\x80", bad: true},
		{name: "length past the end", in: "\x08\x01\x12\x7f\x08", bad: true},
		{name: "a status that does not parse", in: "\x08\x01\x12\x02\x12\x05", bad: true},
		{name: "bad tag", in: "\x00", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, limited, err := decisionOf([]byte(tc.in))
			if tc.bad {
				if err == nil {
					t.Fatalf("decisionOf(%q) = %d, %v; want an error", tc.in, got, limited)
				}
				return
			}
			if err != nil || got != tc.want || limited != tc.limited {
				t.Fatalf("decisionOf(%q) = %d, %v, %v; want %d, %v", tc.in, got, limited, err, tc.want, tc.limited)
			}
		})
	}
}

// TestRatelimitPeer starts envoy's real ratelimit service against a real
// redis-server: decisions one after the other are answered OK, each one
// INCRBY and one EXPIRE in Redis, exactly; a cell of concurrent ones counts
// no error. Then, once a small limit is used up, refusals are errors: the
// check reads the answers. It asserts no timing.
func TestRatelimitPeer(t *testing.T) {
	bin := ratelimitBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type peer struct {
		cl   *client
		pid  int
		info func(context.Context) (redisStats, error)
	}
	start := func(t *testing.T, limit uint32) peer {
		srv := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		info := func(ctx context.Context) (redisStats, error) {
			s, err := rdb.Info(ctx, "commandstats", "cpu", "stats").Result()
			if err != nil {
				return redisStats{}, err
			}
			return parseInfo(s)
		}
		p, err := startRatelimit(ctx, bin, srv.Addr, t.TempDir(), limit, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.stop)
		cl, err := dial(p.addr, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.close)
		return peer{cl: cl, pid: p.pid(), info: info}
	}
	// sequential makes n decisions one after the other and returns what
	// Redis ran meanwhile and the errors.
	sequential := func(t *testing.T, p peer, n int) (redisDelta, []error) {
		before, err := p.info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var errs []error
		for range n {
			if err := p.cl.decide(ctx, 0); err != nil {
				errs = append(errs, err)
			}
		}
		after, err := p.info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return after.sub(before), errs
	}
	t.Run("allowed", func(t *testing.T) {
		p := start(t, peerLimit)
		const n = 50
		d, errs := sequential(t, p, n)
		if len(errs) != 0 {
			t.Fatalf("%d of %d decisions failed, the first: %v", len(errs), n, errs[0])
		}
		if d.byName["incrby"] != n || d.byName["expire"] != n {
			t.Fatalf("Redis over %d decisions: %+v; want exactly one INCRBY and one EXPIRE each", n, d)
		}
		// The stats section was read: the decisions' connection reads.
		if d.reads < n || d.writes < n {
			t.Errorf("Redis over %d decisions: %d reads, %d writes; want one of each per decision at least (INFO's stats section)", n, d.reads, d.writes)
		}
		c, err := p.cl.run(ctx, opDecide, level{callers: 4}, 50*time.Millisecond, 300*time.Millisecond, probe{pid: p.pid, redis: p.info})
		if err != nil {
			t.Fatal(err)
		}
		if c.ops == 0 || c.errs != 0 || c.redis == nil || c.redis.byName["incrby"] == 0 {
			t.Fatalf("a cell of 4 callers: %d decisions, %d errors (first: %v), Redis %+v; want some, none, and INCRBYs", c.ops, c.errs, c.err, c.redis)
		}
	})
	t.Run("over the limit", func(t *testing.T) {
		const limit = 20
		p := start(t, limit) // its start took one decision
		d, errs := sequential(t, p, 2*limit)
		// The limit is per hour: should the decisions straddle an hour's
		// start (a new key, a new count), still at most 2·limit − 1 of them
		// are allowed.
		if len(errs) == 0 || !strings.Contains(errs[0].Error(), "OVER_LIMIT") {
			t.Fatalf("limit %d: %d more decisions, %d refused (first: %v); want the refusals as errors naming OVER_LIMIT", limit, 2*limit, len(errs), errs)
		}
		if d.byName["incrby"] != 2*limit {
			t.Errorf("limit %d: %d INCRBYs over %d decisions; want one each, refused or not", limit, d.byName["incrby"], 2*limit)
		}
		c, err := p.cl.run(ctx, opDecide, level{callers: 2}, 20*time.Millisecond, 200*time.Millisecond, probe{pid: p.pid})
		if err != nil {
			t.Fatal(err)
		}
		if c.errs == 0 || c.err == nil || !strings.Contains(c.err.Error(), "OVER_LIMIT") {
			t.Fatalf("limit %d, used up: a cell counted %d errors (first: %v), %d allowed; want the refusals counted as errors", limit, c.errs, c.err, c.ops)
		}
	})
}

// TestPrintPeer: the line under the table divides Redis's CPU per attempt
// cycle by its CPU per peer decision, prints the rounds' median ratio, and says
// when errors make the two not comparable.
func TestPrintPeer(t *testing.T) {
	line := func(attemptErrs, peerErrs int64, rounds []float64) string {
		peer := cell{target: "ratelimit", op: opDecide, level: level{callers: 64}, ops: 100, errs: peerErrs,
			redis: &redisDelta{cpu: 2 * time.Millisecond, calls: 200, byName: map[string]int64{"incrby": 100, "expire": 100, "ping": 0}, reads: 70, writes: 70}}
		attempt := cell{target: "redis", op: opAttempt, level: level{callers: 64}, ops: 100, errs: attemptErrs, peer: &peer, peerRatios: rounds,
			redis: &redisDelta{cpu: 5 * time.Millisecond, calls: 10, scriptCalls: 10, reads: 10, writes: 10}}
		var b strings.Builder
		(&Report{cells: []cell{attempt, peer}}).printPeer(&b)
		return b.String()
	}
	got := line(0, 0, []float64{2.5})
	for _, want := range []string{
		"redis attempt 64: redis CPU per attempt cycle 50.0 µs ÷ ratelimit's per decision 20.0 µs = 2.50× (target ≤ 2×)\n",
		"Redis per decision: 2.00 commands (expire 1.00, incrby 1.00), 0.70 reads; per attempt cycle: 0.10 reads, 0.10 script calls\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("printPeer wrote\n%s\nwant a line with %q", got, want)
		}
	}
	if got := line(0, 0, []float64{3, 2.1, 2.4}); !strings.Contains(got, "= 2.40× (median of the rounds: 3.00, 2.10, 2.40)") {
		t.Errorf("with rounds: %s", got)
	}
	if got := line(0, 3, nil); !strings.Contains(got, "not comparable: 0 attempt errors, 3 ratelimit errors") {
		t.Errorf("with the peer's errors: %s", got)
	}
	if got := line(1, 0, nil); !strings.Contains(got, "not comparable: 1 attempt errors, 0 ratelimit errors") {
		t.Errorf("with the attempts' errors: %s", got)
	}
}
