package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// printJSON writes m as indented protojson with every field shown, zero
// values included, so a script never has to guess what an absent key means.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	// protojson varies its whitespace on purpose; indent it the same way
	// every time.
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(w)
	return err
}

// printJSONLine writes m as one line of protojson (for watch: one event a
// line, for jq -c and friends).
func printJSONLine(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(w)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func row(tw io.Writer, cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }

// printScopes is one line per scope.
func printScopes(w io.Writer, scopes []*admissionv1.ScopeDescription) error {
	tw := newTable(w)
	row(tw, "SCOPE", "BACKEND", "LIVE CALLS", "LAST SUCCESS", "SOURCES")
	for _, s := range scopes {
		var src []string
		for _, st := range s.GetSources() {
			src = append(src, st.GetName()+"="+compactState(st.GetState(), st.GetOverride()))
		}
		row(tw, s.GetConfig().GetName(), s.GetBackend(), strconv.Itoa(int(s.GetLiveCalls())), lastSuccess(s.GetProgressAge()), strings.Join(src, " "))
	}
	return tw.Flush()
}

// printScope is describe's output: the scope's policies, then four tables
// of its sources (breaker; quota and pacer; line; configuration), every
// value shown, zeros included.
func printScope(w io.Writer, s *admissionv1.ScopeDescription) error {
	cfg := s.GetConfig()
	tw := newTable(w)
	row(tw, "scope", cfg.GetName())
	row(tw, "backend", s.GetBackend())
	row(tw, "live calls", strconv.Itoa(int(s.GetLiveCalls())))
	row(tw, "last success", lastSuccess(s.GetProgressAge()))
	if l := s.GetStateLoss(); l != nil { // a shared backend (Redis): what this replica saw of it losing the scope
		last := "never"
		if l.GetLast() != nil {
			last = l.GetLast().AsTime().UTC().Format(time.RFC3339)
		}
		row(tw, "state losses", fmt.Sprintf("%d, last %s, %d breakers re-asserted, re-assert pending %t", l.GetCount(), last, l.GetRestored(), l.GetReassertPending()))
	}
	row(tw, "on refusal", fmt.Sprintf("circuit_open %s, quota_full %s", onRefusal(cfg.GetCircuitOpen()), onRefusal(cfg.GetQuotaFull())))
	row(tw, "retry budget", fmt.Sprintf("max_attempts %d, backoff %s to %s", cfg.GetMaxAttempts(), dur(cfg.GetBackoffBase()), dur(cfg.GetBackoffMax())))
	row(tw, "stall budget", fmt.Sprintf("stall_window %s, poll_interval %s", dur(cfg.GetStallWindow()), dur(cfg.GetPollInterval())))
	row(tw, "lease grace", dur(cfg.GetLeaseGrace()))
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nBREAKERS")
	if err := printBreakers(w, s.GetSources()); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nQUOTA AND PACER")
	tw = newTable(w)
	row(tw, "SOURCE", "IN FLIGHT", "PACER CEILING", "RPM", "TPM", "COOLDOWN MEMO", "FAILED RECENTLY")
	for _, st := range s.GetSources() {
		c := st.GetConfig()
		row(tw, st.GetName(),
			fmt.Sprintf("%d/%d", st.GetInFlight(), c.GetMaxConcurrency()),
			strconv.Itoa(int(st.GetPacerCeiling())),
			used(st.GetRequestsLastMinute(), c.GetRpm()),
			used(st.GetTokensLastMinute(), c.GetTpm()),
			dur(st.GetCooldownMemo()),
			yesNo(st.GetFailedRecently()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nLINE")
	if err := printLines(w, s.GetSources()); err != nil {
		return err
	}

	if len(s.GetTenants()) > 0 {
		fmt.Fprintln(w, "\nTENANTS")
		if err := printTenants(w, s.GetTenants()); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nCONFIGURATION")
	tw = newTable(w)
	row(tw, "SOURCE", "PRIORITY", "WEIGHT", "TIMEOUT", "LEASE", "FAIL THRESHOLD", "MIN CALLS", "FAIL RATE", "WINDOW", "COOLDOWN", "MAX COOLDOWN", "PROBE TTL")
	for _, st := range s.GetSources() {
		c, b := st.GetConfig(), st.GetConfig().GetBreaker()
		ttl := dur(b.GetProbeTtl())
		if b.GetProbeTtlDerived() {
			ttl += " (derived)"
		}
		row(tw, st.GetName(), strconv.Itoa(int(c.GetPriority())), strconv.Itoa(int(c.GetWeight())), dur(c.GetTimeout()), dur(c.GetLease()),
			strconv.Itoa(int(b.GetFailThreshold())), strconv.Itoa(int(b.GetMinCalls())), strconv.FormatFloat(b.GetFailRate(), 'g', -1, 64),
			dur(b.GetWindow()), dur(b.GetCooldown()), dur(b.GetMaxCooldown()), ttl)
	}
	return tw.Flush()
}

// printBreakers is a table of breakers, then who set each override and why.
func printBreakers(w io.Writer, sources []*admissionv1.SourceState) error {
	tw := newTable(w)
	row(tw, "SOURCE", "STATE", "OPEN CAUSE", "NEXT ATTEMPT", "RETRY AFTER", "EPOCH", "REOPENS", "PROBE", "WINDOW CALLS", "WINDOW FAILURES", "CONSECUTIVE FAILURES", "OVERRIDE")
	for _, st := range sources {
		probe := "none"
		if st.GetProbeOut() {
			probe = "out, lease " + dur(st.GetProbeLeft())
		}
		next := "admitted"
		if st.GetReason() != admissionv1.Reason_REASON_UNSPECIFIED {
			next = "refused: " + enumName(st.GetReason().String(), "REASON_")
		}
		row(tw, st.GetName(), effectiveState(st.GetState(), st.GetOverride()), openCause(st.GetOpenCause()), next, dur(st.GetRetryAfter()),
			strconv.FormatUint(st.GetEpoch(), 10), strconv.Itoa(int(st.GetReopens())), probe,
			strconv.FormatInt(st.GetWindowCalls(), 10), strconv.FormatInt(st.GetWindowFailures(), 10),
			fmt.Sprintf("%d/%d", st.GetConsecutiveFailures(), st.GetConfig().GetBreaker().GetFailThreshold()),
			overrideName(st.GetOverride()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, st := range sources {
		if st.GetOverride() != admissionv1.Override_OVERRIDE_UNSPECIFIED {
			fmt.Fprintf(w, "override of %s: %s by %q: %q\n", st.GetName(), overrideName(st.GetOverride()),
				bounded(st.GetOverrideActor(), maxEchoLen), bounded(st.GetOverrideReason(), maxEchoLen))
		}
	}
	return nil
}

// printTenants is a table of the scope's tenants (~other: every tenant it
// does not name, together): their weight and priority ceiling, and each
// limit as use/limit, over all the scope's sources.
func printTenants(w io.Writer, tenants []*admissionv1.TenantState) error {
	tw := newTable(w)
	row(tw, "TENANT", "WEIGHT", "MAX PRIORITY", "LIVE CALLS", "IN FLIGHT", "RPM", "TPM", "TOKEN BUDGET", "NEXT PICK", "RETRY AFTER")
	for _, t := range tenants {
		c := t.GetConfig()
		budget := "none"
		if c.GetBudgetTokens() > 0 {
			budget = fmt.Sprintf("%d/%d per %s", t.GetBudgetUsed(), c.GetBudgetTokens(), dur(c.GetBudgetPer()))
		}
		next := "admitted"
		if t.GetReason() != admissionv1.Reason_REASON_UNSPECIFIED {
			next = "refused: " + enumName(t.GetReason().String(), "REASON_")
		}
		row(tw, bounded(t.GetName(), 64), strconv.Itoa(int(c.GetWeight())), strconv.Itoa(int(c.GetMaxPriority())),
			used(int64(t.GetLiveCalls()), int64(c.GetMaxLiveCalls())), used(int64(t.GetInFlight()), int64(c.GetMaxConcurrency())),
			used(t.GetRequestsLastMinute(), c.GetRpm()), used(t.GetTokensLastMinute(), c.GetTpm()), budget, next, dur(t.GetRetryAfter()))
	}
	return tw.Flush()
}

// maxGroups bounds the line's groups shown per source; --json has them all.
const maxGroups = 8

// printLines is a table of the callers waiting in line for each source's
// capacity: how many, the longest wait, and how many per priority and
// tenant (highest priority first, as the sidecar serves them).
func printLines(w io.Writer, sources []*admissionv1.SourceState) error {
	tw := newTable(w)
	row(tw, "SOURCE", "WAITING", "OLDEST WAIT", "BY PRIORITY/TENANT")
	for _, st := range sources {
		l := st.GetLine()
		groups := make([]string, 0, min(len(l.GetGroups()), maxGroups)+1)
		for i, g := range l.GetGroups() {
			if i == maxGroups {
				groups = append(groups, fmt.Sprintf("(%d more groups)", len(l.GetGroups())-maxGroups))
				break
			}
			tenant := bounded(g.GetTenant(), 64)
			if tenant == "" {
				tenant = "(default)"
			}
			groups = append(groups, fmt.Sprintf("%d/%s=%d", g.GetPriority(), tenant, g.GetWaiting()))
		}
		by := strings.Join(groups, " ")
		if by == "" {
			by = "none"
		}
		row(tw, st.GetName(), strconv.Itoa(int(l.GetLength())), dur(l.GetOldestWait()), by)
	}
	return tw.Flush()
}

// eventLine renders one event on one line: time, sequence, scope, what.
func eventLine(ev *admissionv1.WatchEventsResponse) string {
	scope := ev.GetScope()
	if scope == "" {
		scope = "*"
	}
	var what string
	switch e := ev.GetEvent().(type) {
	case *admissionv1.WatchEventsResponse_BreakerTransition:
		t := e.BreakerTransition
		what = fmt.Sprintf("breaker %s %s -> %s cause=%s epoch=%d reopens=%d", t.GetSource(),
			breakerState(t.GetFrom()), breakerState(t.GetTo()), enumName(t.GetCause().String(), "TRANSITION_CAUSE_"), t.GetEpoch(), t.GetReopens())
		if t.GetTo() == admissionv1.BreakerState_BREAKER_STATE_OPEN {
			what += " cooldown=" + dur(t.GetCooldown())
		}
	case *admissionv1.WatchEventsResponse_Probe:
		p := e.Probe
		what = fmt.Sprintf("probe %s %s epoch=%d permit=%s", p.GetSource(), enumName(p.GetKind().String(), "PROBE_EVENT_KIND_"), p.GetEpoch(), p.GetPermitId())
		if p.GetKind() == admissionv1.ProbeEventKind_PROBE_EVENT_KIND_SETTLED {
			what += fmt.Sprintf(" call=%s outcome=%s state=%s", p.GetCallId(), enumName(p.GetOutcome().String(), "OUTCOME_"), breakerState(p.GetState()))
		}
	case *admissionv1.WatchEventsResponse_StaleOutcome:
		s := e.StaleOutcome
		what = fmt.Sprintf("stale_outcome %s permit=%s epoch=%d state=%s", s.GetSource(), s.GetPermitId(), s.GetEpoch(), breakerState(s.GetState()))
	case *admissionv1.WatchEventsResponse_OverrideChanged:
		o := e.OverrideChanged
		action := "set" // a sidecar that does not name the action
		if o.GetAction() != admissionv1.OverrideAction_OVERRIDE_ACTION_UNSPECIFIED {
			action = enumName(o.GetAction().String(), "OVERRIDE_ACTION_")
		}
		what = fmt.Sprintf("override %s %s override=%s actor=%q reason=%q state=%s epoch=%d", o.GetSource(), action, overrideName(o.GetOverride()),
			bounded(o.GetActor(), maxEchoLen), bounded(o.GetReason(), maxEchoLen), breakerState(o.GetState()), o.GetEpoch())
	case *admissionv1.WatchEventsResponse_WaitStarted:
		ws := e.WaitStarted
		var reasons []string
		for _, r := range ws.GetPerSourceReasons() {
			reasons = append(reasons, fmt.Sprintf("%s:%s/%s", r.GetSource(), enumName(r.GetReason().String(), "REASON_"), dur(r.GetRetryAfter())))
		}
		what = fmt.Sprintf("wait_started call=%s sleep=%s gate_rejections=%d attempts=%d sources=%s", ws.GetCallId(), dur(ws.GetSleep()),
			ws.GetGateRejections(), ws.GetAttempts(), strings.Join(reasons, ","))
	case *admissionv1.WatchEventsResponse_BackendHealth:
		h := e.BackendHealth
		state := "recovered"
		if h.GetDegraded() {
			state = "degraded"
		}
		what = fmt.Sprintf("backend %s %s detail=%q", h.GetBackend(), state, bounded(h.GetDetail(), maxEchoLen))
	default:
		what = "unknown event (a newer sidecar; --json shows it)"
	}
	line := fmt.Sprintf("%s #%d %s %s", ev.GetTime().AsTime().UTC().Format("2006-01-02T15:04:05.000Z07:00"), ev.GetSequence(), scope, what)
	if ev.GetDropped() > 0 {
		line += fmt.Sprintf(" (this watcher lost %d events before this one)", ev.GetDropped())
	}
	return line
}

// dur shows a duration rounded to the millisecond; unset reads "0s".
func dur(d *durationpb.Duration) string {
	v := d.AsDuration() // saturates on overflow
	if v >= time.Millisecond || v <= -time.Millisecond {
		v = v.Round(time.Millisecond)
	}
	return v.String()
}

func lastSuccess(age *durationpb.Duration) string {
	if age == nil {
		return "never"
	}
	return dur(age) + " ago"
}

// used is "in use/limit", with a limit of 0 shown as what it means.
func used(n, limit int64) string {
	if limit == 0 {
		return strconv.FormatInt(n, 10) + "/no limit"
	}
	return strconv.FormatInt(n, 10) + "/" + strconv.FormatInt(limit, 10)
}

func enumName(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

func breakerState(s admissionv1.BreakerState) string {
	return strings.TrimPrefix(s.String(), "BREAKER_STATE_")
}

// openCause is why an OPEN breaker opened; "none" when it is not OPEN.
func openCause(c admissionv1.OpenCause) string {
	if c == admissionv1.OpenCause_OPEN_CAUSE_UNSPECIFIED {
		return "none"
	}
	return enumName(c.String(), "OPEN_CAUSE_")
}

func onRefusal(r admissionv1.OnRefusal) string { return enumName(r.String(), "ON_REFUSAL_") }

func overrideName(o admissionv1.Override) string {
	if o == admissionv1.Override_OVERRIDE_UNSPECIFIED {
		return "none"
	}
	return enumName(o.String(), "OVERRIDE_")
}

// effectiveState is what the breaker does now, an operator's override
// first: "OPEN (forced)" refuses every attempt whatever the automatic state,
// "OPEN (forced; breaker CLOSED)" says what clearing it would leave.
func effectiveState(s admissionv1.BreakerState, o admissionv1.Override) string {
	auto := breakerState(s)
	does, ok := overrideDoes[o]
	switch {
	case !ok:
		return auto
	case does == auto:
		return does + " (forced)"
	case o == admissionv1.Override_OVERRIDE_DISABLED:
		return does + " (breaker " + auto + ")"
	}
	return does + " (forced; breaker " + auto + ")"
}

// compactState is effectiveState without spaces, for one-line lists.
func compactState(s admissionv1.BreakerState, o admissionv1.Override) string {
	does, ok := overrideDoes[o]
	switch {
	case !ok:
		return breakerState(s)
	case o == admissionv1.Override_OVERRIDE_DISABLED:
		return does
	}
	return does + "(forced)"
}

// overrideDoes is the state each override makes a breaker act as.
var overrideDoes = map[admissionv1.Override]string{
	admissionv1.Override_OVERRIDE_FORCED_OPEN:   "OPEN",
	admissionv1.Override_OVERRIDE_FORCED_CLOSED: "CLOSED",
	admissionv1.Override_OVERRIDE_DISABLED:      "DISABLED",
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
