package inmem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/polygate/polygate/gate"
)

// StateVersion is the version of the state file format this package writes
// and the only one it reads. docs/operations.md describes the format.
const StateVersion = 1

// Bounds on what a state file may hold: it is read at start, and a file that
// breaks them is refused like a corrupt one.
const (
	maxStateBytes = 64 << 20
	maxNameLen    = 256
	maxTokens     = int64(1) << 40 // of one source's minute, and calls of one bucket: sums cannot wrap
	maxReopens    = 1 << 20
)

// stateFile is the JSON document of backend.memory.state_path. Times are
// wall-clock Unix milliseconds, so that they mean the same after a restart.
type stateFile struct {
	Version int `json:"version"`
	// WrittenAtMs is when the state was taken; informational.
	WrittenAtMs int64                 `json:"written_at_ms"`
	Scopes      map[string]scopeState `json:"scopes"`
}

type scopeState struct {
	// ProgressMs is the time of the scope's last successful attempt; 0 = never.
	ProgressMs int64                  `json:"progress_ms,omitempty"`
	Sources    map[string]sourceState `json:"sources"`
}

type sourceState struct {
	Breaker breakerState `json:"breaker"`
	// Minute is the sliding minute's admissions, oldest first, as
	// [admitted_at_ms, tokens] pairs (kept only when RPM or TPM is limited).
	Minute [][2]int64 `json:"minute,omitempty"`
}

// bucketState is one slice of the failure-rate window: Index is the
// slice's start divided by bucket_width_ms.
type bucketState struct {
	Index int64 `json:"index"`
	Calls int64 `json:"calls"`
	Fails int64 `json:"failures"`
}

type breakerState struct {
	State         string        `json:"state"`
	Epoch         uint64        `json:"epoch"`
	Reopens       int           `json:"reopens,omitempty"`
	OpenedAtMs    int64         `json:"opened_at_ms,omitempty"`
	OpenUntilMs   int64         `json:"open_until_ms,omitempty"`
	OpenCause     string        `json:"open_cause,omitempty"`
	Consecutive   int           `json:"consecutive_failures,omitempty"`
	BucketWidthMs int64         `json:"bucket_width_ms,omitempty"`
	Buckets       []bucketState `json:"buckets,omitempty"`
	Override      string        `json:"override,omitempty"`
	Actor         string        `json:"actor,omitempty"`
	Reason        string        `json:"reason,omitempty"`
	OverrideAtMs  int64         `json:"override_at_ms,omitempty"`
}

// encodeSource takes what survives a restart from one source. A probe lease is not
// kept: its holder's call dies with the process, so the first entrant after
// the restart gets the probe. Permits' slots are not kept either, for the
// same reason: no outcome could ever release them.
func encodeSource(st *gate.SourceState, now int64) sourceState {
	b := &st.Breaker
	out := sourceState{Breaker: breakerState{
		State: b.State.String(), Epoch: b.Epoch, Reopens: b.Reopens,
		OpenedAtMs: b.OpenedAt, OpenUntilMs: b.OpenUntil, Consecutive: b.Consecutive,
		BucketWidthMs: b.Width, Actor: b.Actor, Reason: b.Why, OverrideAtMs: b.OverrideAt,
	}}
	if b.Override != gate.NoOverride {
		out.Breaker.Override = b.Override.String()
	}
	if b.Cause != gate.OpenCauseNone {
		out.Breaker.OpenCause = b.Cause.String()
	}
	for _, bk := range b.Buckets {
		if bk.Calls > 0 {
			out.Breaker.Buckets = append(out.Breaker.Buckets, bucketState{Index: bk.Index, Calls: bk.Calls, Fails: bk.Fails})
		}
	}
	for _, c := range st.Quota.Minute(now) {
		out.Minute = append(out.Minute, [2]int64{c.At, c.Tokens})
	}
	return out
}

var states = map[string]gate.State{}
var overrides = map[string]gate.Override{}
var openCauses = map[string]gate.OpenCause{}

func init() {
	for _, s := range []gate.State{gate.Closed, gate.Open, gate.HalfOpen} {
		states[s.String()] = s
	}
	for _, o := range []gate.Override{gate.ForcedOpen, gate.ForcedClosed, gate.Disabled} {
		overrides[o.String()] = o
	}
	for _, c := range []gate.OpenCause{gate.OpenCauseFailures, gate.OpenCauseSourceDead} {
		openCauses[c.String()] = c
	}
}

// clamped is a value of a state file that was out of its bounds when the
// file was loaded, and was brought back within them.
type clamped struct {
	field   string // as in the file, from the scope: scopes.chat.sources.a.breaker.open_until_ms
	was, is int64
	allowed string
}

// clamp brings the times of a loaded state within their bounds, and lists
// what it changed: no time after the load (a clock that jumped, a file
// written by hand), and an OPEN that ends at most maxOpen after it (its
// breaker's max_cooldown; 0: unbounded), which no cooldown of the
// configuration can exceed.
func clamp(in *sourceState, now int64, maxOpen time.Duration) []clamped {
	var out []clamped
	atMost := func(field string, v *int64, bound int64, allowed string) {
		if *v > bound {
			out = append(out, clamped{field: field, was: *v, is: bound, allowed: allowed})
			*v = bound
		}
	}
	const notLater = "at most the time of the load"
	b := &in.Breaker
	atMost("breaker.opened_at_ms", &b.OpenedAtMs, now, notLater)
	atMost("breaker.override_at_ms", &b.OverrideAtMs, now, notLater)
	if maxOpen > 0 {
		until := int64(math.MaxInt64)
		if ms := maxOpen.Milliseconds(); now <= math.MaxInt64-ms {
			until = now + ms
		}
		atMost("breaker.open_until_ms", &b.OpenUntilMs, until, fmt.Sprintf("at most max_cooldown (%v) after the load", maxOpen))
	}
	if n := len(in.Minute); n > 0 && in.Minute[n-1][0] > now {
		// Sorted (checked after): the latest tells; every later one is moved.
		last := in.Minute[n-1][0]
		for i := range in.Minute {
			in.Minute[i][0] = min(in.Minute[i][0], now)
		}
		out = append(out, clamped{field: "minute", was: last, is: now, allowed: notLater})
	}
	return out
}

// decodeSource checks one source's saved state and rebuilds it at now.
func decodeSource(in sourceState, now int64) (*gate.SourceState, error) {
	b := in.Breaker
	st := &gate.SourceState{}
	var ok bool
	if st.Breaker.State, ok = states[b.State]; !ok {
		return nil, fmt.Errorf("breaker.state %q: allowed: closed, open, half_open", clip(b.State))
	}
	if b.Override != "" {
		if st.Breaker.Override, ok = overrides[b.Override]; !ok {
			return nil, fmt.Errorf("breaker.override %q: allowed: forced_open, forced_closed, disabled", clip(b.Override))
		}
	}
	if b.OpenCause != "" {
		if st.Breaker.Cause, ok = openCauses[b.OpenCause]; !ok {
			return nil, fmt.Errorf("breaker.open_cause %q: allowed: failures, source_dead", clip(b.OpenCause))
		}
	}
	switch {
	case b.Reopens < 0 || b.Reopens > maxReopens:
		return nil, fmt.Errorf("breaker.reopens %d: must be 0 to %d", b.Reopens, maxReopens)
	case b.Consecutive < 0:
		return nil, fmt.Errorf("breaker.consecutive_failures %d: must be at least 0", b.Consecutive)
	case b.OpenedAtMs < 0 || b.OpenUntilMs < 0 || b.OverrideAtMs < 0 || b.BucketWidthMs < 0:
		return nil, errors.New("breaker times must be at least 0")
	case len(b.Buckets) > gate.WindowBuckets:
		return nil, fmt.Errorf("breaker.buckets: %d buckets, at most %d", len(b.Buckets), gate.WindowBuckets)
	case len(b.Actor) > gate.MaxText || len(b.Reason) > gate.MaxText:
		return nil, fmt.Errorf("breaker.actor and breaker.reason: at most %d bytes", gate.MaxText)
	}
	st.Breaker.Epoch, st.Breaker.Reopens = b.Epoch, b.Reopens
	st.Breaker.OpenedAt, st.Breaker.OpenUntil = b.OpenedAtMs, b.OpenUntilMs
	st.Breaker.Consecutive, st.Breaker.Width = b.Consecutive, b.BucketWidthMs
	st.Breaker.Actor, st.Breaker.Why, st.Breaker.OverrideAt = b.Actor, b.Reason, b.OverrideAtMs
	for _, bk := range b.Buckets {
		if bk.Index < 0 || bk.Calls < 0 || bk.Calls > maxTokens || bk.Fails < 0 || bk.Fails > bk.Calls {
			return nil, fmt.Errorf("breaker.buckets: %+v is not a count", bk)
		}
		st.Breaker.Buckets[bk.Index%gate.WindowBuckets] = gate.Bucket{Index: bk.Index, Calls: bk.Calls, Fails: bk.Fails}
	}
	// An OPEN whose cooldown has ended stays OPEN here: the breaker itself
	// turns it HALF_OPEN for the first entrant, who gets the probe.
	charges := make([]gate.Charge, 0, len(in.Minute))
	last, sum := int64(0), int64(0)
	for _, c := range in.Minute {
		if c[0] < last || c[1] < 0 || c[1] > maxTokens-sum {
			return nil, fmt.Errorf("minute: [%d, %d] is out of order or out of range (tokens 0 to %d in all)", c[0], c[1], maxTokens)
		}
		last, sum = c[0], sum+c[1]
		charges = append(charges, gate.Charge{At: c[0], Tokens: c[1]})
	}
	st.Quota.RestoreMinute(charges, now)
	return st, nil
}

// load reads the state file at path. A missing file is a fresh start (nil,
// nil); anything unreadable is an error naming the path. maxOpen bounds the
// OPEN of each source (see clamp); what was clamped is returned.
func load(path string, now int64, maxOpen func(scope, source string) time.Duration) (map[string]*scope, []clamped, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("memory state file %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("memory state file %s: %w", path, err)
	}
	scopes, fixed, err := parse(data, now, maxOpen)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state file %s is corrupt (fix or remove it; polygate does not start over silently): %w", path, err)
	}
	return scopes, fixed, nil
}

func parse(data []byte, now int64, maxOpen func(scope, source string) time.Duration) (map[string]*scope, []clamped, error) {
	if len(data) > maxStateBytes {
		return nil, nil, fmt.Errorf("larger than %d bytes", maxStateBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc stateFile
	if err := dec.Decode(&doc); err != nil {
		return nil, nil, err
	}
	if dec.More() {
		return nil, nil, errors.New("trailing data after the JSON document")
	}
	if doc.Version != StateVersion {
		return nil, nil, fmt.Errorf("version %d: this polygate reads version %d", doc.Version, StateVersion)
	}
	scopes := make(map[string]*scope, len(doc.Scopes))
	var fixed []clamped
	for name, ss := range doc.Scopes {
		if name == "" || len(name) > maxNameLen {
			return nil, nil, fmt.Errorf("scope name %q: 1 to %d bytes", clip(name), maxNameLen)
		}
		if ss.ProgressMs < 0 {
			return nil, nil, fmt.Errorf("scopes.%s.progress_ms %d: must be at least 0", name, ss.ProgressMs)
		}
		if ss.ProgressMs > now {
			fixed = append(fixed, clamped{field: "scopes." + name + ".progress_ms", was: ss.ProgressMs, is: now, allowed: "at most the time of the load"})
			ss.ProgressMs = now
		}
		s := &scope{sources: make(map[string]*gate.SourceState, len(ss.Sources)), progress: ss.ProgressMs}
		for src, in := range ss.Sources {
			if src == "" || len(src) > maxNameLen {
				return nil, nil, fmt.Errorf("scopes.%s: source name %q: 1 to %d bytes", name, clip(src), maxNameLen)
			}
			var bound time.Duration
			if maxOpen != nil {
				bound = maxOpen(name, src)
			}
			for _, f := range clamp(&in, now, bound) {
				f.field = "scopes." + name + ".sources." + src + "." + f.field
				fixed = append(fixed, f)
			}
			st, err := decodeSource(in, now)
			if err != nil {
				return nil, nil, fmt.Errorf("scopes.%s.sources.%s.%w", name, src, err)
			}
			s.sources[src] = st
		}
		scopes[name] = s
	}
	return scopes, fixed, nil
}

// clip bounds a value echoed into an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
