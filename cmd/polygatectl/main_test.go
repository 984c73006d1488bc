package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/admissiontest"
	"github.com/polygate/polygate/internal/sidecartest"
)

func TestMain(m *testing.M) { sidecartest.Main(m) }

const (
	token = "s3cret-token"
	// A long cooldown keeps an opened breaker OPEN for the whole test.
	testConfig = `
scopes:
  chat:
    circuit_open: fail_fast
    breaker: {fail_threshold: 5, cooldown: 10m, max_cooldown: 10m}
    sources:
      - {name: primary, max_concurrency: 4, rpm: 600}
      - {name: backup, priority: 1, max_concurrency: 2}
    tenants: {team: {weight: 3, max_priority: 2, rpm: 60, max_live_calls: 5, token_budget: {tokens: 1000, per: 1h}}}
`
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startSidecar runs the real binary with testConfig and a token on listen
// (host:port or unix:///path).
func startSidecar(t *testing.T, listen string) *sidecartest.Sidecar {
	t.Helper()
	return startSidecarWith(t, listen, "")
}

// startSidecarWith is startSidecar with more top-level configuration (TLS).
func startSidecarWith(t *testing.T, listen, extra string) *sidecartest.Sidecar {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(extra+testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return sidecartest.Start(t, []string{"--listen", listen, "--config", file}, "POLYGATE_AUTH__TOKEN="+token)
}

// client is the application's side: a gRPC client with the token.
func client(t *testing.T, ctx context.Context, s *sidecartest.Sidecar) (context.Context, admissionv1.AdmissionServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), admissionv1.NewAdmissionServiceClient(conn)
}

// env is a fake environment for run.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

// ctl runs polygatectl against s with the token in $POLYGATE_TOKEN.
func ctl(t *testing.T, ctx context.Context, s *sidecartest.Sidecar, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut admissiontest.LockedBuffer
	err = run(ctx, append([]string{"--addr", s.Addr}, args...), env("POLYGATE_TOKEN="+token, "USER=tester"), &out, &errOut)
	return out.String(), errOut.String(), err
}

// openPrimary opens the primary's breaker the way an upstream does: an
// attempt on it reports SOURCE_DEAD.
func openPrimary(t *testing.T, ctx context.Context, s *sidecartest.Sidecar) {
	t.Helper()
	ctx, c := client(t, ctx, s)
	p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || p.GetGrant().GetSource() != "primary" {
		t.Fatalf("Pick: %v %v", p, err)
	}
	r, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
		PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SOURCE_DEAD, HttpStatus: 401})
	if err != nil || r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("RecordOutcome SOURCE_DEAD: %v %v", r, err)
	}
}

// section returns the rows of the table under title in describe's output,
// each row a map from column header to cell, by its first cell. Columns are found from the
// header line's layout (headers may contain single spaces; columns are
// separated by at least two).
func section(t *testing.T, out, title string) map[string]map[string]string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "\n"+title+"\n")
	if !ok {
		t.Fatalf("no %s section in:\n%s", title, out)
	}
	lines := strings.Split(rest, "\n")
	header := lines[0]
	var starts []int
	for i := range header {
		if header[i] != ' ' && (i == 0 || strings.HasPrefix(header[max(0, i-2):i], "  ")) {
			starts = append(starts, i)
		}
	}
	first := strings.Fields(header)[0]
	rows := map[string]map[string]string{}
	for _, line := range lines[1:] {
		if line == "" || strings.HasPrefix(line, "override of ") {
			break
		}
		r := map[string]string{}
		for j, start := range starts {
			end := len(line)
			if j+1 < len(starts) {
				end = min(starts[j+1], len(line))
			}
			hEnd := len(header)
			if j+1 < len(starts) {
				hEnd = starts[j+1]
			}
			r[strings.TrimSpace(header[start:hEnd])] = strings.TrimSpace(line[min(start, len(line)):end])
		}
		rows[r[first]] = r
	}
	return rows
}

func TestDescribeShowsAnOpenBreakerAndZeros(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	openPrimary(t, ctx, s)

	out, _, err := ctl(t, ctx, s, "describe", "chat")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scope         chat\n", "backend       memory\n", "last success  never\n",
		"on refusal    circuit_open fail_fast, quota_full wait\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
	breakers := section(t, out, "BREAKERS")
	primary, backup := breakers["primary"], breakers["backup"]
	if primary == nil || backup == nil {
		t.Fatalf("BREAKERS rows %v\n%s", breakers, out)
	}
	if primary["STATE"] != "OPEN" || primary["OPEN CAUSE"] != "source_dead" || primary["NEXT ATTEMPT"] != "refused: circuit_open" || primary["REOPENS"] != "1" ||
		primary["EPOCH"] != "0" || primary["PROBE"] != "none" || primary["OVERRIDE"] != "none" {
		t.Errorf("primary %v, want OPEN by source_dead, refused: circuit_open, reopens 1, epoch 0, no probe, no override", primary)
	}
	// The remaining cooldown: positive and at most the configured 10m.
	if left, err := time.ParseDuration(primary["RETRY AFTER"]); err != nil || left <= 0 || left > 10*time.Minute {
		t.Errorf("primary RETRY AFTER %q (%v), want the remaining cooldown in (0, 10m]", primary["RETRY AFTER"], err)
	}
	wantBackup := map[string]string{"STATE": "CLOSED", "OPEN CAUSE": "none", "NEXT ATTEMPT": "admitted", "RETRY AFTER": "0s", "EPOCH": "0", "REOPENS": "0",
		"PROBE": "none", "WINDOW CALLS": "0", "WINDOW FAILURES": "0", "CONSECUTIVE FAILURES": "0/5", "OVERRIDE": "none"}
	for col, want := range wantBackup {
		if backup[col] != want {
			t.Errorf("backup %s = %q, want %q", col, backup[col], want)
		}
	}
	quota := section(t, out, "QUOTA AND PACER")
	for src, want := range map[string]map[string]string{
		"primary": {"IN FLIGHT": "0/4", "PACER CEILING": "4", "RPM": "1/600", "TPM": "0/no limit"},
		"backup":  {"IN FLIGHT": "0/2", "PACER CEILING": "2", "RPM": "0/no limit", "TPM": "0/no limit", "COOLDOWN MEMO": "0s", "FAILED RECENTLY": "no"},
	} {
		for col, v := range want {
			if quota[src][col] != v {
				t.Errorf("%s %s = %q, want %q", src, col, quota[src][col], v)
			}
		}
	}
	line := section(t, out, "LINE")
	for _, src := range []string{"primary", "backup"} {
		if l := line[src]; l["WAITING"] != "0" || l["OLDEST WAIT"] != "0s" || l["BY PRIORITY/TENANT"] != "none" {
			t.Errorf("%s LINE %v, want 0 waiting, 0s, none", src, l)
		}
	}
	tenants := section(t, out, "TENANTS")
	for name, want := range map[string]map[string]string{
		"team":   {"WEIGHT": "3", "MAX PRIORITY": "2", "LIVE CALLS": "0/5", "RPM": "0/60", "TOKEN BUDGET": "0/1000 per 1h0m0s", "NEXT PICK": "admitted"},
		"~other": {"WEIGHT": "1", "MAX PRIORITY": "0", "LIVE CALLS": "1/no limit", "IN FLIGHT": "0/no limit", "TOKEN BUDGET": "none"},
	} {
		for col, v := range want {
			if tenants[name][col] != v {
				t.Errorf("tenant %s %s = %q, want %q", name, col, tenants[name][col], v)
			}
		}
	}
	cfg := section(t, out, "CONFIGURATION")
	if c := cfg["primary"]; c["COOLDOWN"] != "10m0s" || c["FAIL THRESHOLD"] != "5" || !strings.HasSuffix(c["PROBE TTL"], "(derived)") {
		t.Errorf("primary configuration %v", c)
	}
}

func TestJSONIsProtojsonWithZeros(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	openPrimary(t, ctx, s)

	out, _, err := ctl(t, ctx, s, "describe", "chat", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var d admissionv1.DescribeScopeResponse
	if err := protojson.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("describe --json is not a DescribeScopeResponse: %v\n%s", err, out)
	}
	if st := d.GetScope().GetSources()[0].GetState(); st != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("primary %v, want OPEN", st)
	}
	var generic struct {
		Scope struct {
			Sources []map[string]any `json:"sources"`
		} `json:"scope"`
	}
	if err := json.Unmarshal([]byte(out), &generic); err != nil || len(generic.Scope.Sources) != 2 {
		t.Fatalf("describe --json: %v\n%s", err, out)
	}
	for _, key := range []string{"epoch", "windowCalls", "windowFailures", "consecutiveFailures", "inFlight", "probeOut", "override", "openCause", "line"} {
		if _, ok := generic.Scope.Sources[1][key]; !ok {
			t.Errorf("backup's %q is missing from --json; zero values must be shown", key)
		}
	}
	if c := generic.Scope.Sources[0]["openCause"]; c != "OPEN_CAUSE_SOURCE_DEAD" {
		t.Errorf("primary's openCause %v, want OPEN_CAUSE_SOURCE_DEAD", c)
	}
	if l, _ := json.Marshal(generic.Scope.Sources[1]["line"]); string(l) != `{"groups":[],"length":0,"oldestWait":"0s"}` {
		t.Errorf("backup's line %s, want every field at zero", l)
	}

	out, _, err = ctl(t, ctx, s, "--json", "scopes")
	if err != nil {
		t.Fatal(err)
	}
	var l admissionv1.ListScopesResponse
	if err := protojson.Unmarshal([]byte(out), &l); err != nil || len(l.GetScopes()) != 1 {
		t.Fatalf("scopes --json: %v\n%s", err, out)
	}
}

func TestScopesIsOneLineEach(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	openPrimary(t, ctx, s)
	out, _, err := ctl(t, ctx, s, "scopes")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "chat ") || !strings.HasSuffix(lines[1], "primary=OPEN backup=CLOSED") {
		t.Fatalf("scopes:\n%s", out)
	}
}

// TestWatchPrintsOverrides: watch prints one line for an override made by
// the override command, and describe then shows who set it and why.
func TestWatchPrintsOverrides(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")

	watchCtx, stopWatch := context.WithCancel(ctx)
	var out, errOut admissiontest.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(watchCtx, []string{"--addr", s.Addr, "watch", "chat"}, env("POLYGATE_TOKEN="+token), &out, &errOut)
	}()
	waitFor(t, ctx, "watch to register", func() bool { return strings.Contains(errOut.String(), "watching scope chat") })

	if got, _, err := ctl(t, ctx, s, "override", "chat", "backup", "force-open", "--reason", "INC-42 backup returns garbage", "--actor", "alice"); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(got, "forced_open") {
		t.Errorf("override printed:\n%s", got)
	}
	want := `chat override backup force_open override=forced_open actor="alice" reason="INC-42 backup returns garbage" state=CLOSED epoch=0`
	waitFor(t, ctx, "the override event", func() bool { return strings.Contains(out.String(), want) })
	openPrimary(t, ctx, s)
	transition := "chat breaker primary CLOSED -> OPEN cause=source_dead epoch=0 reopens=1 cooldown=10m0s"
	waitFor(t, ctx, "the transition event", func() bool { return strings.Contains(out.String(), transition) })
	stopWatch()
	if err := <-done; err != nil {
		t.Errorf("watch ended with %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], " #1 ") || !strings.HasSuffix(lines[0], want) || !strings.HasSuffix(lines[1], transition) {
		t.Errorf("watch printed %d lines, want one per event, numbered, in order:\n%s", len(lines), out.String())
	}

	desc, _, err := ctl(t, ctx, s, "describe", "chat")
	if err != nil {
		t.Fatal(err)
	}
	if b := section(t, desc, "BREAKERS")["backup"]; b["STATE"] != "OPEN (forced; breaker CLOSED)" || b["OVERRIDE"] != "forced_open" || b["NEXT ATTEMPT"] != "refused: forced_open" {
		t.Errorf("backup after the override: %v", b)
	}
	if !strings.Contains(desc, `override of backup: forced_open by "alice": "INC-42 backup returns garbage"`) {
		t.Errorf("describe does not say who set the override and why:\n%s", desc)
	}
	// --actor defaults to $USER.
	if _, _, err := ctl(t, ctx, s, "override", "chat", "backup", "CLEAR", "--reason", "fixed"); err != nil {
		t.Fatal(err)
	}
}

func TestWatchJSONIsOneObjectPerLine(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var out, errOut admissiontest.LockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(watchCtx, []string{"--addr", s.Addr, "--json", "watch"}, env("POLYGATE_TOKEN="+token), &out, &errOut)
	}()
	waitFor(t, ctx, "watch to register", func() bool { return strings.Contains(errOut.String(), "watching every scope") })
	openPrimary(t, ctx, s)
	waitFor(t, ctx, "the transition event", func() bool { return strings.Contains(out.String(), "\n") })
	stopWatch()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(out.String(), "\n")
	var ev admissionv1.WatchEventsResponse
	if err := protojson.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("first line is not an event: %v\n%s", err, line)
	}
	if tr := ev.GetBreakerTransition(); tr.GetTo() != admissionv1.BreakerState_BREAKER_STATE_OPEN ||
		tr.GetCause() != admissionv1.TransitionCause_TRANSITION_CAUSE_SOURCE_DEAD {
		t.Errorf("first event %v, want the primary's transition to OPEN", &ev)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestUnixSocketAndTokenFile(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "unix://"+filepath.Join(t.TempDir(), "polygate.sock"))
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out admissiontest.LockedBuffer
	if err := run(ctx, []string{"--addr", s.Addr, "--token-file", file, "scopes"}, env(), &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "primary=CLOSED backup=CLOSED") {
		t.Errorf("scopes:\n%s", out.String())
	}
	// Inside the sidecar's container (kubectl exec), its own token is used.
	out = admissiontest.LockedBuffer{}
	if err := run(ctx, []string{"--addr", s.Addr, "scopes"}, env("POLYGATE_AUTH__TOKEN="+token), &out, &out); err != nil {
		t.Fatalf("with $POLYGATE_AUTH__TOKEN: %v\n%s", err, out.String())
	}
}

// TestErrorsAreClear: each mistake fails with a message that says what was
// wrong; usage mistakes are usage errors (exit status 2).
func TestErrorsAreClear(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		usage bool
		want  []string
	}{
		{"unknown scope", []string{"describe", "nope"}, nil, false, []string{`describe "nope": NOT_FOUND (UNKNOWN_SCOPE)`}},
		{"unknown scope to watch", []string{"watch", "nope"}, nil, false, []string{`watch "nope": NOT_FOUND (UNKNOWN_SCOPE)`}},
		{"unknown source", []string{"override", "chat", "nope", "reset", "--reason", "r"}, nil, false, []string{"INVALID_ARGUMENT (UNKNOWN_SOURCE)"}},
		{"no token", []string{"scopes"}, []string{"POLYGATE_TOKEN="}, false, []string{"UNAUTHENTICATED", "--token, --token-file or $POLYGATE_TOKEN"}},
		{"nobody listening", []string{"--addr", "127.0.0.1:1", "scopes"}, nil, false, []string{"UNAVAILABLE", "is the sidecar running and listening on 127.0.0.1:1?"}},
		{"no command", nil, nil, true, []string{"a command is required"}},
		{"unknown command", []string{"status"}, nil, true, []string{`unknown command "status"`}},
		{"unknown action", []string{"override", "chat", "backup", "open", "--reason", "r"}, nil, true, []string{`ACTION "open" is not allowed`}},
		{"no reason", []string{"override", "chat", "backup", "reset"}, nil, true, []string{"--reason is required"}},
		{"no actor", []string{"override", "chat", "backup", "reset", "--reason", "r"}, []string{"USER="}, true, []string{"--actor is required"}},
		{"extra argument", []string{"describe", "chat", "extra"}, nil, true, []string{"describe takes one SCOPE, got 2"}},
		{"bad timeout", []string{"--timeout", "0s", "scopes"}, nil, true, []string{"--timeout 0s is not allowed"}},
		{"half a key pair", []string{"--cert-file", "c.pem", "scopes"}, nil, true, []string{"--cert-file and --key-file go together"}},
		{"unknown flag", []string{"scopes", "--verbose"}, nil, true, []string{"flag provided but not defined: -verbose"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := append([]string{"POLYGATE_TOKEN=" + token, "USER=tester"}, tc.env...)
			var out, errOut admissiontest.LockedBuffer
			args := append([]string{"--addr", s.Addr}, tc.args...)
			err := run(ctx, args, env(e...), &out, &errOut)
			if err == nil {
				t.Fatalf("no error; stdout:\n%s", out.String())
			}
			var u usageError
			if errors.As(err, &u) != tc.usage {
				t.Errorf("%v: usage error %v, want %v", err, !tc.usage, tc.usage)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if out.String() != "" {
				t.Errorf("stdout on error:\n%s", out.String())
			}
		})
	}
}

// TestExitStatus runs the built command: a failed request exits 1 with the
// message on stderr, a usage mistake exits 2, -h exits 0.
func TestExitStatus(t *testing.T) {
	ctx := testContext(t)
	s := startSidecar(t, "127.0.0.1:0")
	bin := filepath.Join(t.TempDir(), "polygatectl")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"describe", "nope"}, 1, `polygatectl: describe "nope": NOT_FOUND (UNKNOWN_SCOPE)`},
		{[]string{"frobnicate"}, 2, `polygatectl: unknown command "frobnicate"`},
		{[]string{"-h"}, 0, "usage: polygatectl"},
	} {
		cmd := exec.CommandContext(ctx, bin, append([]string{"--addr", s.Addr}, tc.args...)...)
		cmd.Env = append(os.Environ(), "POLYGATE_TOKEN="+token)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("polygatectl %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// describe shows who waits in line for a source: how many, the longest
// wait, and the count per priority and tenant; --json has the same.
func TestDescribeShowsTheLine(t *testing.T) {
	ctx := testContext(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(`
scopes:
  queue:
    quota_full: wait
    backpressure: {stall_window: 10m, poll_interval: 10m}
    tenants: {search: 1, batch: 1} # named: no priority ceiling
    sources: [{name: only, max_concurrency: 1}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file}, "POLYGATE_AUTH__TOKEN="+token)
	actx, c := client(t, ctx, s)
	held, err := c.Pick(actx, &admissionv1.PickRequest{Scope: "queue"})
	if err != nil || held.GetGrant() == nil {
		t.Fatalf("Pick: %v %v", held, err)
	}
	// Three callers wait (in OnNoRunnable) until the test ends.
	wctx, stop := context.WithCancel(actx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for _, w := range []struct {
		priority int32
		tenant   string
	}{{5, "search"}, {0, "batch"}, {5, "search"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := c.Pick(wctx, &admissionv1.PickRequest{Scope: "queue", Priority: w.priority, Tenant: w.tenant})
			if err != nil || p.GetNoRunnable() == nil {
				t.Errorf("waiter's Pick: %v %v", p, err)
				return
			}
			_, _ = c.OnNoRunnable(wctx, &admissionv1.OnNoRunnableRequest{Scope: "queue", CallId: p.GetCallId()})
		}()
	}
	for {
		d, err := c.DescribeScope(actx, &admissionv1.DescribeScopeRequest{Scope: "queue"})
		if err != nil {
			t.Fatal(err)
		}
		if d.GetScope().GetSources()[0].GetLine().GetLength() == 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the line never reached 3: %v", d)
		case <-time.After(10 * time.Millisecond):
		}
	}

	out, _, err := ctl(t, ctx, s, "describe", "queue")
	if err != nil {
		t.Fatal(err)
	}
	l := section(t, out, "LINE")["only"]
	if l["WAITING"] != "3" || l["BY PRIORITY/TENANT"] != "5/search=2 0/batch=1" {
		t.Errorf("LINE %v, want 3 waiting: 5/search=2 0/batch=1\n%s", l, out)
	}
	if d, err := time.ParseDuration(l["OLDEST WAIT"]); err != nil || d <= 0 {
		t.Errorf("OLDEST WAIT %q (%v), want a positive duration", l["OLDEST WAIT"], err)
	}
	t.Logf("polygatectl describe queue, three callers in line:\n%s", out)

	out, _, err = ctl(t, ctx, s, "describe", "queue", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var d admissionv1.DescribeScopeResponse
	if err := protojson.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("describe --json: %v\n%s", err, out)
	}
	if line := d.GetScope().GetSources()[0].GetLine(); line.GetLength() != 3 || len(line.GetGroups()) != 2 ||
		line.GetGroups()[0].GetWaiting() != 2 || line.GetGroups()[0].GetTenant() != "search" {
		t.Errorf("--json line %v", line)
	}
}

// TestAddressAndTokenFromTheEnvironment: without --addr and --token,
// polygatectl dials $POLYGATE_ADDR with $POLYGATE_TOKEN (the application's
// variables); inside the sidecar's container it takes the sidecar's
// operator token before its application token; flags win over all of them.
func TestAddressAndTokenFromTheEnvironment(t *testing.T) {
	ctx := testContext(t)
	const operator = "op3rator-token"
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file},
		"POLYGATE_AUTH__TOKEN="+token, "POLYGATE_AUTH__OPERATOR_TOKEN="+operator)
	override := []string{"override", "chat", "backup", "force_open", "--reason", "env test"}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string // "" for success, else what the error says
	}{
		{"the application's variables", []string{"scopes"}, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_TOKEN=" + token}, ""},
		{"--addr wins over $POLYGATE_ADDR", []string{"--addr", s.Addr, "scopes"}, []string{"POLYGATE_ADDR=127.0.0.1:1", "POLYGATE_TOKEN=" + token}, ""},
		{"a wrong $POLYGATE_ADDR is named", []string{"scopes"}, []string{"POLYGATE_ADDR=127.0.0.1:1", "POLYGATE_TOKEN=" + token}, "listening on 127.0.0.1:1? (--addr or $POLYGATE_ADDR"},
		{"--token wins over $POLYGATE_TOKEN", []string{"--token", token, "scopes"}, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_TOKEN=wrong"}, ""},
		{"$POLYGATE_TOKEN is sent", []string{"scopes"}, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_TOKEN=wrong"}, "UNAUTHENTICATED"},
		{"the application's token may not override", override, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_TOKEN=" + token}, "PERMISSION_DENIED"},
		{"the sidecar's operator token first", override, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_AUTH__TOKEN=" + token, "POLYGATE_AUTH__OPERATOR_TOKEN=" + operator}, ""},
		{"the sidecar's application token last", override, []string{"POLYGATE_ADDR=" + s.Addr, "POLYGATE_AUTH__TOKEN=" + token}, "PERMISSION_DENIED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut admissiontest.LockedBuffer
			err := run(ctx, tc.args, env(append(tc.env, "USER=tester")...), &out, &errOut)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("%v\n%s", err, errOut.String())
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
