package gate

import (
	"cmp"
	"slices"
)

// Charge is one admission counted in a quota's sliding minute: when it was
// admitted (Unix ms) and the tokens it is charged.
type Charge struct {
	At     int64
	Tokens int64
}

// Minute returns the admissions still counted at now, oldest first, without
// changing the quota. It is what a restart must remember of RPM and TPM.
func (q *Quota) Minute(now int64) []Charge {
	var out []Charge
	for _, e := range q.log[q.head:] {
		if e.at+Minute > now {
			out = append(out, Charge{At: e.at, Tokens: e.tokens})
		}
	}
	return out
}

// RestoreMinute counts charges (oldest first) as admissions of permits that
// nobody holds any more: they use RPM and TPM until they leave the minute,
// and hold no slot. Charges already out of the minute at now are skipped.
func (q *Quota) RestoreMinute(charges []Charge, now int64) {
	for _, c := range charges {
		if c.At+Minute <= now {
			continue
		}
		q.log = append(q.log, logEntry{at: c.At, tokens: c.Tokens})
		q.tokens += c.Tokens
	}
}

// AddMinute counts charges (admissions made elsewhere: a shared backend's,
// for a local gate that takes over) in the minute along with the quota's
// own, in time order: they use RPM and TPM until they leave the minute, and
// hold no slot. Charges already out of the minute at now are skipped.
func (q *Quota) AddMinute(charges []Charge, now int64) {
	q.expire(now)
	charges = slices.SortedStableFunc(slices.Values(charges), func(a, b Charge) int { return cmp.Compare(a.At, b.At) })
	live := q.log[q.head:]
	merged := make([]logEntry, 0, len(live)+len(charges))
	i := 0
	for _, c := range charges {
		if c.At+Minute <= now {
			continue
		}
		for i < len(live) && live[i].at <= c.At {
			merged = append(merged, live[i])
			i++
		}
		t := addTokens(0, c.Tokens)
		merged = append(merged, logEntry{at: c.At, tokens: t})
		q.tokens = addTokens(q.tokens, t)
	}
	merged = append(merged, live[i:]...)
	q.base += int64(q.head)
	q.log, q.head = merged, 0
	for pos, e := range q.log {
		if e.permit != "" {
			q.index[e.permit] = q.base + int64(pos)
		}
	}
}
