package redisgate

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

var (
	//go:embed lib.lua
	libLua string
	//go:embed admit.lua
	admitLua string
	//go:embed settle.lua
	settleLua string
	//go:embed peek.lua
	peekLua string
	//go:embed override.lua
	overrideLua string
	//go:embed restore.lua
	restoreLua string
)

// The four scripts, one per Backend method. Each is the prelude, the shared
// state machines of lib.lua, and the script's own body, so that one Lua text
// of the state machines serves all four and no script depends on another
// being loaded.
var (
	admitScript    = redis.NewScript(script(admitLua))
	settleScript   = redis.NewScript(script(settleLua))
	peekScript     = redis.NewScript(script(peekLua))
	overrideScript = redis.NewScript(script(overrideLua))
	// restoreScript is no Backend method: the background re-assertion of
	// what a replica knows after Redis lost a scope (reassert.go).
	restoreScript = redis.NewScript(script(restoreLua))
)

func script(body string) string {
	return prelude() + libLua + body
}

// prelude writes the gate package's constants as Lua locals, so the scripts
// cannot drift from the Go enums they answer in.
func prelude() string {
	var b strings.Builder
	def := func(name string, v any) { fmt.Fprintf(&b, "local %s = %d\n", name, v) }
	def("CLOSED", gate.Closed)
	def("OPEN", gate.Open)
	def("HALF_OPEN", gate.HalfOpen)
	def("NO_OVERRIDE", gate.NoOverride)
	def("FORCED_OPEN", gate.ForcedOpen)
	def("FORCED_CLOSED", gate.ForcedClosed)
	def("DISABLED", gate.Disabled)
	def("A_FORCE_OPEN", gate.ActionForceOpen)
	def("A_FORCE_CLOSED", gate.ActionForceClosed)
	def("A_DISABLE", gate.ActionDisable)
	def("A_CLEAR", gate.ActionClear)
	def("A_RESET", gate.ActionReset)
	def("R_NONE", gate.ReasonNone)
	def("R_CIRCUIT_OPEN", gate.ReasonCircuitOpen)
	def("R_PROBE_IN_FLIGHT", gate.ReasonProbeInFlight)
	def("R_FORCED_OPEN", gate.ReasonForcedOpen)
	def("R_ADAPTIVE_PACED", gate.ReasonAdaptivePaced)
	def("R_RATE_LIMITED", gate.ReasonRateLimited)
	def("V_SUCCESS", gate.VerdictSuccess)
	def("V_FAILURE", gate.VerdictFailure)
	def("V_FORCE_OPEN", gate.VerdictForceOpen)
	def("F_APPLIED", gate.EffectApplied)
	def("F_NO_VERDICT", gate.EffectNoVerdict)
	def("F_STALE", gate.EffectStale)
	def("F_IGNORED", gate.EffectIgnored)
	def("E_TRANSITION", gate.EventTransition)
	def("E_PROBE_LEASED", gate.EventProbeLeased)
	def("E_PROBE_EXPIRED", gate.EventProbeExpired)
	def("E_PROBE_RELEASED", gate.EventProbeReleased)
	def("E_STALE", gate.EventStaleOutcome)
	def("E_OVERRIDE", gate.EventOverride)
	def("C_NONE", gate.CauseNone)
	def("C_CONSECUTIVE_FAILURES", gate.CauseConsecutiveFailures)
	def("C_FAILURE_RATE", gate.CauseFailureRate)
	def("C_SOURCE_DEAD", gate.CauseSourceDead)
	def("OC_NONE", gate.OpenCauseNone)
	def("OC_FAILURES", gate.OpenCauseFailures)
	def("OC_SOURCE_DEAD", gate.OpenCauseSourceDead)
	def("OC_FORCED", gate.OpenCauseForced)
	def("C_COOLDOWN_ELAPSED", gate.CauseCooldownElapsed)
	def("C_PROBE_SUCCEEDED", gate.CauseProbeSucceeded)
	def("C_PROBE_FAILED", gate.CauseProbeFailed)
	def("C_RESET", gate.CauseReset)
	def("MINUTE", gate.Minute)
	def("BUCKETS", gate.WindowBuckets)
	def("MAX_TOKEN_SUM", int64(gate.MaxTokenSum))
	return b.String()
}
