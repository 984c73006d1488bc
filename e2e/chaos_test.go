package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// restartConfig has three single-source scopes, one per thing a restart
// must not forget: an operator's override, an OPEN breaker, the minute's TPM.
func restartConfig(statePath string, cooldown time.Duration) string {
	backend := "backend: {kind: memory}"
	if statePath != "" {
		backend = fmt.Sprintf("backend: {kind: memory, memory: {state_path: %q}}", statePath)
	}
	return fmt.Sprintf(`
%s
scopes:
  ops:
    sources: [{name: primary, attributes: {base_url: "http://127.0.0.1:1"}}]
  dead:
    breaker: {cooldown: %s, max_cooldown: %s}
    sources: [{name: primary, attributes: {base_url: "http://127.0.0.1:1"}}]
  metered:
    quota_full: fail_fast
    sources: [{name: primary, max_concurrency: 4, tpm: 1000, attributes: {base_url: "http://127.0.0.1:1"}}]
`, backend, cooldown, cooldown)
}

// The sidecar is killed with SIGKILL and started again on the same
// configuration. With backend.memory.state_path, an operator's FORCE_OPEN
// (with actor and reason), a breaker OPEN by a SOURCE_DEAD outcome and the
// TPM used in the current minute all survive: DescribeScope shows them and a
// burst over tpm is still refused. Without it, all three are lost — the
// failure this option exists for, kept as a test so that the docs'
// "what is lost" stays true.
func TestChaos_SidecarKill9Restart(t *testing.T) {
	// The OPEN must outlast the restart, and the tokens must stay in the
	// sliding minute: both margins are checked against the clock below.
	const cooldown = 300 * time.Second
	const burst = 600 // tokens, on tpm 1000
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "with state_path", false: "without state_path"}[keep], func(t *testing.T) {
			statePath := ""
			if keep {
				statePath = filepath.Join(t.TempDir(), "state.json")
			}
			sc := startChaosSidecar(t, restartConfig(statePath, cooldown))
			ctx := ctxT(t)

			prot := sc.protect(ctx, "ops", "dead")
			burstAt := time.Now()
			pick, err := sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "metered", EstimatedTokens: burst})
			if err != nil || pick.GetGrant() == nil {
				t.Fatalf("Pick(metered, %d tokens) = %v, %v; want a grant", burst, pick, err)
			}
			if _, err := sc.raw.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "metered", CallId: pick.GetCallId(),
				PermitId: pick.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
				t.Fatal(err)
			}
			if keep {
				// Overrides and breaker changes are on disk when their answers
				// are; quota use within a flush interval: wait for it.
				eventually(t, "the state file holds the minute's tokens", func() bool { return stateTokens(t, statePath, "metered") == burst })
			}

			sc.kill9()
			sc.restart()
			if since := time.Since(burstAt); since >= time.Minute {
				t.Fatalf("the restart took %v: the burst left the sliding minute, nothing to check", since)
			}
			if since := time.Since(prot.opened); since >= cooldown {
				t.Fatalf("the restart took %v: the %v cooldown is over, nothing to check", since, cooldown)
			}

			ops, dead, readAt, err := prot.read(ctx, sc)
			if err != nil {
				t.Fatal(err)
			}
			metered, err := sc.source(ctx, "metered", "primary")
			if err != nil {
				t.Fatal(err)
			}
			again, err := sc.raw.Pick(ctx, &admissionv1.PickRequest{Scope: "metered", EstimatedTokens: burst})
			if err != nil {
				t.Fatal(err)
			}
			if !keep {
				// What a restart without state_path loses.
				if ops.GetOverride() != admissionv1.Override_OVERRIDE_UNSPECIFIED || dead.GetState() != admissionv1.BreakerState_BREAKER_STATE_CLOSED ||
					metered.GetTokensLastMinute() != 0 || again.GetGrant() == nil {
					t.Errorf("without state_path something survived: override %v, breaker %v, tokens %d, burst granted %v",
						ops.GetOverride(), dead.GetState(), metered.GetTokensLastMinute(), again.GetGrant() != nil)
				}
				t.Logf("without state_path, lost: override %v → %v, breaker OPEN → %v, tokens %d → %d, a second %d-token burst granted: %v",
					admissionv1.Override_OVERRIDE_FORCED_OPEN, ops.GetOverride(), dead.GetState(), burst, metered.GetTokensLastMinute(), burst, again.GetGrant() != nil)
				return
			}
			prot.check(t, ctx, sc, ops, dead, readAt, cooldown, 0)
			if metered.GetTokensLastMinute() != burst || metered.GetRequestsLastMinute() != 1 || metered.GetInFlight() != 0 {
				t.Errorf("metered source after restart: %d tokens, %d requests, %d in flight; want %d, 1, 0",
					metered.GetTokensLastMinute(), metered.GetRequestsLastMinute(), metered.GetInFlight(), burst)
			}
			if again.GetGrant() != nil {
				t.Errorf("a second %d-token burst was granted after restart on tpm 1000", burst)
			}
		})
	}
}

// stateTokens reads the tokens of the scope's primary source's minute from
// the state file (0 while it does not hold them).
func stateTokens(t *testing.T, path, scope string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var doc struct {
		Scopes map[string]struct {
			Sources map[string]struct {
				Minute [][2]int64 `json:"minute"`
			} `json:"sources"`
		} `json:"scopes"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("state file %s: %v", path, err)
	}
	var sum int64
	for _, c := range doc.Scopes[scope].Sources["primary"].Minute {
		sum += c[1]
	}
	return sum
}

// A state file that cannot be read stops the start with an error that names
// the key and the path; the sidecar never starts over silently.
func TestChaos_CorruptStateFileStopsStart(t *testing.T) {
	dir := t.TempDir()
	statePath := filepath.Join(dir, "state.json")
	if err := os.WriteFile(statePath, []byte(`{"version":1,"scopes":{"dead":`), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "polygate.yaml")
	if err := os.WriteFile(file, []byte(restartConfig(statePath, time.Minute)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctxT(t), sidecartest.Binary(t), "--config", file, "--listen", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("sidecar on a corrupt state file: %v, want exit status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "backend.memory.state_path") || !strings.Contains(string(out), statePath) {
		t.Errorf("start-up error does not name the key and the path:\n%s", out)
	}
	if data, _ := os.ReadFile(statePath); string(data) != `{"version":1,"scopes":{"dead":` {
		t.Error("the corrupt state file was changed")
	}
}

// A state file whose OPEN lasts 292 years (open_until_ms at the largest
// int64) or ends in the year 9999 starts the sidecar with that breaker OPEN
// for at most its max_cooldown, and the log names the field it clamped.
func TestChaos_StateFileOpenClampedToMaxCooldown(t *testing.T) {
	const maxCooldown = 300 * time.Second
	for name, until := range map[string]int64{"292 years": math.MaxInt64, "year 9999": 253402300799000} {
		t.Run(name, func(t *testing.T) {
			statePath := filepath.Join(t.TempDir(), "state.json")
			state := fmt.Sprintf(`{"version":1,"scopes":{"dead":{"sources":{"primary":{"breaker":`+
				`{"state":"open","epoch":1,"reopens":1,"opened_at_ms":%d,"open_until_ms":%d,"open_cause":"source_dead"}}}}}}`,
				time.Now().UnixMilli(), until)
			if err := os.WriteFile(statePath, []byte(state), 0o600); err != nil {
				t.Fatal(err)
			}
			sc := startChaosSidecar(t, restartConfig(statePath, maxCooldown))
			src, err := sc.source(ctxT(t), "dead", "primary")
			if err != nil {
				t.Fatal(err)
			}
			left := src.GetRetryAfter().AsDuration()
			t.Logf("open_until_ms %d loaded as an OPEN of %v (max_cooldown %v)", until, left.Round(time.Millisecond), maxCooldown)
			if src.GetState() != admissionv1.BreakerState_BREAKER_STATE_OPEN || left <= 0 || left > maxCooldown {
				t.Fatalf("breaker after the load: %v, retry_after %v; want OPEN for at most max_cooldown %v", src.GetState(), left, maxCooldown)
			}
			if logs := sc.proc.Logs(); !strings.Contains(logs, "field=scopes.dead.sources.primary.breaker.open_until_ms") {
				t.Errorf("no warning naming the clamped field in the log:\n%s", logs)
			}
		})
	}
}
