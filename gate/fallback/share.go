package fallback

import "github.com/polygate/polygate/gate"

// share gives each candidate this replica's share of its limits.
func (b *Backend) share(req gate.AdmitRequest) gate.AdmitRequest {
	if b.o.Replicas == 1 {
		return req
	}
	out := req
	out.Candidates = make([]gate.Candidate, len(req.Candidates))
	for i, c := range req.Candidates {
		out.Candidates[i] = b.shareOf(c)
	}
	return out
}

// sharePeek asks for the local verdicts with the limits the local Admit
// enforces, so that a caller is never told to retry what Admit refuses.
func (b *Backend) sharePeek(req gate.PeekRequest) gate.PeekRequest {
	if b.o.Replicas == 1 {
		return req
	}
	out := req
	out.Sources = make([]*gate.Source, len(req.Sources))
	out.Ceilings = make([]int, len(req.Sources))
	for i := range req.Sources {
		c := b.shareOf(req.Candidate(i))
		out.Sources[i], out.Ceilings[i] = c.Source, c.Ceiling
	}
	return out
}

// shareOf is c with this replica's share of its limits and ceiling.
func (b *Backend) shareOf(c gate.Candidate) gate.Candidate {
	n := b.o.Replicas
	src := *c.Source
	src.Limits.MaxConcurrency = int(part(int64(src.Limits.MaxConcurrency), n))
	src.Limits.RPM = part(src.Limits.RPM, n)
	src.Limits.TPM = part(src.Limits.TPM, n)
	return gate.Candidate{Source: &src, Ceiling: min(int(part(int64(c.Ceiling), n)), src.Limits.MaxConcurrency)}
}

// part is v/n rounded up, at least 1; 0 (unlimited) stays 0.
func part(v int64, n int) int64 {
	if v <= 0 {
		return v
	}
	q := v / int64(n)
	if v%int64(n) != 0 {
		q++ // rounded up without v+n-1, which wraps near the top of int64
	}
	return max(1, q)
}
