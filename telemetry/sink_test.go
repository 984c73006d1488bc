package telemetry

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/admissiontest"
	"github.com/polygate/polygate/policy"
)

// The tests run in testing/synctest bubbles: the sink's clock, its tickers
// and the scope's server-side waits follow the bubble's fake clock, so every
// duration below is exact.

func testLog() (*slog.Logger, *admissiontest.LockedBuffer) {
	buf := &admissiontest.LockedBuffer{}
	return slog.New(slog.NewTextHandler(buf, nil)), buf
}

// count is how many lines logged msg.
func count(logs *admissiontest.LockedBuffer, msg string) int {
	return strings.Count(logs.String(), `msg="`+msg)
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return c
}

// openTest opens a sink on a fresh database in the test's directory.
func openTest(t *testing.T, o Options) (*Sink, *sql.DB) {
	t.Helper()
	o.Path = filepath.Join(t.TempDir(), "telemetry.db")
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", o.Path)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

func newScope(t *testing.T, yaml string, o policy.Observer) *policy.Scope {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	return policy.NewScope(cfg.Scopes["s"], inmem.New(time.Now), policy.Options{Rand: func() float64 { return 0.5 }, Observer: o})
}

func mustGrant(t *testing.T, s *policy.Scope, c *policy.Call) *policy.Grant {
	t.Helper()
	p, err := s.Pick(ctx(t), c)
	if err != nil || p.Grant == nil {
		t.Fatalf("Pick: %v %+v", err, p)
	}
	return p.Grant
}

func mustRecord(t *testing.T, s *policy.Scope, c *policy.Call, g *policy.Grant, a policy.Attempt) policy.Recorded {
	t.Helper()
	a.PermitID = g.Permit.ID
	r, err := s.RecordOutcome(ctx(t), c, a)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type callRow struct {
	scope, result                       string
	reason                              sql.NullString
	attempts, charged                   int
	started, ended, productive, waiting int64
}

func readCall(t *testing.T, db *sql.DB, id string) callRow {
	t.Helper()
	var r callRow
	err := db.QueryRow(`SELECT scope, result, failure_reason, attempts, charged_attempts, started_ns, ended_ns, productive_ns, waiting_ns
		FROM calls WHERE call_id = ?`, id).Scan(&r.scope, &r.result, &r.reason, &r.attempts, &r.charged, &r.started, &r.ended, &r.productive, &r.waiting)
	if err != nil {
		t.Fatalf("call %s: %v", id, err)
	}
	return r
}

// TestRecordsAnswerWaitedAndAttempts drives calls through a scope whose
// observer is the sink and checks that the rows answer "how long did this
// call wait, and how many attempts did it make" exactly.
func TestRecordsAnswerWaitedAndAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink, db := openTest(t, Options{Retention: 24 * time.Hour})
		defer db.Close()
		defer sink.Close()
		s := newScope(t, `
scopes:
  s:
    circuit_open: wait
    backpressure: {stall_window: 60s, poll_interval: 10ms}
    breaker: {fail_threshold: 1, cooldown: 1s, max_cooldown: 1s}
    sources: [{name: a}]
`, sink)
		start := time.Now()

		// Call 1: fails after 300ms, waits out the cooldown inside
		// OnNoRunnable, probes for 200ms and succeeds.
		c1 := policy.NewCall("c1", "s", 100, time.Time{}, time.Now())
		g := mustGrant(t, s, c1)
		time.Sleep(300 * time.Millisecond)
		mustRecord(t, s, c1, g, policy.Attempt{Outcome: policy.Transient, HTTPStatus: 503, ActualTokens: -1})
		if p, _ := s.Pick(ctx(t), c1); p.NoRunnable == nil {
			t.Fatalf("want a refusal during the cooldown: %+v", p)
		}
		d, err := s.OnNoRunnable(ctx(t), c1)
		if err != nil || d.Failure != nil || d.Sleep != 0 {
			t.Fatalf("OnNoRunnable: %+v %v", d, err)
		}
		// Remaining cooldown 1s plus 0.75 × poll_interval, rounded up to the ms.
		if d.Slept != 1008*time.Millisecond {
			t.Fatalf("slept %v", d.Slept)
		}
		g = mustGrant(t, s, c1)
		time.Sleep(200 * time.Millisecond)
		mustRecord(t, s, c1, g, policy.Attempt{Outcome: policy.Success, HTTPStatus: 200, ActualTokens: 42, Detail: "ok"})

		// Call 2: a 429 of 50ms (refunded: waiting), a backoff of 2s, a success of 100ms.
		c2 := policy.NewCall("c2", "s", 10, time.Time{}, time.Now())
		g = mustGrant(t, s, c2)
		time.Sleep(50 * time.Millisecond)
		r := mustRecord(t, s, c2, g, policy.Attempt{Outcome: policy.RateLimited, HTTPStatus: 429, RetryAfter: 2 * time.Second, ActualTokens: -1})
		if r.Next.Retry == nil || *r.Next.Retry != 2*time.Second {
			t.Fatalf("429: %+v", r.Next)
		}
		time.Sleep(*r.Next.Retry)
		g = mustGrant(t, s, c2)
		time.Sleep(100 * time.Millisecond)
		mustRecord(t, s, c2, g, policy.Attempt{Outcome: policy.Success, ActualTokens: -1})

		// Call 3: holds a permit when the sidecar stops.
		c3 := policy.NewCall("c3", "s", 0, time.Time{}, time.Now())
		mustGrant(t, s, c3)
		time.Sleep(time.Second)
		sink.Abandoned(c3, "interrupted")
		if err := sink.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}

		for _, w := range []struct {
			id                        string
			result                    string
			attempts, charged         int
			started, wall, productive time.Duration
		}{
			{"c1", "done", 2, 1, 0, 300*time.Millisecond + 1008*time.Millisecond + 200*time.Millisecond, 500 * time.Millisecond},
			{"c2", "done", 2, 0, 1508 * time.Millisecond, 2150 * time.Millisecond, 100 * time.Millisecond},
			// An abandoned call's unsettled attempt counts as neither.
			{"c3", "interrupted", 1, 0, 3658 * time.Millisecond, time.Second, 0},
		} {
			got := readCall(t, db, w.id)
			if got.scope != "s" || got.result != w.result || got.reason.Valid || got.attempts != w.attempts || got.charged != w.charged ||
				got.started != start.Add(w.started).UnixNano() || got.ended-got.started != int64(w.wall) || got.productive != int64(w.productive) {
				t.Errorf("call %s: %+v, want %+v", w.id, got, w)
			}
			if w.result == "done" && got.waiting != int64(w.wall-w.productive) {
				t.Errorf("call %s waited %v, want %v", w.id, time.Duration(got.waiting), w.wall-w.productive)
			}
		}
		// c1 waited exactly the sleep OnNoRunnable reported, c2 its 429 and backoff.
		if got := readCall(t, db, "c1").waiting; got != int64(d.Slept) {
			t.Errorf("c1 waited %v, OnNoRunnable slept %v", time.Duration(got), d.Slept)
		}

		// The attempts: each row as reported, and productive time is the
		// sum of the latencies of the attempts that were not rate limited.
		rows, err := db.Query(`SELECT call_id, attempt, source, probe, epoch, outcome, http_status, latency_ns, estimated_tokens,
			actual_tokens, retry_after_hint_ns, breaker_effect, breaker_state, next_action, backoff_ns, failure_reason, detail
			FROM attempts ORDER BY call_id, attempt`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var (
				id, source, outcome, effect, state, next string
				attempt, probe, epoch, estimated, hint   int64
				latency                                  int64
				status, actual, backoff                  sql.NullInt64
				reason, detail                           sql.NullString
			)
			if err := rows.Scan(&id, &attempt, &source, &probe, &epoch, &outcome, &status, &latency, &estimated, &actual, &hint,
				&effect, &state, &next, &backoff, &reason, &detail); err != nil {
				t.Fatal(err)
			}
			got = append(got, strings.Join([]string{id, itoa(attempt), source, itoa(probe), itoa(epoch), outcome, nullInt(status),
				time.Duration(latency).String(), itoa(estimated), nullInt(actual), time.Duration(hint).String(), effect, state, next,
				nullDur(backoff), reason.String, detail.String}, " "))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"c1 1 a 0 0 transient 503 300ms 100 - 0s applied open retry 750ms  ", // backoff 1s jittered by 0.5
			"c1 2 a 1 1 success 200 200ms 100 42 0s applied closed done -  ok",
			"c2 1 a 0 1 rate_limited 429 50ms 10 - 2s no_verdict closed retry 2s  ",
			"c2 2 a 0 1 success - 100ms 10 - 0s applied closed done -  ",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("attempts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		var mismatched int
		if err := db.QueryRow(`SELECT COUNT(*) FROM calls c WHERE c.result = 'done' AND c.productive_ns !=
			(SELECT SUM(latency_ns) FROM attempts a WHERE a.call_id = c.call_id AND a.outcome != 'rate_limited')`).Scan(&mismatched); err != nil || mismatched != 0 {
			t.Fatalf("calls whose productive time is not the sum of their attempts: %d %v", mismatched, err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func nullInt(v sql.NullInt64) string {
	if !v.Valid {
		return "-"
	}
	return itoa(v.Int64)
}

func nullDur(v sql.NullInt64) string {
	if !v.Valid {
		return "-"
	}
	return time.Duration(v.Int64).String()
}

// fakeStore fails or blocks on command.
type fakeStore struct {
	mu      sync.Mutex
	fail    bool
	block   chan struct{} // a write waits for it when set
	written int
	batches int
}

func (f *fakeStore) write(ctx context.Context, batch []record) error {
	f.mu.Lock()
	block, fail := f.block, f.fail
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail {
		return errors.New("disk I/O error: no space left on device")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches++
	for _, r := range batch {
		if r.kind != kindFlush {
			f.written++
		}
	}
	return nil
}

func (f *fakeStore) prune(context.Context, int64) (int64, error) { return 0, nil }
func (f *fakeStore) close() error                                { return nil }

func (f *fakeStore) set(fail bool, block chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.block = fail, block
}

func endedCall(id string) (*policy.Call, policy.Attempt, policy.Recorded) {
	c := policy.NewCall(id, "s", 1, time.Time{}, time.Now())
	return c, policy.Attempt{PermitID: "p-" + id, Source: "a", Outcome: policy.Success, Number: 1}, policy.Recorded{Next: policy.Action{Done: true}}
}

// TestFullQueueDropsAndCounts: a writer that cannot keep up makes records
// wait in the bounded queue; the ones that find it full are dropped and
// counted, the observer never waits, and the log says so once.
func TestFullQueueDropsAndCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStore{}
		release := make(chan struct{})
		st.set(false, release)
		log, logs := testLog()
		s := start(Options{QueueSize: 4, Log: log, Retention: time.Hour}, st)
		defer s.Close()
		first, _, _ := endedCall("first")
		s.Abandoned(first, "expired") // one record: the writer takes it, lingers, writes it and blocks
		time.Sleep(linger)
		synctest.Wait()
		for i := range 5 { // 10 records: 4 fit, 6 are dropped
			s.Settled(endedCall("c" + itoa(int64(i))))
		}
		if got := s.queueDropped.Load(); got != 6 {
			t.Fatalf("dropped %d, want 6", got)
		}
		st.set(false, nil)
		close(release)
		if err := s.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if st.written != 5 || s.calls.Load()+s.attempts.Load() != 5 {
			t.Fatalf("written %d (%d calls, %d attempts), want 5", st.written, s.calls.Load(), s.attempts.Load())
		}
		if count(logs, "telemetry degraded") != 1 || !strings.Contains(logs.String(), "dropped_queue_full=6 dropped_write_failed=0 queue_size=4") {
			t.Fatalf("log:\n%s", logs)
		}
		if !s.degraded.Load() {
			t.Fatal("not degraded")
		}
		// The first tick still sees the interval's losses; the second finds a
		// whole interval without: recovered.
		time.Sleep(2 * warnEvery)
		synctest.Wait()
		if s.degraded.Load() || count(logs, "telemetry recovered") != 1 || !strings.Contains(logs.String(), "dropped_queue_full=6 dropped_write_failed=0 degraded_for=1m59.9s") {
			t.Fatalf("log:\n%s", logs)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFailingWritesLogAtMostOncePerInterval: writes fail for five minutes
// (a record every ten seconds); the log has one line when it starts, one
// reminder per minute, and one when a whole minute passed with writes
// succeeding again.
func TestFailingWritesLogAtMostOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStore{fail: true}
		log, logs := testLog()
		s := start(Options{Log: log, Retention: time.Hour}, st)
		defer s.Close()
		time.Sleep(5 * time.Second)
		for range 30 { // at 5s, 15s, ... 295s
			c, a, r := endedCall("c")
			r.Next = policy.Action{Retry: new(time.Duration)}
			s.Settled(c, a, r)
			time.Sleep(10 * time.Second)
		}
		st.set(false, nil)
		c, a, r := endedCall("ok") // at 305s: written
		s.Settled(c, a, r)
		time.Sleep(time.Minute) // the tick at 360s finds a clean minute
		synctest.Wait()
		if got := s.writeDropped.Load(); got != 30 {
			t.Fatalf("dropped %d, want 30", got)
		}
		if s.failedWrites.Load() != 30 || s.calls.Load() != 1 || s.attempts.Load() != 1 {
			t.Fatalf("failed %d, calls %d, attempts %d", s.failedWrites.Load(), s.calls.Load(), s.attempts.Load())
		}
		// Each record is written a linger after it arrives: degraded at 5.1s;
		// reminders at 65.1s, 125.1s, 185.1s, 245.1s; recovered at 360s.
		if count(logs, "telemetry degraded") != 1 || count(logs, "telemetry still degraded") != 4 || count(logs, "telemetry recovered") != 1 {
			t.Fatalf("log:\n%s", logs)
		}
		for _, want := range []string{
			`err="disk I/O error: no space left on device"`,
			"dropped_queue_full=0 dropped_write_failed=6 queue_size=8192", // the reminders: six losses a minute
			"dropped_queue_full=0 dropped_write_failed=30 degraded_for=5m54.9s",
		} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFullDatabaseDegrades fills a real SQLite database (max_page_count
// caps its size, as a full disk would): writes fail, records are counted as
// dropped, observers return at once, and once there is room again writes
// succeed.
func TestFullDatabaseDegrades(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "full.db")
		st, err := openSQLite(ctx(t), path)
		if err != nil {
			t.Fatal(err)
		}
		var pages int
		if err := st.db.QueryRow("PRAGMA page_count").Scan(&pages); err != nil {
			t.Fatal(err)
		}
		// max_page_count is the connection's: set it on the writer's.
		if _, err := st.conn.ExecContext(ctx(t), "PRAGMA max_page_count = "+itoa(int64(pages))); err != nil {
			t.Fatal(err)
		}
		log, logs := testLog()
		s := start(Options{Path: path, Log: log, Retention: time.Hour}, st)
		defer s.Close()
		for i := range 500 {
			s.Settled(endedCall("c" + itoa(int64(i)) + strings.Repeat("x", 200)))
		}
		if err := s.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if s.writeDropped.Load() == 0 || s.failedWrites.Load() == 0 || !s.degraded.Load() ||
			!strings.Contains(logs.String(), "database or disk is full") || count(logs, "telemetry degraded") != 1 {
			t.Fatalf("dropped %d, failed writes %d, degraded %v\n%s", s.writeDropped.Load(), s.failedWrites.Load(), s.degraded.Load(), logs)
		}
		if _, err := st.conn.ExecContext(ctx(t), "PRAGMA max_page_count = 1000000"); err != nil {
			t.Fatal(err)
		}
		before := s.calls.Load()
		s.Settled(endedCall("after"))
		if err := s.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if s.calls.Load() != before+1 {
			t.Fatalf("the write after making room failed: %s", logs)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRetentionPrunes deletes rows older than telemetry.retention, checked
// every retention/10.
func TestRetentionPrunes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink, db := openTest(t, Options{Retention: time.Hour})
		defer db.Close()
		defer sink.Close()
		sink.Settled(endedCall("old"))
		time.Sleep(50 * time.Minute)
		sink.Settled(endedCall("new"))
		time.Sleep(17 * time.Minute) // prunes at 60 (nothing older than an hour yet) and 66 minutes
		synctest.Wait()
		count := func(q string) (n int) {
			if err := db.QueryRow(q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if c, a := count("SELECT COUNT(*) FROM calls WHERE call_id = 'old'"), count("SELECT COUNT(*) FROM attempts WHERE call_id = 'old'"); c != 0 || a != 0 {
			t.Fatalf("old rows kept: %d calls, %d attempts", c, a)
		}
		if c, a := count("SELECT COUNT(*) FROM calls WHERE call_id = 'new'"), count("SELECT COUNT(*) FROM attempts WHERE call_id = 'new'"); c != 1 || a != 1 {
			t.Fatalf("new rows pruned: %d calls, %d attempts", c, a)
		}
		if sink.pruned.Load() != 2 {
			t.Fatalf("pruned %d rows, want 2", sink.pruned.Load())
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRecordsShareTransactions: records that arrive within a linger of the
// first are written in one transaction; a flush does not wait.
func TestRecordsShareTransactions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStore{}
		s := start(Options{Retention: time.Hour}, st)
		defer s.Close()
		for range 50 { // 100 records over 49ms
			s.Settled(endedCall("c"))
			time.Sleep(time.Millisecond)
		}
		time.Sleep(linger)
		synctest.Wait()
		if st.batches != 1 || st.written != 100 {
			t.Fatalf("%d records in %d transactions, want 100 in 1", st.written, st.batches)
		}
		s.Settled(endedCall("d"))
		start := time.Now()
		if err := s.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) != 0 || st.batches != 2 || st.written != 102 {
			t.Fatalf("flush took %v; %d records in %d transactions", time.Since(start), st.written, st.batches)
		}
	})
}

// TestCancelledCallOneEncoding cancels one call while it holds a permit and
// one between attempts: both rows read result failure, failure_reason
// cancelled, the only encoding of a cancelled call.
func TestCancelledCallOneEncoding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink, db := openTest(t, Options{Retention: 24 * time.Hour})
		defer db.Close()
		defer sink.Close()
		s := newScope(t, `
scopes:
  s:
    sources: [{name: a}]
`, sink)
		held := policy.NewCall("held", "s", 0, time.Time{}, time.Now())
		mustGrant(t, s, held)
		if ended, settled, err := s.Cancel(ctx(t), held); err != nil || !ended || !settled {
			t.Fatalf("Cancel with a permit: ended %v settled %v err %v", ended, settled, err)
		}
		between := policy.NewCall("between", "s", 0, time.Time{}, time.Now())
		g := mustGrant(t, s, between)
		if r := mustRecord(t, s, between, g, policy.Attempt{Outcome: policy.Transient, HTTPStatus: 503, ActualTokens: -1}); r.Next.Retry == nil {
			t.Fatalf("want a retry after a 503: %+v", r.Next)
		}
		if ended, settled, err := s.Cancel(ctx(t), between); err != nil || !ended || settled {
			t.Fatalf("Cancel between attempts: ended %v settled %v err %v", ended, settled, err)
		}
		// The server tells the observers of a call cancelled between attempts
		// with server.AbandonCancelled.
		sink.Abandoned(between, "cancelled")
		if err := sink.Flush(ctx(t)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"held", "between"} {
			if got := readCall(t, db, id); got.result != "failure" || got.reason.String != "cancelled" {
				t.Errorf("call %s: result %q failure_reason %v, want failure/cancelled", id, got.result, got.reason)
			}
		}
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM calls WHERE result = 'cancelled'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d calls with result cancelled (err %v), want none", n, err)
		}
	})
}
