package redisgate

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
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
	//go:embed batch.lua
	batchLua string
)

// op is one Lua entry point: body defines a local function of that name,
// taking (keys, argv, ao, map), after the bodies of the parts it calls: its
// arguments start after argv[ao], and map says where its keys are (see
// lib.lua's op_src); 0 and nil in a call of its own.
type op struct {
	name  string
	body  string
	parts []*op
	fn    string        // the Redis Function's name in the library
	eval  *redis.Script // the fallback: prelude, lib.lua, the parts, the body, a call
}

// The operations: Peek, Override, Leave, restore, and the Admits and
// Settles: a batch of them (batch.lua, which runs admit.lua's and
// settle.lua's functions), or one alone (admit, settle: a batch of one costs
// more Lua work than the op's own function; see batch.go). They are served
// from one Redis
// Functions library (library), loaded once per server, so that a call runs
// only its body; where Functions are missing or refused each is a script of
// its own (EVALSHA), which runs lib.lua's definitions each time.
var (
	admitScript    = newOp("admit", admitLua)
	settleScript   = newOp("settle", settleLua)
	batchScript    = newOp("batch", batchLua, admitScript, settleScript)
	peekScript     = newOp("peek", peekLua)
	overrideScript = newOp("override", overrideLua)
	// restoreScript is no Backend method: the background re-assertion of
	// what a replica knows after Redis lost a scope (reassert.go).
	restoreScript = newOp("restore", restoreLua)
	ops           = []*op{admitScript, settleScript, batchScript, peekScript, overrideScript, restoreScript, leaveScript}
)

func newOp(name, body string, parts ...*op) *op {
	o := &op{name: name, body: body, parts: parts}
	o.eval = redis.NewScript(prelude() + libLua + o.text() + "\n" + callStart + "return " + name + "(KEYS, ARGV, 0, nil)\n")
	return o
}

// text is the op's parts' bodies, then its own.
func (o *op) text() string {
	var b strings.Builder
	for _, p := range o.parts {
		b.WriteString(p.body)
	}
	b.WriteString(o.body)
	return b.String()
}

// libVersion names this build's library and functions by the digest of its
// whole text (with the version left out of the names), so that sidecars of
// different versions sharing one Redis each call their own.
var libVersion = func() string {
	sum := sha1.Sum([]byte(libraryText("")))
	return hex.EncodeToString(sum[:6])
}()

func init() {
	for _, o := range ops {
		o.fn = functionName(libVersion, o.name)
	}
}

func functionName(version, op string) string { return "polygate_" + version + "_" + op }

// callStart begins every call: struct's functions as the prelude's locals
// S_UNPACK and S_PACK, which the layouts' functions call (an upvalue, where
// struct.unpack is two table lookups per call). They are set at each call
// because struct is missing while the library loads.
const callStart = "S_UNPACK, S_PACK = struct.unpack, struct.pack\n"

// library is the Redis Functions library of every operation.
func library() string { return libraryText(libVersion) }

func libraryText(version string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=polygate_%s\n", version)
	b.WriteString(prelude() + libLua)
	// Every function starts outside any batch (CALL, lib.lua), whatever an
	// earlier call that failed left.
	for _, o := range ops {
		b.WriteString(o.body)
		fmt.Fprintf(&b, "\nredis.register_function(%q, function(keys, argv)\n  CALL = nil\n  %sreturn %s(keys, argv, 0, nil)\nend)\n", functionName(version, o.name), callStart, o.name)
	}
	return b.String()
}

// prelude writes the gate package's constants as Lua locals, so the scripts
// cannot drift from the Go enums they answer in.
func prelude() string {
	var b strings.Builder
	def := func(name string, v any) { fmt.Fprintf(&b, "local %s = %d\n", name, v) }
	b.WriteString("local S_UNPACK, S_PACK = nil, nil -- struct's, set by callStart\n")
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
	def("R_QUEUED", gate.ReasonQueued)
	def("V_NONE", gate.VerdictNone)
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
	// (OpenCauseNone and OpenCauseForced, which no script sets, are not
	// defined: the library is at Lua 5.1's 200 locals per chunk, and
	// lib.lua's BYTE took their place.)
	def("OC_FAILURES", gate.OpenCauseFailures)
	def("OC_SOURCE_DEAD", gate.OpenCauseSourceDead)
	def("C_COOLDOWN_ELAPSED", gate.CauseCooldownElapsed)
	def("C_PROBE_SUCCEEDED", gate.CauseProbeSucceeded)
	def("C_PROBE_FAILED", gate.CauseProbeFailed)
	def("C_RESET", gate.CauseReset)
	def("MINUTE", gate.Minute)
	def("BUCKETS", gate.WindowBuckets)
	def("MAX_TOKEN_SUM", int64(gate.MaxTokenSum))
	def("OP_ADMIT", opAdmit)
	def("OP_SETTLE", opSettle)
	lineConstants(def)
	fmt.Fprintf(&b, "local OVERFLOW_TENANT = %q\n", gate.OverflowTenant)
	def("LEASE_BYTE", leaseField[0])
	fmt.Fprintf(&b, "local LEASE = %q\n", leaseField)
	fmt.Fprintf(&b, "local LEASE_LOGGED = %q\n", leaseLogged)
	// An admit's or a settle's one argument (opArg) after argv[base], as a
	// layout's read finds its block.
	b.WriteString("local function op_arg(argv, base)\n  return argv[base + 1]\nend\n")
	for _, l := range luaLayouts() {
		l.write(&b)
	}
	for _, r := range records {
		r.write(&b)
	}
	return b.String()
}
