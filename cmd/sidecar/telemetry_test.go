package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	_ "modernc.org/sqlite"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// opsSeen is what the test saw of one call through the RPCs.
type opsSeen struct {
	id      string
	grants  []*admissionv1.Grant
	retries []time.Duration // backoffs returned by RecordOutcome
	slept   time.Duration   // the sidecar's own waits, from OnNoRunnable
	wall    time.Duration   // from sending the first Pick to the last answer
}

// TestTelemetryOfTheRealBinary runs calls through the built binary with
// telemetry on and checks that the recorded rows answer "how long did this
// call wait, and how many attempts did it make" exactly: each row against
// the call's own accounting (waiting + productive = wall time, productive =
// the sum of its non-429 attempts' latencies), against what the RPCs
// returned (grants, backoffs, the sidecar's sleeps) and against what the test
// did.
func TestTelemetryOfTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	db := filepath.Join(t.TempDir(), "telemetry.db")
	const cooldown = 400 * time.Millisecond
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`
log: {format: json, level: debug} # the per-call "call waiting" line
telemetry: {path: %s}
scopes:
  single:
    circuit_open: wait
    backoff: {base: 10ms, max: 10ms}
    backpressure: {stall_window: 60s, poll_interval: 20ms}
    breaker: {fail_threshold: 1, cooldown: %v, max_cooldown: %v, probe_ttl: 30s}
    sources: [{name: only, timeout: 10s}]
  ff:
    circuit_open: fail_fast
    sources: [{name: only}]
`, db, cooldown, cooldown)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := admissionv1.NewAdmissionServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fortyTwo := int64(42)

	// drive runs the thin SDK loop for one call; reply answers each attempt.
	// It sleeps no backoff: the sidecar's accounting counts whatever the
	// client does between the RPCs as waiting.
	drive := func(scope string, tokens int64, reply func(*admissionv1.Grant) *admissionv1.RecordOutcomeRequest) (*opsSeen, *admissionv1.Failure) {
		t.Helper()
		s := &opsSeen{}
		start := time.Now()
		defer func() { s.wall = time.Since(start) }()
		pick, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: scope, EstimatedTokens: tokens})
		for range 100 {
			if err != nil {
				t.Fatalf("Pick: %v", err)
			}
			s.id = pick.GetCallId()
			switch {
			case pick.GetGrant() != nil:
				g := pick.GetGrant()
				s.grants = append(s.grants, g)
				req := reply(g)
				req.Scope, req.CallId, req.PermitId = scope, s.id, g.GetPermitId()
				r, err := client.RecordOutcome(ctx, req)
				if err != nil {
					t.Fatalf("RecordOutcome: %v", err)
				}
				switch {
				case r.GetDone() != nil:
					return s, nil
				case r.GetFailure() != nil:
					return s, r.GetFailure()
				}
				s.retries = append(s.retries, r.GetRetry().GetBackoff().AsDuration())
			case pick.GetNoRunnable() != nil:
				d, err := client.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: scope, CallId: s.id})
				if err != nil {
					t.Fatalf("OnNoRunnable: %v", err)
				}
				if d.GetFailure() != nil {
					return s, d.GetFailure()
				}
				s.slept += d.GetWait().GetSlept().AsDuration()
				if left := d.GetWait().GetSleep().AsDuration(); left > 0 {
					t.Fatalf("the sidecar left %v of its wait to the client", left)
				}
			default:
				return s, pick.GetFailure()
			}
			pick, err = client.Pick(ctx, &admissionv1.PickRequest{Scope: scope, CallId: s.id})
		}
		t.Fatal("the call never ended")
		return nil, nil
	}

	// Call 1 fails, waits out the cooldown inside the sidecar, probes and succeeds.
	first := true
	c1, f := drive("single", 100, func(*admissionv1.Grant) *admissionv1.RecordOutcomeRequest {
		if first {
			first = false
			return &admissionv1.RecordOutcomeRequest{Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, HttpStatus: 503, Detail: "upstream 503"}
		}
		return &admissionv1.RecordOutcomeRequest{Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, HttpStatus: 200, ActualTokens: &fortyTwo}
	})
	if f != nil || len(c1.grants) != 2 || !c1.grants[1].GetProbe() || c1.slept == 0 {
		t.Fatalf("call 1: failure %v, grants %v, slept %v", f, c1.grants, c1.slept)
	}
	// Call 2: a 429 with a Retry-After, then a success.
	limited := true
	c2, f := drive("single", 10, func(*admissionv1.Grant) *admissionv1.RecordOutcomeRequest {
		if limited {
			limited = false
			return &admissionv1.RecordOutcomeRequest{Outcome: admissionv1.Outcome_OUTCOME_RATE_LIMITED, HttpStatus: 429, RetryAfterHint: durationpb.New(50 * time.Millisecond)}
		}
		return &admissionv1.RecordOutcomeRequest{Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, HttpStatus: 200}
	})
	if f != nil || len(c2.grants) != 2 || c2.retries[0] < 50*time.Millisecond {
		t.Fatalf("call 2: failure %v, grants %v, retries %v", f, c2.grants, c2.retries)
	}
	// Call 3 fails fast on a forced-open breaker without an attempt.
	if _, err := client.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "ff", Source: "only",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "test", Reason: "call 3"}); err != nil {
		t.Fatal(err)
	}
	c3, f := drive("ff", 0, nil)
	if f.GetReason() != admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN || len(c3.grants) != 0 {
		t.Fatalf("call 3: failure %v", f)
	}
	// Call 4 holds a permit when the sidecar stops.
	c4, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "single"})
	if err != nil || c4.GetGrant() == nil {
		t.Fatalf("call 4: %v %v", c4, err)
	}
	if err := p.Stop(t); err != nil { // drains telemetry before it exits
		t.Fatalf("sidecar exited with %v\n%s", err, p.Logs())
	}

	store, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	// Per call: the query of docs/telemetry.md.
	type callRow struct {
		scope, result                             string
		reason                                    sql.NullString
		attempts, charged                         int
		started, ended, productive, waiting, sumL int64
		rows                                      int
	}
	readCall := func(id string) callRow {
		t.Helper()
		var r callRow
		if err := store.QueryRow(`
SELECT c.scope, c.result, c.failure_reason, c.attempts, c.charged_attempts,
       c.started_ns, c.ended_ns, c.productive_ns, c.waiting_ns,
       (SELECT COALESCE(SUM(a.latency_ns), 0) FROM attempts a WHERE a.call_id = c.call_id AND a.outcome != 'rate_limited'),
       (SELECT COUNT(*) FROM attempts a WHERE a.call_id = c.call_id)
FROM calls c WHERE c.call_id = ?`, id).Scan(&r.scope, &r.result, &r.reason, &r.attempts, &r.charged,
			&r.started, &r.ended, &r.productive, &r.waiting, &r.sumL, &r.rows); err != nil {
			t.Fatalf("call %s: %v", id, err)
		}
		return r
	}
	for _, c := range []struct {
		name              string
		s                 *opsSeen
		scope, result     string
		reason            string
		attempts, charged int
	}{
		{"call 1", c1, "single", "done", "", 2, 1},
		{"call 2", c2, "single", "done", "", 2, 0}, // the 429 is not charged
		{"call 3", c3, "ff", "failure", "circuit_open", 0, 0},
	} {
		r := readCall(c.s.id)
		if r.scope != c.scope || r.result != c.result || r.reason.String != c.reason || r.attempts != c.attempts || r.charged != c.charged {
			t.Errorf("%s: %+v, want %s %s %q, %d attempts (%d charged)", c.name, r, c.scope, c.result, c.reason, c.attempts, c.charged)
		}
		// How many attempts: the rows, the grants the test got, and the
		// number the last grant carried all agree.
		if r.rows != len(c.s.grants) || r.attempts != len(c.s.grants) || len(c.s.grants) > 0 && int(c.s.grants[len(c.s.grants)-1].GetAttempt()) != r.attempts {
			t.Errorf("%s: %d attempts, %d rows, %d grants", c.name, r.attempts, r.rows, len(c.s.grants))
		}
		// How long it waited: exactly its wall time minus its productive
		// time, which is exactly the sum of its attempts (429s excluded)...
		if r.waiting+r.productive != r.ended-r.started || r.productive != r.sumL {
			t.Errorf("%s: waited %d + productive %d != wall %d, or productive != %d (sum of attempts)", c.name, r.waiting, r.productive, r.ended-r.started, r.sumL)
		}
		// ...includes the sidecar's own waits, and fits in what the test saw.
		if time.Duration(r.waiting) < c.s.slept || time.Duration(r.ended-r.started) > c.s.wall {
			t.Errorf("%s: waited %v (sidecar slept %v), wall %v (test saw %v)", c.name, time.Duration(r.waiting), c.s.slept,
				time.Duration(r.ended-r.started), c.s.wall)
		}
	}
	// Call 1 waited through the whole cooldown (the breaker counts whole
	// milliseconds), and call 2's 429 counts as waiting, not productive.
	if w := readCall(c1.id).waiting; time.Duration(w) < cooldown-time.Millisecond {
		t.Errorf("call 1 waited %v, less than the %v cooldown", time.Duration(w), cooldown)
	}
	var lat429, latOK int64
	if err := store.QueryRow(`SELECT
		(SELECT latency_ns FROM attempts WHERE call_id = ?1 AND attempt = 1),
		(SELECT latency_ns FROM attempts WHERE call_id = ?1 AND attempt = 2)`, c2.id).Scan(&lat429, &latOK); err != nil {
		t.Fatal(err)
	}
	if r := readCall(c2.id); r.productive != latOK || r.waiting != r.ended-r.started-latOK || r.waiting < lat429 {
		t.Errorf("call 2: productive %d, waiting %d, wall %d; the 429 took %d, the success %d", r.productive, r.waiting, r.ended-r.started, lat429, latOK)
	}
	if r := readCall(c4.GetCallId()); r.result != "interrupted" || r.attempts != 1 || r.rows != 0 {
		t.Errorf("call 4: %+v", r)
	}

	// Per attempt: each row against the grant and answer it belongs to.
	type attemptRow struct {
		permit, outcome, effect, state, next string
		probe                                bool
		epoch                                uint64
		status, actual, backoff              sql.NullInt64
		estimated, hint                      int64
		detail                               sql.NullString
	}
	readAttempt := func(id string, n int) attemptRow {
		t.Helper()
		var a attemptRow
		if err := store.QueryRow(`SELECT permit_id, outcome, breaker_effect, breaker_state, next_action, probe, epoch,
			http_status, actual_tokens, backoff_ns, estimated_tokens, retry_after_hint_ns, detail
			FROM attempts WHERE call_id = ? AND attempt = ?`, id, n).Scan(&a.permit, &a.outcome, &a.effect, &a.state, &a.next,
			&a.probe, &a.epoch, &a.status, &a.actual, &a.backoff, &a.estimated, &a.hint, &a.detail); err != nil {
			t.Fatalf("attempt %s #%d: %v", id, n, err)
		}
		return a
	}
	for _, w := range []struct {
		name string
		got  attemptRow
		g    *admissionv1.Grant
		want attemptRow
	}{
		{"call 1 #1", readAttempt(c1.id, 1), c1.grants[0], attemptRow{outcome: "transient", effect: "applied", state: "open", next: "retry",
			status: opsValid(503), backoff: opsValid(int64(c1.retries[0])), estimated: 100, detail: sql.NullString{String: "upstream 503", Valid: true}}},
		{"call 1 #2", readAttempt(c1.id, 2), c1.grants[1], attemptRow{outcome: "success", effect: "applied", state: "closed", next: "done",
			probe: true, epoch: 1, status: opsValid(200), actual: opsValid(42), estimated: 100}},
		{"call 2 #1", readAttempt(c2.id, 1), c2.grants[0], attemptRow{outcome: "rate_limited", effect: "no_verdict", state: "closed", next: "retry",
			epoch: 1, status: opsValid(429), backoff: opsValid(int64(c2.retries[0])), estimated: 10, hint: int64(50 * time.Millisecond)}},
		{"call 2 #2", readAttempt(c2.id, 2), c2.grants[1], attemptRow{outcome: "success", effect: "applied", state: "closed", next: "done",
			epoch: 1, status: opsValid(200), estimated: 10}},
	} {
		w.want.permit = w.g.GetPermitId()
		if w.got != w.want || w.g.GetProbe() != w.got.probe || w.g.GetEpoch() != w.got.epoch {
			t.Errorf("%s: %+v\nwant %+v (grant %v)", w.name, w.got, w.want, w.g)
		}
	}

	// Aggregated: the per-scope query of docs/telemetry.md adds up the rows.
	var calls, attempts int
	var waited, maxWaited int64
	if err := store.QueryRow(`
SELECT COUNT(*), SUM(attempts), SUM(waiting_ns), MAX(waiting_ns)
FROM calls WHERE scope = 'single' AND result IN ('done', 'failure')`).Scan(&calls, &attempts, &waited, &maxWaited); err != nil {
		t.Fatal(err)
	}
	w1, w2 := readCall(c1.id).waiting, readCall(c2.id).waiting
	if calls != 2 || attempts != 4 || waited != w1+w2 || maxWaited != max(w1, w2) {
		t.Errorf("aggregate: %d calls, %d attempts, waited %d (max %d)", calls, attempts, waited, maxWaited)
	}

	// The log (JSON, as configured) has the line of call 1's wait, with the
	// scope, the source's reason as the wait's read found it and the sleep.
	var found bool
	for _, line := range strings.Split(p.Logs(), "\n") {
		var l struct {
			Msg     string                             `json:"msg"`
			Scope   string                             `json:"scope"`
			Call    string                             `json:"call"`
			Sleep   time.Duration                      `json:"sleep"`
			Sources map[string]struct{ Reason string } `json:"sources"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "call waiting" && l.Call == c1.id {
			found = l.Scope == "single" && l.Sources["only"].Reason == "circuit_open" && l.Sleep > 0 && l.Sleep <= cooldown+20*time.Millisecond
			if !found {
				t.Errorf("wait line %s", line)
			}
		}
	}
	if !found {
		t.Errorf("no wait line for call 1:\n%s", p.Logs())
	}
}

func opsValid(v int64) sql.NullInt64 { return sql.NullInt64{Int64: v, Valid: true} }
