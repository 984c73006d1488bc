package gate

import (
	"math"
	"time"
)

// Minute is the length of the sliding window RPM and TPM are counted over.
const Minute = int64(60_000)

// Limits is a source's quota configuration.
type Limits struct {
	// MaxConcurrency is the number of attempts that may be out at once (>= 1).
	MaxConcurrency int
	// RPM and TPM limit requests and tokens over a sliding minute; 0 = no limit.
	RPM int64
	TPM int64
	// Lease is how long a permit holds its slot without an outcome (the
	// source's timeout plus a grace), so that a crashed client cannot leak
	// capacity.
	Lease time.Duration
}

// Quota is the state of one source's limits: the slots held now, and the
// admissions of the last minute when RPM or TPM is limited. The zero value is
// an idle source.
type Quota struct {
	// Leases maps the permit holding each slot to the end of its lease (ms).
	Leases map[string]int64
	// soonest is at most the earliest end in Leases: expire looks through
	// the leases only once it has passed, not on every decision.
	soonest int64
	log     []logEntry // log[head:] is the last minute, oldest first
	head    int
	base    int64            // absolute position of log[0]
	index   map[string]int64 // permit → absolute position in log
	tokens  int64            // tokens of log[head:]
}

type logEntry struct {
	at     int64
	tokens int64
	permit string
}

// expire forgets slots whose lease ended and admissions older than a minute.
func (q *Quota) expire(now int64) {
	if len(q.Leases) > 0 && now >= q.soonest {
		q.soonest = math.MaxInt64
		for id, end := range q.Leases {
			if now >= end {
				delete(q.Leases, id)
			} else {
				q.soonest = min(q.soonest, end)
			}
		}
	}
	for q.head < len(q.log) && q.log[q.head].at+Minute <= now {
		e := q.log[q.head]
		q.tokens = addTokens(q.tokens, -e.tokens)
		delete(q.index, e.permit)
		q.log[q.head] = logEntry{}
		q.head++
	}
	if q.head > 64 && q.head > len(q.log)/2 {
		n := copy(q.log, q.log[q.head:])
		clear(q.log[n:])
		q.log = q.log[:n]
		q.base += int64(q.head)
		q.head = 0
	}
}

// check reports why an attempt of the given tokens cannot start now, with the
// time until the earliest certain retry (0 when a slot may free at any
// moment). ceiling is the pacer's concurrency ceiling.
func (q *Quota) check(l Limits, ceiling int, tokens, now int64) (Reason, int64) {
	q.expire(now)
	live := q.log[q.head:]
	v := QuotaView{InFlight: len(q.Leases), Requests: int64(len(live)), Tokens: q.tokens}
	reason := v.refusal(l, ceiling, tokens)
	switch {
	case reason != ReasonRateLimited || v.InFlight >= l.MaxConcurrency:
		return reason, 0 // a slot may free at any moment
	case l.RPM > 0 && v.Requests >= l.RPM:
		// The (len−RPM)-th oldest admission must leave the minute first.
		return reason, live[v.Requests-l.RPM].at + Minute - now
	case tokens > l.TPM:
		return reason, 0 // never fits this source
	}
	excess := q.tokens + tokens - l.TPM
	for _, e := range live {
		excess -= e.tokens
		if excess <= 0 {
			return reason, e.at + Minute - now
		}
	}
	return reason, 0
}

// MaxTokenSum bounds a token count: a minute's sum (and each admission's
// count) saturates at 0 and at MaxTokenSum, so that no report can wrap it
// below a TPM limit. 2^53 is exact in Lua's doubles too.
const MaxTokenSum = 1 << 53

// addTokens is sum + n, saturating at [0, MaxTokenSum]; sum must be in it.
func addTokens(sum, n int64) int64 {
	n = min(max(n, -MaxTokenSum), MaxTokenSum)
	return min(max(sum+n, 0), MaxTokenSum)
}

// take holds a slot for the permit and counts its admission.
func (q *Quota) take(l Limits, permit string, tokens, now int64) {
	if q.Leases == nil {
		q.Leases = make(map[string]int64)
	}
	end := now + l.Lease.Milliseconds()
	if len(q.Leases) == 0 || end < q.soonest {
		q.soonest = end
	}
	q.Leases[permit] = end
	if l.RPM == 0 && l.TPM == 0 {
		return
	}
	if q.index == nil {
		q.index = make(map[string]int64)
	}
	q.index[permit] = q.base + int64(len(q.log))
	tokens = addTokens(0, tokens)
	q.log = append(q.log, logEntry{at: now, tokens: tokens, permit: permit})
	q.tokens = addTokens(q.tokens, tokens)
}

// release frees the permit's slot and settles its token count to actual
// (actual < 0 keeps the estimate). It reports whether the slot was still held.
func (q *Quota) release(permit string, actual, now int64) bool {
	q.expire(now)
	_, held := q.Leases[permit]
	delete(q.Leases, permit)
	if pos, ok := q.index[permit]; ok && actual >= 0 {
		e := &q.log[pos-q.base]
		actual = addTokens(0, actual)
		q.tokens = addTokens(q.tokens, actual-e.tokens)
		e.tokens = actual
	}
	return held
}

// QuotaView is a read of a source's quota.
type QuotaView struct {
	InFlight int
	// Requests and Tokens admitted over the last minute (counted only when
	// RPM or TPM is limited).
	Requests int64
	Tokens   int64
}

// refusal is the quota's admission rule, the one place it is written in Go:
// the reason an attempt of tokens is refused given these counts (ReasonNone
// if it fits), with ceiling the pacer's concurrency ceiling. Admit's walk and
// Peek's verdict apply it; nothing outside a backend restates it.
func (v QuotaView) refusal(l Limits, ceiling int, tokens int64) Reason {
	switch {
	case ceiling < l.MaxConcurrency && v.InFlight >= ceiling:
		return ReasonAdaptivePaced
	case v.InFlight >= l.MaxConcurrency,
		l.RPM > 0 && v.Requests >= l.RPM,
		l.TPM > 0 && v.Tokens+tokens > l.TPM:
		return ReasonRateLimited
	}
	return ReasonNone
}

func (q *Quota) view(now int64) QuotaView {
	inFlight := 0
	for _, end := range q.Leases {
		if now < end {
			inFlight++
		}
	}
	var requests, tokens int64
	for _, e := range q.log[q.head:] {
		if e.at+Minute > now {
			requests++
			tokens = addTokens(tokens, e.tokens)
		}
	}
	return QuotaView{InFlight: inFlight, Requests: requests, Tokens: tokens}
}
