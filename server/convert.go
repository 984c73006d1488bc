package server

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
)

// dur is d as a message; zero durations, the most common in answers (a
// closed breaker's waits), share one (shared, as below).
func dur(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return zeroDur
	}
	return durationpb.New(d)
}

var zeroDur = durationpb.New(0)

// A Grant's lease and timeout are, grant after grant, the same few
// durations; each of these keeps the last one it made, and grants share it
// instead of allocating a message per field. Answers are only ever
// marshaled (read), which protobuf allows concurrently.
var leases, timeouts durs

// durs is a duration message that repeats.
type durs struct {
	last atomic.Pointer[durationpb.Duration]
}

func (c *durs) of(d time.Duration) *durationpb.Duration {
	if m := c.last.Load(); m != nil && m.AsDuration() == d {
		return m
	}
	m := dur(d)
	c.last.Store(m)
	return m
}

// doneNext is the Next of every RecordOutcome answer that ends its call Done
// (shared, as above).
var doneNext = &admissionv1.RecordOutcomeResponse_Done{Done: &admissionv1.Done{}}

var reasons = map[gate.Reason]admissionv1.Reason{
	gate.ReasonCooldown:      admissionv1.Reason_REASON_COOLDOWN,
	gate.ReasonCircuitOpen:   admissionv1.Reason_REASON_CIRCUIT_OPEN,
	gate.ReasonProbeInFlight: admissionv1.Reason_REASON_PROBE_IN_FLIGHT,
	gate.ReasonForcedOpen:    admissionv1.Reason_REASON_FORCED_OPEN,
	gate.ReasonAdaptivePaced: admissionv1.Reason_REASON_ADAPTIVE_PACED,
	gate.ReasonRateLimited:   admissionv1.Reason_REASON_RATE_LIMITED,
	gate.ReasonQueued:        admissionv1.Reason_REASON_QUEUED,
	gate.ReasonTenantLimit:   admissionv1.Reason_REASON_TENANT_LIMIT,
	gate.ReasonTenantBudget:  admissionv1.Reason_REASON_TENANT_BUDGET,
}

var failureReasons = map[policy.FailureReason]admissionv1.FailureReason{
	policy.FailCircuitOpen:       admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN,
	policy.FailQuotaExhausted:    admissionv1.FailureReason_FAILURE_REASON_QUOTA_EXHAUSTED,
	policy.FailStalled:           admissionv1.FailureReason_FAILURE_REASON_STALLED,
	policy.FailRetryExhausted:    admissionv1.FailureReason_FAILURE_REASON_RETRY_EXHAUSTED,
	policy.FailNonRetryable:      admissionv1.FailureReason_FAILURE_REASON_NON_RETRYABLE,
	policy.FailDeadlineExceeded:  admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED,
	policy.FailCancelled:         admissionv1.FailureReason_FAILURE_REASON_CANCELLED,
	policy.FailRetryAfterTooLong: admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG,
	policy.FailSourceDead:        admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD,
	policy.FailScopeRemoved:      admissionv1.FailureReason_FAILURE_REASON_SCOPE_REMOVED,
	policy.FailBudgetExhausted:   admissionv1.FailureReason_FAILURE_REASON_BUDGET_EXHAUSTED,
}

var openCauses = map[gate.OpenCause]admissionv1.OpenCause{
	gate.OpenCauseNone:       admissionv1.OpenCause_OPEN_CAUSE_UNSPECIFIED,
	gate.OpenCauseFailures:   admissionv1.OpenCause_OPEN_CAUSE_FAILURES,
	gate.OpenCauseSourceDead: admissionv1.OpenCause_OPEN_CAUSE_SOURCE_DEAD,
	gate.OpenCauseForced:     admissionv1.OpenCause_OPEN_CAUSE_FORCED,
}

var states = map[gate.State]admissionv1.BreakerState{
	gate.Closed:   admissionv1.BreakerState_BREAKER_STATE_CLOSED,
	gate.Open:     admissionv1.BreakerState_BREAKER_STATE_OPEN,
	gate.HalfOpen: admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN,
}

var overrides = map[gate.Override]admissionv1.Override{
	gate.NoOverride:   admissionv1.Override_OVERRIDE_UNSPECIFIED,
	gate.ForcedOpen:   admissionv1.Override_OVERRIDE_FORCED_OPEN,
	gate.ForcedClosed: admissionv1.Override_OVERRIDE_FORCED_CLOSED,
	gate.Disabled:     admissionv1.Override_OVERRIDE_DISABLED,
}

var effects = map[gate.Effect]admissionv1.OutcomeEffect{
	gate.EffectApplied:   admissionv1.OutcomeEffect_OUTCOME_EFFECT_APPLIED,
	gate.EffectNoVerdict: admissionv1.OutcomeEffect_OUTCOME_EFFECT_NO_VERDICT,
	gate.EffectStale:     admissionv1.OutcomeEffect_OUTCOME_EFFECT_STALE,
	gate.EffectIgnored:   admissionv1.OutcomeEffect_OUTCOME_EFFECT_IGNORED,
}

var outcomes = map[admissionv1.Outcome]policy.Outcome{
	admissionv1.Outcome_OUTCOME_SUCCESS:      policy.Success,
	admissionv1.Outcome_OUTCOME_TRANSIENT:    policy.Transient,
	admissionv1.Outcome_OUTCOME_RATE_LIMITED: policy.RateLimited,
	admissionv1.Outcome_OUTCOME_SOURCE_DEAD:  policy.SourceDead,
	admissionv1.Outcome_OUTCOME_CLIENT_ERROR: policy.ClientError,
	admissionv1.Outcome_OUTCOME_CANCELLED:    policy.Cancelled,
}

var actions = map[admissionv1.OverrideAction]gate.Action{
	admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN:   gate.ActionForceOpen,
	admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_CLOSED: gate.ActionForceClosed,
	admissionv1.OverrideAction_OVERRIDE_ACTION_DISABLE:      gate.ActionDisable,
	admissionv1.OverrideAction_OVERRIDE_ACTION_CLEAR:        gate.ActionClear,
	admissionv1.OverrideAction_OVERRIDE_ACTION_RESET:        gate.ActionReset,
}

// actionNames is actions the other way round, for OverrideChanged events.
var actionNames = func() map[gate.Action]admissionv1.OverrideAction {
	m := make(map[gate.Action]admissionv1.OverrideAction, len(actions))
	for k, v := range actions {
		m[v] = k
	}
	return m
}()

var onRefusal = map[config.OnRefusal]admissionv1.OnRefusal{
	config.FailFast: admissionv1.OnRefusal_ON_REFUSAL_FAIL_FAST,
	config.Wait:     admissionv1.OnRefusal_ON_REFUSAL_WAIT,
}

func sourceReasons(rs []gate.Rejection) []*admissionv1.SourceReason {
	out := make([]*admissionv1.SourceReason, len(rs))
	for i, r := range rs {
		out[i] = &admissionv1.SourceReason{Source: r.Source, Reason: reasons[r.Reason], RetryAfter: dur(r.RetryAfter)}
	}
	return out
}

func failure(f *policy.Failure) *admissionv1.Failure {
	return &admissionv1.Failure{Reason: failureReasons[f.Reason], RetryAfter: dur(f.RetryAfter), PerSourceReasons: sourceReasons(f.Sources)}
}

func pickResponse(callID string, p policy.Pick) *admissionv1.PickResponse {
	resp := &admissionv1.PickResponse{CallId: callID}
	switch {
	case p.Grant != nil:
		g := p.Grant
		resp.Result = &admissionv1.PickResponse_Grant{Grant: &admissionv1.Grant{
			Source: g.Source.Name, Attributes: g.Source.Attributes, PermitId: g.Permit.ID,
			Lease: leases.of(g.Permit.Lease), Timeout: timeouts.of(g.Source.Timeout), Probe: g.Permit.Probe,
			Epoch: g.Permit.Epoch, Attempt: int32(g.Attempt), Skipped: sourceReasons(g.Skipped),
			Shadow: g.Shadow, ShadowRefusals: sourceReasons(g.ShadowRefusals),
		}}
	case p.NoRunnable != nil:
		resp.Result = &admissionv1.PickResponse_NoRunnable{NoRunnable: &admissionv1.NoRunnable{
			GateRejections: int32(p.NoRunnable.GateRejections), PerSourceReasons: sourceReasons(p.NoRunnable.Sources),
		}}
	default:
		resp.Result = &admissionv1.PickResponse_Failure{Failure: failure(p.Failure)}
	}
	return resp
}

func decisionResponse(d policy.Decision) *admissionv1.OnNoRunnableResponse {
	if d.Failure != nil {
		return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Failure{Failure: failure(d.Failure)}}
	}
	return &admissionv1.OnNoRunnableResponse{Decision: &admissionv1.OnNoRunnableResponse_Wait{Wait: &admissionv1.Wait{
		Sleep: dur(d.Sleep), Slept: dur(d.Slept), Woken: d.Woken,
	}}}
}

func recordResponse(r policy.Recorded) *admissionv1.RecordOutcomeResponse {
	resp := &admissionv1.RecordOutcomeResponse{Effect: effects[r.Effect], BreakerState: states[r.Breaker.State]}
	switch {
	case r.Next.Done:
		resp.Next = doneNext
	case r.Next.Retry != nil:
		resp.Next = &admissionv1.RecordOutcomeResponse_Retry{Retry: &admissionv1.Retry{Backoff: dur(*r.Next.Retry)}}
	default:
		resp.Next = &admissionv1.RecordOutcomeResponse_Failure{Failure: failure(r.Next.Failure)}
	}
	return resp
}

// sourceState converts a backend's view of a source; local is what this
// sidecar knows besides (nil when only the backend's view is at hand), confs
// the configuration's messages made already.
func sourceState(v gate.SourceView, local *policy.SourceState, cfg *config.Scope, confs sourceConfigs) *admissionv1.SourceState {
	out := viewState(v, local)
	if src := cfg.Source(v.Source); src != nil {
		out.Config = confs.of(src, cfg.LeaseGrace).msg
	}
	return out
}

// viewState is sourceState without the configuration.
func viewState(v gate.SourceView, local *policy.SourceState) *admissionv1.SourceState {
	b := v.Breaker
	out := &admissionv1.SourceState{
		Name: v.Source, State: states[b.State], Reason: reasons[b.Reason], RetryAfter: dur(b.RetryAfter),
		Epoch: b.Epoch, Reopens: int32(b.Reopens), ProbeOut: b.ProbeOut, ProbeLeft: dur(b.ProbeLeft),
		WindowCalls: b.Calls, WindowFailures: b.Fails, ConsecutiveFailures: int32(b.Consecutive),
		Override: overrides[b.Override], OverrideActor: b.Actor, OverrideReason: b.Why,
		InFlight: int32(v.Quota.InFlight), RequestsLastMinute: v.Quota.Requests, TokensLastMinute: v.Quota.Tokens,
		OpenCause: openCauses[b.Cause],
	}
	if local != nil {
		out.PacerCeiling = int32(local.Ceiling)
		out.CooldownMemo = dur(local.Memo)
		out.FailedRecently = local.FailedRecently
	}
	return out
}

// sourceConfigs are the SourceConfig messages of one configuration's
// sources, made when it is applied and shared by every answer that shows
// one (as above), instead of a message and eight durations per source and
// answer.
type sourceConfigs map[*config.Source]sourceConfigMsg

// sourceConfigMsg is a source's configuration as a message, and as the
// SourceState field that carries it, encoded.
type sourceConfigMsg struct {
	msg   *admissionv1.SourceConfig
	field []byte
}

func newSourceConfigs(cfg *config.Config) sourceConfigs {
	m := make(sourceConfigs)
	for _, sc := range cfg.Scopes {
		for i := range sc.Sources {
			m[&sc.Sources[i]] = newSourceConfigMsg(sourceConfig(&sc.Sources[i], sc.LeaseGrace))
		}
	}
	return m
}

// configField is SourceState's field number of its configuration.
var configField = (&admissionv1.SourceState{}).ProtoReflect().Descriptor().Fields().ByName("config").Number()

func newSourceConfigMsg(c *admissionv1.SourceConfig) sourceConfigMsg {
	b, err := proto.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("server: a source's configuration does not encode: %v", err)) // cannot happen: it holds numbers and valid strings
	}
	f := protowire.AppendBytes(protowire.AppendTag(nil, configField, protowire.BytesType), b)
	return sourceConfigMsg{msg: c, field: f[:len(f):len(f)]} // shared: no spare capacity to append into
}

// of is src's configuration: made already when src is of the configuration
// m was made of, else (a removed scope's, or one read across a reload) made
// now.
func (m sourceConfigs) of(src *config.Source, grace time.Duration) sourceConfigMsg {
	if c, ok := m[src]; ok {
		return c
	}
	return newSourceConfigMsg(sourceConfig(src, grace))
}

// encodedSourceState is sourceState for an answer that is only sent (a
// RetryAfter's): its configuration goes as the bytes encoded when the
// configuration was applied, set as the message's unknown fields, which the
// marshaling copies as they are; a client decodes them as the config field
// (field order does not matter on the wire). Encoding the message each time
// was a third of the answer's marshaling (1.3 µs of 2.1 µs for one source).
// In this process, the message reads as having no config.
func encodedSourceState(v gate.SourceView, cfg *config.Scope, confs sourceConfigs) *admissionv1.SourceState {
	out := viewState(v, nil)
	if src := cfg.Source(v.Source); src != nil {
		out.ProtoReflect().SetUnknown(confs.of(src, cfg.LeaseGrace).field)
	}
	return out
}

func sourceConfig(s *config.Source, grace time.Duration) *admissionv1.SourceConfig {
	b := s.Breaker
	return &admissionv1.SourceConfig{
		Priority: int32(s.Priority), Weight: int32(s.Weight), MaxConcurrency: int32(s.MaxConcurrency),
		Rpm: s.RPM, Tpm: s.TPM, Timeout: dur(s.Timeout), Lease: dur(s.Lease(grace)), Attributes: s.Attributes,
		Breaker: &admissionv1.BreakerConfig{
			FailThreshold: int32(b.FailThreshold), MinCalls: int32(b.MinCalls), FailRate: b.FailRate,
			Window: dur(b.Window), Cooldown: dur(b.Cooldown), MaxCooldown: dur(b.MaxCooldown),
			ProbeTtl: dur(b.ProbeTTL), ProbeTtlDerived: s.ProbeTTLDerived,
		},
	}
}

func scopeConfig(c *config.Scope) *admissionv1.ScopeConfig {
	return &admissionv1.ScopeConfig{
		Name: c.Name, CircuitOpen: onRefusal[c.CircuitOpen], QuotaFull: onRefusal[c.QuotaFull],
		MaxAttempts: int32(c.MaxAttempts), BackoffBase: dur(c.BackoffBase), BackoffMax: dur(c.BackoffMax),
		StallWindow: dur(c.StallWindow), PollInterval: dur(c.PollInterval), LeaseGrace: dur(c.LeaseGrace),
		MaxRetryAfter: dur(c.MaxRetryAfter), SourceDead: onRefusal[c.SourceDead], Mode: modes[c.Mode], Tenants: tenantWeights(c.Tenants),
		DefaultTenantWeight: int32(c.DefaultTenant.Weight), MaxTenants: int32(c.MaxTenants), PriorityAging: dur(c.PriorityAging),
	}
}

var modes = map[config.Mode]admissionv1.ScopeMode{
	config.Enforce: admissionv1.ScopeMode_SCOPE_MODE_ENFORCE,
	config.Shadow:  admissionv1.ScopeMode_SCOPE_MODE_SHADOW,
}

func tenantWeights(ts map[string]config.Tenant) map[string]int32 {
	if len(ts) == 0 {
		return nil
	}
	out := make(map[string]int32, len(ts))
	for name, t := range ts {
		out[name] = int32(t.Weight)
	}
	return out
}

// tenantStates are a describe's tenants, with the calls this sidecar holds
// open for each (live, index by index).
func tenantStates(ts []policy.TenantState, live []int) []*admissionv1.TenantState {
	out := make([]*admissionv1.TenantState, len(ts))
	for i, t := range ts {
		c, v := t.Config, t.View
		st := &admissionv1.TenantState{
			Name: t.Name,
			Config: &admissionv1.TenantConfig{
				Weight: int32(c.Weight), MaxPriority: c.MaxPriority, Rpm: c.RPM, Tpm: c.TPM,
				MaxConcurrency: int32(min(c.MaxConcurrency, math.MaxInt32)), MaxLiveCalls: int32(min(c.MaxLiveCalls, math.MaxInt32)),
				BudgetTokens: c.Budget,
			},
			InFlight: int32(min(v.Quota.InFlight, math.MaxInt32)), RequestsLastMinute: v.Quota.Requests, TokensLastMinute: v.Quota.Tokens,
			BudgetUsed: v.BudgetUsed, Reason: reasons[v.Verdict.Reason], RetryAfter: dur(v.Verdict.RetryAfter),
		}
		if c.Budget > 0 {
			st.Config.BudgetPer = dur(c.BudgetPer)
		}
		if i < len(live) {
			st.LiveCalls = int32(min(live[i], math.MaxInt32))
		}
		out[i] = st
	}
	return out
}

func sourceLine(l policy.LineState) *admissionv1.SourceLine {
	out := &admissionv1.SourceLine{Length: int32(l.Length), OldestWait: dur(l.OldestWait)}
	for _, g := range l.Groups {
		out.Groups = append(out.Groups, &admissionv1.LineGroup{Priority: g.Priority, Tenant: g.Tenant, Waiting: int32(g.Waiting)})
	}
	return out
}

func stateLoss(l gate.StateLoss) *admissionv1.StateLoss {
	out := &admissionv1.StateLoss{Count: l.Count, Restored: int32(min(l.Restored, math.MaxInt32)), ReassertPending: l.Pending}
	if l.Count > 0 {
		out.Last = timestamppb.New(l.Last)
	}
	return out
}

func scopeDescription(d policy.Description, live int, tenantsLive []int, backend string, confs sourceConfigs) *admissionv1.ScopeDescription {
	out := &admissionv1.ScopeDescription{Config: scopeConfig(d.Config), LiveCalls: int32(live), Backend: backend, Tenants: tenantStates(d.Tenants, tenantsLive)}
	if d.ProgressAge != gate.Never {
		out.ProgressAge = dur(d.ProgressAge)
	}
	for i := range d.Sources {
		st := sourceState(d.Sources[i].View, &d.Sources[i], d.Config, confs)
		st.Line = sourceLine(d.Sources[i].Line)
		out.Sources = append(out.Sources, st)
	}
	return out
}
