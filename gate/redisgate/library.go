package redisgate

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
)

// The Lua code is one Redis Functions library with one function, run
// (ops.lua): the prelude Go writes below, then the files of lua/, each one
// state machine's port, in the order listed (each uses the ones before).
//
//go:embed lua/*.lua
var luaFS embed.FS

var luaFiles = []string{"store.lua", "breaker.lua", "quota.lua", "tenant.lua", "line.lua", "ops.lua"}

// library is the library's text and fn its function's name: named by the
// digest of the text, so that sidecars of different versions sharing one
// Redis each load and call their own.
var library, fn = func() (string, string) {
	var body strings.Builder
	body.WriteString(prelude())
	for _, f := range luaFiles {
		b, err := luaFS.ReadFile("lua/" + f)
		if err != nil {
			panic(err)
		}
		body.Write(b)
	}
	sum := sha1.Sum([]byte(body.String()))
	name := "polygate_" + hex.EncodeToString(sum[:6])
	return fmt.Sprintf("#!lua name=%s\n%s\nredis.register_function('%s', run)\n", name, body.String(), name), name
}()

// prelude writes the gate package's constants as Lua locals, so that the
// scripts cannot drift from the Go enums they answer in: each enum's values
// by their names, upper-cased, after a prefix.
func prelude() string {
	var b strings.Builder
	def := func(name string, v int64) { fmt.Fprintf(&b, "local %s = %d\n", name, v) }
	enum := func(prefix string, n int, name func(uint8) string) {
		for v := range n {
			def(prefix+strings.ToUpper(name(uint8(v))), int64(v))
		}
	}
	enum("", int(gate.HalfOpen)+1, func(v uint8) string { return gate.State(v).String() })
	enum("OC_", int(gate.OpenCauseForced)+1, func(v uint8) string { return gate.OpenCause(v).String() })
	enum("O_", int(gate.Disabled)+1, func(v uint8) string { return gate.Override(v).String() })
	enum("R_", int(gate.ReasonTenantBudget)+1, func(v uint8) string { return gate.Reason(v).String() })
	enum("V_", int(gate.VerdictForceOpen)+1, func(v uint8) string { return gate.Verdict(v).String() })
	enum("F_", int(gate.EffectIgnored)+1, func(v uint8) string { return gate.Effect(v).String() })
	enum("C_", int(gate.CauseReset)+1, func(v uint8) string { return gate.Cause(v).String() })
	for a := gate.ActionForceOpen; a <= gate.ActionReset; a++ {
		def("A_"+strings.ToUpper(a.String()), int64(a))
	}
	for k := gate.EventTransition; k <= gate.EventOverride; k++ {
		def("E_"+strings.ToUpper(k.String()), int64(k))
	}
	for k, name := range []string{kindAdmit: "ADMIT", kindSettle: "SETTLE", kindGiveBack: "GIVE_BACK", kindPeek: "PEEK",
		kindOverride: "OVERRIDE", kindLeave: "LEAVE", kindRestore: "RESTORE"} {
		if name != "" {
			def("K_"+name, int64(k))
		}
	}
	def("MINUTE", gate.Minute)
	def("WINDOW_BUCKETS", gate.WindowBuckets)
	def("BUDGET_BUCKETS", gate.BudgetBuckets)
	def("MAX_TOKEN_SUM", gate.MaxTokenSum)
	def("LINE_CAP", gate.LineCap)
	def("SHARE_SCALE", gate.ShareScale)
	def("CLASS_OFFSET", gate.ClassOffset)
	def("KEY_LEN", gate.KeyLen)
	def("DESCRIBE_MAX", gate.DescribeMax)
	fmt.Fprintf(&b, "local OVERFLOW_TENANT = %q\n", gate.OverflowTenant)
	return b.String()
}

// fcall runs the library's function once: the library is loaded (FUNCTION
// LOAD REPLACE, on every master of a Cluster) when the server does not have
// it (first use, a restart, FUNCTION FLUSH), and the call made again.
func (b *Backend) fcall(ctx context.Context, keys []string, args []any) ([]any, error) {
	v, err := b.client.FCall(ctx, fn, keys, args...).Slice()
	if err != nil && notLoaded(err) {
		if err = b.load(ctx); err == nil {
			v, err = b.client.FCall(ctx, fn, keys, args...).Slice()
		}
	}
	return v, err
}

func (b *Backend) load(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoadReplace(ctx, library).Err()
		if refused(err) {
			return fmt.Errorf("%w (polygate needs Redis 7 or later, and an ACL that allows FUNCTION LOAD and FCALL)", err)
		}
		return err
	}
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Client:
		return load(ctx, c)
	}
	return b.client.FunctionLoadReplace(ctx, library).Err()
}

// notLoaded reports whether err says the server lacks the function.
func notLoaded(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(err.Error()), "function not found")
}

// refused reports whether FUNCTION LOAD failed for want of the command or
// of the permission, rather than for an error in the library.
func refused(err error) bool {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return false
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "unknown command") || strings.Contains(m, "unknown subcommand") || redis.HasErrorPrefix(err, "NOPERM")
}
