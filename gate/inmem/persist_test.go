package inmem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
)

// src is a source with a TPM limit and a breaker that opens on one failure.
func src(name string) *gate.Source {
	return gatetest.Src(name, func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 4, TPM: 1000, Lease: time.Minute}
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown, s.Breaker.MaxCooldown = 10*time.Second, 60*time.Second
		s.Breaker.ProbeTTL = 30 * time.Second
	})
}

// open starts a backend on the state file at path; it is closed when the test ends.
func open(t *testing.T, path string) *Backend {
	t.Helper()
	b, err := Open(Options{StatePath: path})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func admit(t *testing.T, b *Backend, id string, tokens int64, s *gate.Source) gate.Admission {
	t.Helper()
	a, err := b.Admit(t.Context(), gate.AdmitRequest{Scope: "chat", PermitID: id, Tokens: tokens,
		Candidates: []gate.Candidate{{Source: s, Ceiling: s.Limits.MaxConcurrency}}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func settle(t *testing.T, b *Backend, s *gate.Source, p gate.Permit, v gate.Verdict) {
	t.Helper()
	if _, err := b.Settle(t.Context(), gate.SettleRequest{Scope: "chat", Source: s, PermitID: p.ID, Epoch: p.Epoch,
		Probe: p.Probe, Verdict: v, ActualTokens: -1}); err != nil {
		t.Fatal(err)
	}
}

func peek(t *testing.T, b *Backend, s *gate.Source) gate.SourceView {
	t.Helper()
	// The line is read too, as DescribeScope does: a scope loaded from the
	// file has lines to read (it once had no map for them).
	snap, err := b.Peek(t.Context(), gate.PeekRequest{Scope: "chat", Sources: []*gate.Source{s}, Line: &gate.LineRead{Describe: true}})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Sources[0]
}

// crashCopy copies the state file as a crash would leave it, before the
// backend's Close writes a last time.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "after-crash.json")
	if err := os.WriteFile(cp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return cp
}

func TestStateRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		forced, dead, used := src("forced"), src("dead"), src("used")
		b := open(t, path)
		if _, err := b.Override(t.Context(), gate.OverrideRequest{Scope: "chat", Source: forced,
			Action: gate.ActionForceOpen, Actor: "alice", Why: "provider incident #12"}); err != nil {
			t.Fatal(err)
		}
		p := admit(t, b, "d1", 0, dead).Permit
		settle(t, b, dead, p, gate.VerdictForceOpen)
		// The override and the OPEN are on disk as soon as their answers are:
		// no flush interval has passed in the bubble.
		overridden := crashCopy(t, path)

		if a := admit(t, b, "u1", 600, used); !a.Granted {
			t.Fatalf("600 tokens refused: %+v", a.Rejections)
		}
		time.Sleep(FlushInterval) // quota use is written within one interval
		synctest.Wait()
		crashed := crashCopy(t, path)
		time.Sleep(3 * time.Second) // the restart takes 3 s

		for name, file := range map[string]string{"written at once": overridden, "written by the flusher": crashed} {
			func() {
				r := open(t, file)
				if v := peek(t, r, forced).Breaker; v.Override != gate.ForcedOpen || v.Actor != "alice" || v.Why != "provider incident #12" {
					t.Errorf("%s: forced source after restart = %+v, want forced_open by alice", name, v)
				}
				v := peek(t, r, dead).Breaker
				if v.State != gate.Open || v.Reopens != 1 || v.RetryAfter != 6*time.Second || v.Cause != gate.OpenCauseSourceDead {
					t.Errorf("%s: dead source after restart = %+v, want OPEN (source_dead) for the 6 s left of its 10 s cooldown", name, v)
				}
				if rej := admit(t, r, "d2", 0, dead).Rejections; len(rej) != 1 || rej[0].Reason != gate.ReasonCircuitOpen {
					t.Errorf("%s: dead source admitted after restart: %+v", name, rej)
				}
				if name == "written at once" {
					return
				}
				if q := peek(t, r, used).Quota; q.Tokens != 600 || q.Requests != 1 || q.InFlight != 0 {
					t.Errorf("used source quota after restart = %+v, want 600 tokens, 1 request, no slot held", q)
				}
				if a := admit(t, r, "u2", 600, used); a.Granted {
					t.Error("a second 600-token burst admitted after restart on tpm 1000")
				}
			}()
		}
	})
}

func TestStatePassedTimesApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		dead, probing, used := src("dead"), src("probing"), src("used")
		b := open(t, path)
		settle(t, b, dead, admit(t, b, "d1", 0, dead).Permit, gate.VerdictForceOpen)
		settle(t, b, probing, admit(t, b, "p1", 0, probing).Permit, gate.VerdictFailure)
		admit(t, b, "u1", 600, used)
		time.Sleep(10 * time.Second)
		if p := admit(t, b, "p2", 0, probing).Permit; !p.Probe {
			t.Fatalf("no probe after the cooldown: %+v", p)
		}
		synctest.Wait()
		crashed := crashCopy(t, path)

		// Down for a minute: the cooldown ended, the probe's holder is gone
		// and the minute's use is over.
		time.Sleep(time.Minute)
		r := open(t, crashed)
		for _, s := range []*gate.Source{dead, probing} {
			v := peek(t, r, s).Breaker
			if v.State != gate.HalfOpen || v.ProbeOut || v.RetryAfter != 0 {
				t.Errorf("%s after restart = %+v, want HALF_OPEN with no probe out", s.Name, v)
			}
			first := admit(t, r, s.Name+"-first", 0, s)
			if !first.Granted || !first.Permit.Probe {
				t.Errorf("%s: first entrant after restart = %+v, want the probe", s.Name, first)
			}
			if rej := admit(t, r, s.Name+"-second", 0, s).Rejections; len(rej) != 1 || rej[0].Reason != gate.ReasonProbeInFlight {
				t.Errorf("%s: second entrant = %+v, want probe_in_flight", s.Name, rej)
			}
		}
		if q := peek(t, r, used).Quota; q.Tokens != 0 || q.Requests != 0 {
			t.Errorf("quota a minute after the crash = %+v, want empty", q)
		}
	})
}

func TestStateFileErrors(t *testing.T) {
	valid := `{"version":1,"scopes":{"chat":{"sources":{"a":{"breaker":{"state":"closed","epoch":0}}}}}}`
	for _, tc := range []struct{ name, content string }{
		{"empty", ""},
		{"not json", "state"},
		{"truncated", valid[:len(valid)/2]},
		{"newer version", strings.Replace(valid, `"version":1`, `"version":2`, 1)},
		{"no version", strings.Replace(valid, `"version":1,`, ``, 1)},
		{"unknown field", strings.Replace(valid, `"epoch":0`, `"epoch":0,"color":"red"`, 1)},
		{"unknown state", strings.Replace(valid, `"closed"`, `"ajar"`, 1)},
		{"unknown open cause", strings.Replace(valid, `"epoch":0`, `"epoch":0,"open_cause":"boredom"`, 1)},
		{"unknown override", strings.Replace(valid, `"epoch":0`, `"epoch":0,"override":"maybe"`, 1)},
		{"negative tokens", strings.Replace(valid, `"epoch":0}`, `"epoch":0},"minute":[[1,-5]]`, 1)},
		{"trailing data", valid + valid},
		{"tokens that would wrap", strings.Replace(valid, `"epoch":0}`, `"epoch":0},"minute":[[1,1099511627776],[2,1099511627776]]`, 1)},
		{"minute out of order", strings.Replace(valid, `"epoch":0}`, `"epoch":0},"minute":[[5,1],[2,1]]`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Options{StatePath: path})
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want an error naming %s", err, path)
			}
			if data, _ := os.ReadFile(path); string(data) != tc.content {
				t.Error("the corrupt file was overwritten; it must be left for the operator")
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(path, []byte(valid), 0o600); err != nil {
			t.Fatal(err)
		}
		open(t, path)
	})
	t.Run("unreadable", func(t *testing.T) {
		path := t.TempDir() // a directory is not a state file
		if _, err := Open(Options{StatePath: path}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open = %v, want an error naming %s", err, path)
		}
	})
	t.Run("directory missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "no", "state.json")
		if _, err := Open(Options{StatePath: path}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open = %v, want an error naming %s", err, path)
		}
	})
	t.Run("missing file is a fresh start", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		b := open(t, path)
		if v := peek(t, b, src("a")).Breaker; v.State != gate.Closed || v.Epoch != 0 {
			t.Errorf("fresh breaker = %+v", v)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("Open did not write the file at once: %v", err)
		}
	})
}

func TestWriteAtomic(t *testing.T) {
	t.Run("readers see whole files only", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		versions := [][]byte{bytes.Repeat([]byte("a"), 1<<16), bytes.Repeat([]byte("b"), 1<<17)}
		if err := writeAtomic(path, versions[0]); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() {
			defer cancel()
			for i := range 50 {
				if err := writeAtomic(path, versions[i%2]); err != nil {
					t.Error(err)
					return
				}
			}
		})
		for ctx.Err() == nil {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read during writes: %v", err)
			}
			if !bytes.Equal(data, versions[0]) && !bytes.Equal(data, versions[1]) {
				t.Fatalf("a reader saw a partial file of %d bytes", len(data))
			}
		}
		wg.Wait()
		assertNoTemps(t, path)
	})
	t.Run("failed write leaves the old file and no temporary", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "state.json")
		// A non-empty directory in the file's place: the rename fails.
		if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := writeAtomic(path, []byte("new")); err == nil {
			t.Fatal("writeAtomic over a directory succeeded")
		}
		assertNoTemps(t, path)
	})
	t.Run("temporaries of a crashed write are removed at start", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		left := filepath.Join(filepath.Dir(path), tempPrefix(path)+"123")
		if err := os.WriteFile(left, []byte(`{"version":1,"sco`), 0o600); err != nil {
			t.Fatal(err)
		}
		open(t, path)
		assertNoTemps(t, path)
	})
}

func assertNoTemps(t *testing.T, path string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), tempPrefix(path)+"*"))
	if len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

// TestStateFileFormat pins the documented field names (docs/operations.md).
func TestStateFileFormat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		s := src("a")
		b := open(t, path)
		admit(t, b, "u1", 5, s)
		if _, err := b.Override(t.Context(), gate.OverrideRequest{Scope: "chat", Source: s, Action: gate.ActionForceOpen, Actor: "ops", Why: "test"}); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UnixMilli()
		want := map[string]any{
			"version": 1.0, "written_at_ms": float64(now),
			"scopes": map[string]any{"chat": map[string]any{"sources": map[string]any{"a": map[string]any{
				"breaker": map[string]any{"state": "closed", "epoch": 0.0, "override": "forced_open", "actor": "ops", "reason": "test", "override_at_ms": float64(now)},
				"minute":  []any{[]any{float64(now), 5.0}},
			}}}},
		}
		got, _ := json.Marshal(doc)
		exp, _ := json.Marshal(want)
		if !bytes.Equal(got, exp) {
			t.Errorf("state file\n got %s\nwant %s", got, exp)
		}
	})
}

// TestContractWithStateFile: keeping a state file changes no decision.
func TestContractWithStateFile(t *testing.T) {
	dir := t.TempDir()
	var n atomic.Int64
	gatetest.Run(t, func(t *testing.T, clock *gatetest.Clock) gate.Backend {
		b, err := Open(Options{Now: clock.Now, StatePath: filepath.Join(dir, fmt.Sprintf("state-%d.json", n.Add(1)))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	})
}

// records keeps every log record's message and attributes.
type records struct {
	mu   sync.Mutex
	logs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Level.String() + " " + rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, line)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// A state file's times are brought within the configured bounds on load,
// each with a warning naming the field: an OPEN ends at most max_cooldown
// after the load (not in 292 years), and no time is later than the load, so
// that neither keeps a breaker OPEN or a minute full for years. A state
// within its bounds is loaded as it is.
func TestStateFileClampedOnLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now().UnixMilli()
		const year = int64(365 * 24 * time.Hour / time.Millisecond)
		state := fmt.Sprintf(`{"version":1,"scopes":{"chat":{"progress_ms":%d,"sources":{
			"forever":{"breaker":{"state":"open","epoch":1,"reopens":1,"opened_at_ms":%d,"open_until_ms":%d}},
			"year9999":{"breaker":{"state":"open","epoch":1,"reopens":1,"opened_at_ms":%d,"open_until_ms":253402300799000,"override":"forced_open","override_at_ms":%d}},
			"soon":{"breaker":{"state":"open","epoch":1,"reopens":1,"opened_at_ms":%d,"open_until_ms":%d},"minute":[[%d,100],[%d,100]]}}}}}`,
			now+year, now+year, int64(math.MaxInt64), now-1000, now+year, now-1000, now+5000, now-1000, now+year)
		path := filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(path, []byte(state), 0o600); err != nil {
			t.Fatal(err)
		}
		maxCooldown := map[string]time.Duration{"forever": 300 * time.Second, "year9999": 60 * time.Second, "soon": 300 * time.Second}
		logs := &records{}
		b, err := Open(Options{StatePath: path, Log: slog.New(logs),
			MaxOpen: func(scope, source string) time.Duration { return maxCooldown[source] }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })

		for _, tc := range []struct {
			name  string
			left  time.Duration
			until int64
		}{
			{"forever", 300 * time.Second, now + 300_000},
			{"soon", 5 * time.Second, now + 5000}, // within its bounds: as saved
		} {
			if v := peek(t, b, src(tc.name)).Breaker; v.State != gate.Open || v.RetryAfter != tc.left {
				t.Errorf("%s after the load: %+v; want OPEN for %v", tc.name, v, tc.left)
			}
		}
		if v := peek(t, b, src("year9999")).Breaker; v.Override != gate.ForcedOpen {
			t.Errorf("year9999 after the load: %+v; want its override kept", v)
		}
		if q := peek(t, b, src("soon")).Quota; q.Tokens != 200 {
			t.Errorf("soon's minute after the load: %+v; want both admissions, the later one moved to the load", q)
		}
		time.Sleep(time.Minute)
		if q := peek(t, b, src("soon")).Quota; q.Tokens != 0 {
			t.Errorf("soon's minute a minute after the load: %+v; want empty, not full for a year", q)
		}
		want := []string{
			"scopes.chat.progress_ms",
			"scopes.chat.sources.forever.breaker.opened_at_ms",
			"scopes.chat.sources.forever.breaker.open_until_ms value=9223372036854775807",
			"scopes.chat.sources.year9999.breaker.open_until_ms value=253402300799000",
			"scopes.chat.sources.year9999.breaker.override_at_ms",
			"scopes.chat.sources.soon.minute",
		}
		logs.mu.Lock()
		defer logs.mu.Unlock()
		if len(logs.logs) != len(want) {
			t.Errorf("%d log lines, want %d warnings:\n%s", len(logs.logs), len(want), strings.Join(logs.logs, "\n"))
		}
		for _, field := range want {
			found := false
			for _, l := range logs.logs {
				found = found || strings.HasPrefix(l, "WARN memory state file: a value out of its bounds was clamped") && strings.Contains(l, "field="+field)
			}
			if !found {
				t.Errorf("no warning naming %s in:\n%s", field, strings.Join(logs.logs, "\n"))
			}
		}
	})
}
