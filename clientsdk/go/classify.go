package polygate

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Classify maps an upstream HTTP result to its outcome with the outcome
// table, and returns the largest retry hint the upstream gave (0 if none).
// The table is shared with the Python SDK through testdata/classification.json:
//
//	2xx                          SUCCESS (hints ignored)
//	5xx, 408                     TRANSIENT
//	429                          RATE_LIMITED, or SOURCE_DEAD when a JSON body says insufficient_quota
//	401, 403                     SOURCE_DEAD
//	other 4xx, 1xx, 3xx          CLIENT_ERROR
//	outside 100..599             TRANSIENT (a malformed response)
//
// Hints: retry-after-ms (milliseconds), else Retry-After (seconds or an HTTP
// date); when neither is usable, OpenAI's x-ratelimit-reset-requests /
// x-ratelimit-reset-tokens of each exhausted dimension; a retryDelay anywhere
// in a JSON body (Google's RetryInfo). The largest wins. Every hint saturates
// at MaxRetryHint and is never negative: a date in the year 9999 or a
// 20-digit number of seconds is MaxRetryHint, not an overflow.
func Classify(status int, header http.Header, body []byte) (Outcome, time.Duration) {
	return ClassifyAt(time.Now(), status, header, body)
}

// ClassifyAt is Classify with the current time given, which an HTTP-date
// Retry-After is measured from.
func ClassifyAt(now time.Time, status int, header http.Header, body []byte) (Outcome, time.Duration) {
	var outcome Outcome
	switch {
	case status >= 200 && status <= 299:
		return Success, 0
	case status < 100 || status > 599:
		outcome = Transient
	case status >= 500, status == http.StatusRequestTimeout:
		outcome = Transient
	case status == http.StatusTooManyRequests:
		outcome = RateLimited
		if insufficientQuota(body) {
			outcome = SourceDead
		}
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		outcome = SourceDead
	default:
		outcome = ClientError
	}
	return outcome, retryHint(now, header, body)
}

// ResultOf classifies one attempt made with net/http: a transport error is
// TRANSIENT (a timeout, a refused or reset connection), or CANCELLED when it
// is context.Canceled; otherwise the response is classified with Classify.
// body is the response body the caller read (it may be nil for a success
// whose body the caller streams).
func ResultOf(resp *http.Response, body []byte, err error) Result {
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return Result{Outcome: Cancelled, Detail: err.Error()}
		}
		return Result{Outcome: Transient, Detail: err.Error()}
	}
	if resp == nil {
		return Result{Outcome: Transient, Detail: "no response"}
	}
	outcome, hint := Classify(resp.StatusCode, resp.Header, body)
	return Result{Outcome: outcome, RetryAfter: hint, HTTPStatus: resp.StatusCode}
}

// MaxRetryHint caps every hint the SDK parses from a response. An upstream
// hint longer than this is reported as MaxRetryHint: still "very long" to the
// sidecar, which caps it again with its own limits (backoff.max_retry_after
// for RATE_LIMITED and TRANSIENT, breaker.max_cooldown for SOURCE_DEAD) and
// decides.
const MaxRetryHint = 24 * time.Hour

// retryHint is the largest hint of the response, in [0, MaxRetryHint].
func retryHint(now time.Time, header http.Header, body []byte) time.Duration {
	hint, ok := retryAfterMs(header.Get("retry-after-ms"))
	if !ok {
		hint, ok = retryAfterHeader(now, header.Get("Retry-After"))
	}
	if !ok {
		hint = max(resetHint(header, "requests"), resetHint(header, "tokens"))
	}
	return max(hint, bodyRetryDelay(body))
}

// retryAfterMs parses retry-after-ms (OpenAI, Azure): milliseconds, decimals
// accepted; ok is false when it is absent or unusable.
func retryAfterMs(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	return parseNumber(v, time.Millisecond)
}

// retryAfterHeader parses Retry-After: delay-seconds (decimals accepted) or
// an HTTP date; ok is false when it is absent or unusable. The result is in
// [0, MaxRetryHint].
func retryAfterHeader(now time.Time, v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if d, ok := parseNumber(v, time.Second); ok {
		return d, true
	}
	if t, err := http.ParseTime(v); err == nil {
		// Sub saturates at the extremes of Duration; the cap does the rest.
		return min(max(t.Sub(now), 0), MaxRetryHint), true
	}
	return 0, false
}

// resetHint is OpenAI's x-ratelimit-reset-<dim>, counted only when the
// dimension is exhausted (x-ratelimit-remaining-<dim> absent or 0).
func resetHint(header http.Header, dim string) time.Duration {
	if rem := strings.TrimSpace(header.Get("x-ratelimit-remaining-" + dim)); rem != "" {
		if n, err := strconv.ParseFloat(rem, 64); err == nil && n > 0 {
			return 0
		}
	}
	d, _ := parseDuration(header.Get("x-ratelimit-reset-" + dim))
	return d
}

// insufficientQuota reports whether a JSON body says insufficient_quota in
// error.code, error.type, code or type.
func insufficientQuota(body []byte) bool {
	var doc struct {
		Error *struct {
			Code any `json:"code"`
			Type any `json:"type"`
		} `json:"error"`
		Code any `json:"code"`
		Type any `json:"type"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return false
	}
	is := func(v any) bool { s, ok := v.(string); return ok && s == "insufficient_quota" }
	if doc.Error != nil && (is(doc.Error.Code) || is(doc.Error.Type)) {
		return true
	}
	return is(doc.Code) || is(doc.Type)
}

// bodyRetryDelay is the largest "retryDelay" duration string anywhere in a
// JSON body.
func bodyRetryDelay(body []byte) time.Duration {
	var doc any
	if len(body) == 0 || json.Unmarshal(body, &doc) != nil {
		return 0
	}
	var walk func(v any, depth int) time.Duration
	walk = func(v any, depth int) time.Duration {
		if depth > 32 {
			return 0
		}
		var most time.Duration
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "retryDelay" {
					d, _ := parseDuration(s)
					most = max(most, d)
					continue
				}
				most = max(most, walk(x, depth+1))
			}
		case []any:
			for _, x := range v {
				most = max(most, walk(x, depth+1))
			}
		}
		return most
	}
	return walk(doc, 0)
}

// durationUnits are the units parseDuration accepts, longest first.
var durationUnits = []struct {
	name string
	unit time.Duration
}{
	{"ns", time.Nanosecond}, {"us", time.Microsecond}, {"µs", time.Microsecond},
	{"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour},
}

// parseDuration parses a non-negative duration as OpenAI and Google write
// them ("1s", "6m0s", "20ms", "7.66s", "1h2m3.5s"); a bare number is seconds.
// The sum saturates at MaxRetryHint. The grammar is the Python SDK's too.
func parseDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	if d, ok := parseNumber(s, time.Second); ok {
		return d, true
	}
	var total time.Duration
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		num, rest := s[:i], s[i:]
		found := false
		for _, u := range durationUnits {
			if strings.HasPrefix(rest, u.name) && !(u.name == "m" && strings.HasPrefix(rest, "ms")) {
				d, ok := parseNumber(num, u.unit)
				if !ok {
					return 0, false
				}
				total = min(total+d, MaxRetryHint) // both ≤ MaxRetryHint: no overflow
				s = rest[len(u.name):]
				found = true
				break
			}
		}
		if !found {
			return 0, false
		}
	}
	return total, true
}

// parseNumber parses digits with an optional fraction ("7", "1.5", ".5",
// "2.") as a count of unit, exactly (no floating point), saturating at
// MaxRetryHint however many digits there are. unit is at most an hour.
func parseNumber(s string, unit time.Duration) (time.Duration, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" && frac == "" || !digits(whole) || !digits(frac) || (!dot && frac != "") {
		return 0, false
	}
	limit := int64(MaxRetryHint / unit)
	var n int64
	for _, c := range whole {
		n = n*10 + int64(c-'0')
		if n > limit {
			return MaxRetryHint, true
		}
	}
	d := time.Duration(n) * unit
	scale := unit
	for _, c := range frac {
		scale /= 10
		if scale == 0 {
			break
		}
		d += time.Duration(c-'0') * scale
	}
	return min(d, MaxRetryHint), true
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
