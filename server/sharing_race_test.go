package server

import (
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Answers that share their Done and their repeated durations stay right and
// race-free while everything else a sidecar does runs at once: calls of two
// scopes (one of a single source) end Done, are reported again (the
// remembered answer) and cancelled; reloads flip the sources' timeouts
// between two values; the status reads (DescribeScope, ListScopes) and the
// sweep run throughout. Every grant carries a timeout of one of the two
// configurations and the lease of that same timeout plus the grace.
func TestSharedAnswerPartsUnderReloadsAndReads(t *testing.T) {
	yaml := func(fast, slow string) string {
		return fmt.Sprintf(`
calls: {max_live: 1000}
scopes:
  two:
    lease_grace: 1s
    sources: [{name: fast, timeout: %s, max_concurrency: 1000}, {name: slow, timeout: %s, max_concurrency: 1000}]
  one:
    lease_grace: 1s
    sources: [{name: only, timeout: %s, max_concurrency: 1000}]
`, fast, slow, fast)
	}
	h := start(t, harnessOpts{yaml: yaml("5s", "7s")})
	configs := []string{yaml("5s", "7s"), yaml("11s", "13s")}
	var parsed []*config.Config
	for _, y := range configs {
		cfg, err := config.Parse([]byte(y), nil)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, cfg)
	}
	okTimeout := map[int64]bool{5: true, 7: true, 11: true, 13: true}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h.srv.Apply(parsed[i%2])
			h.srv.Sweep()
			for _, scope := range []string{"two", "one"} {
				if _, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: scope}); err != nil {
					t.Errorf("DescribeScope: %v", err)
				}
			}
			if _, err := h.client.ListScopes(h.ctx, &admissionv1.ListScopesRequest{}); err != nil {
				t.Errorf("ListScopes: %v", err)
			}
		}
	})
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for g := range 8 {
		scope := []string{"two", "one"}[g%2]
		wg.Go(func() {
			for i := range 40 {
				p, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: scope})
				if err != nil {
					errs <- err.Error()
					return
				}
				gr := p.GetGrant()
				timeout, lease := gr.GetTimeout().AsDuration(), gr.GetLease().AsDuration()
				if !okTimeout[int64(timeout.Seconds())] || lease != timeout+1e9 {
					errs <- fmt.Sprintf("grant of %s/%s: timeout %v, lease %v", scope, gr.GetSource(), timeout, lease)
					return
				}
				if i%4 == 3 {
					if _, err := h.client.CancelCall(h.ctx, &admissionv1.CancelCallRequest{Scope: scope, CallId: p.GetCallId()}); err != nil {
						errs <- err.Error()
						return
					}
					continue
				}
				req := &admissionv1.RecordOutcomeRequest{Scope: scope, CallId: p.GetCallId(), PermitId: gr.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}
				for range 2 { // the report and its repetition get the same Done
					r, err := h.client.RecordOutcome(h.ctx, req)
					if err != nil || r.GetDone() == nil {
						errs <- fmt.Sprintf("RecordOutcome: %v %v, want Done", r, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// RetryAfter's and DescribeScope's source configurations are made once per
// applied configuration and shared: each answer shows the configuration
// served when it was asked, its timeout and lease from the same one, while
// reloads flip it; after the last reload, every answer shows that one.
func TestSharedSourceConfigsFollowReloads(t *testing.T) {
	yaml := func(timeout string) string {
		return fmt.Sprintf(`
scopes:
  one:
    lease_grace: 1s
    sources: [{name: a, timeout: %s}, {name: b, timeout: %s}]
`, timeout, timeout)
	}
	h := start(t, harnessOpts{yaml: yaml("5s")})
	var parsed []*config.Config
	for _, y := range []string{yaml("5s"), yaml("11s")} {
		cfg, err := config.Parse([]byte(y), nil)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, cfg)
	}
	check := func(srcs []*admissionv1.SourceState, want map[int64]bool) error {
		if len(srcs) != 2 {
			return fmt.Errorf("%d sources, want 2", len(srcs))
		}
		for _, s := range srcs {
			timeout, lease := s.GetConfig().GetTimeout().AsDuration(), s.GetConfig().GetLease().AsDuration()
			if !want[int64(timeout.Seconds())] || lease != timeout+1e9 {
				return fmt.Errorf("source %s: timeout %v, lease %v", s.GetName(), timeout, lease)
			}
		}
		return nil
	}
	either := map[int64]bool{5: true, 11: true}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h.srv.Apply(parsed[i%2])
		}
	})
	for range 200 {
		r, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "one"})
		if err != nil {
			t.Fatal(err)
		}
		if err := check(r.GetSources(), either); err != nil {
			t.Fatalf("RetryAfter during reloads: %v", err)
		}
	}
	close(stop)
	bg.Wait()
	for i, want := range []int64{5, 11} {
		h.srv.Apply(parsed[i])
		r, err := h.client.RetryAfter(h.ctx, &admissionv1.RetryAfterRequest{Scope: "one"})
		if err != nil {
			t.Fatal(err)
		}
		if err := check(r.GetSources(), map[int64]bool{want: true}); err != nil {
			t.Fatalf("RetryAfter after reloading %ds: %v", want, err)
		}
		d, err := h.client.DescribeScope(h.ctx, &admissionv1.DescribeScopeRequest{Scope: "one"})
		if err != nil {
			t.Fatal(err)
		}
		if err := check(d.GetScope().GetSources(), map[int64]bool{want: true}); err != nil {
			t.Fatalf("DescribeScope after reloading %ds: %v", want, err)
		}
		// RetryAfter sends its configurations encoded already: the client
		// decodes the same message, as a field, not as unknown bytes.
		for i, s := range r.GetSources() {
			if got, want := s.GetConfig(), d.GetScope().GetSources()[i].GetConfig(); !proto.Equal(got, want) || len(s.ProtoReflect().GetUnknown()) != 0 {
				t.Fatalf("RetryAfter's configuration of %s: %v (unknown bytes %x), want DescribeScope's %v", s.GetName(), got, s.ProtoReflect().GetUnknown(), want)
			}
		}
	}
}
