package redisgate

import (
	"fmt"

	"github.com/polygate/polygate/gate"
)

// The Backend's answers, read from lua/ops.lua's replies. Every breaker a
// reply shows is remembered, to be re-asserted if Redis loses it (loss.go).

// admission reads an admit's reply. unmarked, when set, is the marker
// Redis holds: the admit granted nothing (loss.go).
func (b *Backend) admission(req *gate.AdmitRequest, v any) (out gate.Admission, unmarked *string, err error) {
	if err := opError(v); err != nil {
		return out, nil, err
	}
	c := reading("admit", v)
	switch c.num("kind", 0, 2) {
	case 1:
		marker := c.str("marker")
		return out, &marker, c.err
	case 2:
		return out, nil, fmt.Errorf("redisgate: admit: permit %.64q was given back before it was admitted", req.PermitID)
	}
	n := int64(len(req.Candidates))
	source := func(i int64) string {
		if i < 1 || i > n {
			c.fail("candidate %d outside 1..%d", i, n)
			return ""
		}
		return req.Candidates[i-1].Source.Name
	}
	granted, probe, epoch := c.num("granted", 0, n), c.num("probe", 0, 1), c.count("epoch")
	progress, now := c.time("progress"), c.time("now")
	var held gate.Breaker
	if granted != 0 {
		c.notable(&held)
	}
	if places := c.num("places", 0, n); places != 0 {
		if places != n {
			c.fail("%d places for %d candidates", places, n)
		}
		for i := range places {
			if p := c.str("place"); p != "" && c.err == nil {
				if out.Places == nil {
					out.Places = map[string]string{}
				}
				out.Places[req.Candidates[i].Source.Name] = p
			}
		}
	}
	last := int64(0)
	for c.more() {
		if c.num("group", groupRejection, groupEvent) == groupEvent {
			out.Events = append(out.Events, c.event(source))
			continue
		}
		i := c.num("candidate", 1, n)
		rj := gate.Rejection{Reason: cenum(c, "reason", gate.ReasonTenantBudget), RetryAfter: gate.Millis(c.count("retry"))}
		switch {
		case c.err != nil:
			continue
		case i <= last:
			c.fail("a rejection of candidate %d after one of candidate %d", i, last)
		case granted != 0 && i >= granted:
			c.fail("a rejection of candidate %d, at or after candidate %d granted", i, granted)
		case rj.Reason == gate.ReasonNone:
			c.fail("a rejection without a reason")
		}
		last = i
		src := req.Candidates[i-1].Source
		var br gate.Breaker
		c.notable(&br)
		if c.err == nil {
			rj.Source = src.Name
			out.Rejections = append(out.Rejections, rj)
			b.loss.see(req.Scope, src.Name, br, now)
		}
	}
	if c.done(); c.err != nil {
		return gate.Admission{}, nil, c.err
	}
	out.ProgressAge = progressAge(progress, now)
	if granted != 0 {
		src := req.Candidates[granted-1].Source
		b.loss.see(req.Scope, src.Name, held, now)
		out.Granted = true
		out.Permit = gate.Permit{ID: req.PermitID, Source: src.Name, Probe: probe == 1, Epoch: uint64(epoch),
			Tokens: req.Tokens, Lease: src.Limits.Lease}
	}
	b.loss.heard(req.Scope, out.Events)
	return out, nil, nil
}

// settlement reads a settle's reply (lua/ops.lua's settle_op).
func (b *Backend) settlement(req *gate.SettleRequest, v any) (gate.Settlement, error) {
	if err := opError(v); err != nil {
		return gate.Settlement{}, err
	}
	c := reading("settle", v)
	out := gate.Settlement{Released: c.num("released", 0, 1) == 1, Effect: cenum(c, "effect", gate.EffectIgnored)}
	progress, now := c.time("progress"), c.time("now")
	out.ProgressAge, out.Handoff = progressAge(progress, now), c.str("handoff")
	marker := c.str("marker")
	br, view := c.breaker(req.Source.Breaker, now)
	out.Breaker = view
	out.Events = c.events(func(int64) string { return req.Source.Name })
	if c.done(); c.err != nil {
		return gate.Settlement{}, c.err
	}
	if b.loss.marked(req.Scope, marker) {
		b.loss.see(req.Scope, req.Source.Name, br, now)
	}
	return out, nil
}

// snapshot reads a peek's reply (lua/ops.lua's peek).
func (b *Backend) snapshot(req *gate.PeekRequest, v any) (gate.Snapshot, error) {
	if err := opError(v); err != nil {
		return gate.Snapshot{}, err
	}
	c := reading("peek", v)
	progress, now, marker := c.time("progress"), c.time("now"), c.str("marker")
	out := gate.Snapshot{Sources: make([]gate.SourceView, 0, len(req.Sources)), ProgressAge: progressAge(progress, now)}
	brs := make([]gate.Breaker, len(req.Sources))
	for i, src := range req.Sources {
		sv := gate.SourceView{Source: src.Name}
		brs[i], sv.Breaker = c.breaker(src.Breaker, now)
		sv.Quota = c.quota()
		sv.Verdict = gate.Rejection{Source: src.Name, Reason: cenum(c, "reason", gate.ReasonTenantBudget), RetryAfter: gate.Millis(c.count("retry"))}
		if sv.Verdict.Reason == gate.ReasonNone {
			// The quota would admit: the breaker's verdict.
			sv.Verdict.Reason, sv.Verdict.RetryAfter = sv.Breaker.Reason, sv.Breaker.RetryAfter
		}
		if req.Line != nil {
			sv.Line = c.line()
		}
		out.Sources = append(out.Sources, sv)
	}
	for _, tc := range req.Tenants {
		v := gate.TenantView{Tenant: tc.Name, Quota: c.quota(), BudgetUsed: c.count("budget_used")}
		v.Verdict = gate.Rejection{Reason: cenum(c, "reason", gate.ReasonTenantBudget), RetryAfter: gate.Millis(c.count("retry"))}
		out.Tenants = append(out.Tenants, v)
	}
	if c.done(); c.err != nil {
		return gate.Snapshot{}, c.err
	}
	if b.loss.marked(req.Scope, marker) {
		for i, s := range req.Sources {
			b.loss.see(req.Scope, s.Name, brs[i], now)
		}
	}
	return out, nil
}

// overridden reads an override's reply (lua/ops.lua's override).
func (b *Backend) overridden(req *gate.OverrideRequest, v any) (gate.OverrideResult, error) {
	if err := opError(v); err != nil {
		return gate.OverrideResult{}, err
	}
	c := reading("override", v)
	now, marker := c.time("now"), c.str("marker")
	out := gate.OverrideResult{View: gate.SourceView{Source: req.Source.Name}}
	br, view := c.breaker(req.Source.Breaker, now)
	out.View.Breaker, out.View.Quota = view, c.quota()
	out.Events = c.events(func(int64) string { return req.Source.Name })
	if c.done(); c.err != nil {
		return gate.OverrideResult{}, c.err
	}
	if b.loss.marked(req.Scope, marker) {
		b.loss.see(req.Scope, req.Source.Name, br, now)
	}
	return out, nil
}
