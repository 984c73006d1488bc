package server

import (
	"context"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
)

// Pick implements admissionv1.AdmissionServiceServer.
func (s *Server) Pick(ctx context.Context, req *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	sc, err := s.Scope(req.GetScope())
	if err != nil {
		return nil, err
	}
	tenant, err := callerTenant(ctx, req.GetTenant())
	if err != nil {
		return nil, err
	}
	var sess *session
	opening := req.GetCallId() == ""
	if opening {
		cfg := sc.Config()
		t, _ := cfg.Tenant(tenant)
		sess, err = s.calls.open(sc.Name(), tenant, cfg.Priority(tenant, req.GetPriority()), req.GetEstimatedTokens(),
			req.GetDeadline().AsDuration(), liveCap{max: t.MaxLiveCalls, named: cfg.Tenants})
	} else {
		sess, err = s.acquire(ctx, req.GetCallId(), sc.Name())
	}
	if err != nil {
		return nil, err
	}
	p, err := sc.Pick(ctx, sess.call)
	if err != nil && opening {
		s.calls.discard(sess) // the caller never learns the call's id
		return nil, err
	}
	s.calls.release(sess)
	if err != nil {
		return nil, err
	}
	resp := pickResponse(sess.call.ID, p)
	if g := p.Grant; g != nil && g.ShadowError != nil {
		resp.GetGrant().ShadowError = reasonOf(ctx, s.log, g.ShadowError)
	}
	return resp, nil
}

// OnNoRunnable implements admissionv1.AdmissionServiceServer.
func (s *Server) OnNoRunnable(ctx context.Context, req *admissionv1.OnNoRunnableRequest) (*admissionv1.OnNoRunnableResponse, error) {
	sc, sess, removed, err := s.call(ctx, req.GetScope(), req.GetCallId())
	if err != nil {
		return nil, err
	}
	defer s.calls.release(sess)
	if !removed { // a removed scope's answers scope_removed at once
		s.waits.hold(sc.Name())
		defer s.waits.unhold(sc.Name())
	}
	d, err := sc.OnNoRunnable(ctx, sess.call)
	if err != nil {
		return nil, err
	}
	return decisionResponse(d), nil
}

// RecordOutcome implements admissionv1.AdmissionServiceServer.
func (s *Server) RecordOutcome(ctx context.Context, req *admissionv1.RecordOutcomeRequest) (*admissionv1.RecordOutcomeResponse, error) {
	sc, sess, removed, err := s.call(ctx, req.GetScope(), req.GetCallId())
	if err != nil {
		return nil, err
	}
	defer s.calls.release(sess)
	actual := int64(-1)
	if req.ActualTokens != nil {
		actual = req.GetActualTokens()
	}
	record := sc.RecordOutcome
	if removed {
		record = sc.RecordRemoved
	}
	r, err := record(ctx, sess.call, policy.Attempt{
		PermitID: req.GetPermitId(), Outcome: outcomes[req.GetOutcome()], RetryAfter: req.GetRetryAfterHint().AsDuration(),
		ActualTokens: actual, HTTPStatus: int(req.GetHttpStatus()), Detail: req.GetDetail(),
	})
	if err != nil {
		return nil, err
	}
	return recordResponse(r), nil
}

// CancelCall implements admissionv1.AdmissionServiceServer.
func (s *Server) CancelCall(ctx context.Context, req *admissionv1.CancelCallRequest) (*admissionv1.CancelCallResponse, error) {
	sc, sess, _, err := s.call(ctx, req.GetScope(), req.GetCallId())
	if err != nil {
		return nil, err
	}
	defer s.calls.release(sess)
	ended, settled, err := sc.Cancel(ctx, sess.call)
	if err != nil {
		return nil, err
	}
	if ended && !settled {
		s.abandon([]*policy.Call{sess.call}, AbandonCancelled)
	}
	return &admissionv1.CancelCallResponse{EndedNow: ended}, nil
}

// call finds an open call of a scope, served or removed by a reload
// (removed reports the latter).
func (s *Server) call(ctx context.Context, scope, id string) (sc *policy.Scope, sess *session, removed bool, err error) {
	sc, removed, err = s.scopeOrRemoved(scope)
	if err != nil {
		return nil, nil, false, err
	}
	sess, err = s.acquire(ctx, id, sc.Name())
	return sc, sess, removed, err
}

// acquire holds an open call of a scope busy for one RPC, when the caller
// may act on it: a credential that names a tenant acts on its tenant's
// calls only.
func (s *Server) acquire(ctx context.Context, id, scope string) (*session, error) {
	sess, err := s.calls.acquire(id, scope)
	if err != nil {
		return nil, err
	}
	if own := credentialTenant(ctx); own != "" && own != sess.call.Tenant {
		s.calls.release(sess)
		return nil, &tenantError{err: errTenantMismatch, tenant: own, requested: sess.call.Tenant, by: "the call " + clip(id)}
	}
	return sess, nil
}

// scopeOrRemoved is the named scope, or the removed scope of that name whose
// calls may still end (removed reports the latter).
func (s *Server) scopeOrRemoved(name string) (sc *policy.Scope, removed bool, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if sc, ok := s.scopes[name]; ok {
		return sc, false, nil
	}
	if sc, ok := s.removed[name]; ok {
		return sc, true, nil
	}
	return nil, false, errorf(errUnknownScope, "%s", clip(name))
}

// RetryAfter implements admissionv1.AdmissionServiceServer.
func (s *Server) RetryAfter(ctx context.Context, req *admissionv1.RetryAfterRequest) (*admissionv1.RetryAfterResponse, error) {
	sc, err := s.Scope(req.GetScope())
	if err != nil {
		return nil, err
	}
	if err := checkSources(req.GetSources(), len(sc.Config().Sources)); err != nil {
		return nil, err
	}
	least, views, err := sc.RetryAfter(ctx, req.GetSources())
	if err != nil {
		return nil, err
	}
	resp := &admissionv1.RetryAfterResponse{RetryAfter: dur(least), Sources: make([]*admissionv1.SourceState, len(views))}
	cfg, confs := sc.Config(), *s.confs.Load()
	for i, v := range views {
		resp.Sources[i] = encodedSourceState(v, cfg, confs)
	}
	return resp, nil
}

// DescribeScope implements admissionv1.AdmissionServiceServer.
func (s *Server) DescribeScope(ctx context.Context, req *admissionv1.DescribeScopeRequest) (*admissionv1.DescribeScopeResponse, error) {
	sc, err := s.Scope(req.GetScope())
	if err != nil {
		return nil, err
	}
	d, err := s.describe(ctx, sc)
	if err != nil {
		return nil, err
	}
	return &admissionv1.DescribeScopeResponse{Scope: d}, nil
}

func (s *Server) describe(ctx context.Context, sc *policy.Scope) (*admissionv1.ScopeDescription, error) {
	d, err := sc.Describe(ctx)
	if err != nil {
		return nil, err
	}
	out := scopeDescription(d, s.calls.liveIn(sc.Name()), s.TenantLiveCalls(sc.Name(), d), s.backendName(), *s.confs.Load())
	if s.stateLoss != nil {
		out.StateLoss = stateLoss(s.stateLoss(sc.Name()))
	}
	return out, nil
}

// ListScopes implements admissionv1.AdmissionServiceServer.
func (s *Server) ListScopes(ctx context.Context, _ *admissionv1.ListScopesRequest) (*admissionv1.ListScopesResponse, error) {
	resp := &admissionv1.ListScopesResponse{}
	for _, name := range s.Scopes() {
		sc, err := s.Scope(name)
		if err != nil {
			continue // removed by a reload meanwhile
		}
		d, err := s.describe(ctx, sc)
		if err != nil {
			return nil, err
		}
		resp.Scopes = append(resp.Scopes, d)
	}
	return resp, nil
}

// OverrideBreaker implements admissionv1.AdmissionServiceServer.
func (s *Server) OverrideBreaker(ctx context.Context, req *admissionv1.OverrideBreakerRequest) (*admissionv1.OverrideBreakerResponse, error) {
	sc, err := s.Scope(req.GetScope())
	if err != nil {
		return nil, err
	}
	v, err := sc.Override(ctx, req.GetSource(), actions[req.GetAction()], req.GetActor(), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &admissionv1.OverrideBreakerResponse{Source: sourceState(v, nil, sc.Config(), *s.confs.Load())}, nil
}
