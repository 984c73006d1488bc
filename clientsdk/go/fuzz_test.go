package polygate

import (
	"net/http"
	"testing"
	"time"
)

// fuzzNow is the shared vectors' "now".
var fuzzNow = time.Date(2026, 10, 21, 7, 28, 0, 0, time.UTC)

// inRange fails unless d is a hint Classify may report.
func inRange(t *testing.T, what string, d time.Duration) {
	t.Helper()
	if d < 0 || d > MaxRetryHint {
		t.Fatalf("%s = %v; want within [0, %v]", what, d, MaxRetryHint)
	}
}

// FuzzRetryAfter feeds one value to every hint parser: none panics, and every
// hint is within [0, MaxRetryHint].
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"0", "7", "1.5", " 2 ", "-5", "soon", "4611686018", "99999999999999999999999",
		"Fri, 31 Dec 9999 23:59:59 GMT", "Wed, 21 Oct 2026 07:28:42 GMT", "Mon, 01 Jan 0001 00:00:00 GMT",
		"1281023h1281023h1281023h1281023h", "6m0s", "20ms", "1h2m3.5s", "7.66s", "1µs", ".5", "2.",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, _ := retryAfterHeader(fuzzNow, v)
		inRange(t, "Retry-After "+v, d)
		d, _ = retryAfterMs(v)
		inRange(t, "retry-after-ms "+v, d)
		d, _ = parseDuration(v)
		inRange(t, "parseDuration "+v, d)
		h := http.Header{"X-Ratelimit-Reset-Tokens": {v}}
		_, d = ClassifyAt(fuzzNow, http.StatusTooManyRequests, h, []byte(`{"retryDelay":`+quote(v)+`}`))
		inRange(t, "Classify of "+v, d)
	})
}

// FuzzClassify classifies arbitrary responses: no panic, a known outcome, and
// a hint within [0, MaxRetryHint] (0 for a 2xx).
func FuzzClassify(f *testing.F) {
	f.Add(429, "Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT", "x-ratelimit-reset-requests", "1s", []byte(`{"error":{"code":"insufficient_quota"}}`))
	f.Add(503, "retry-after-ms", "1500", "Retry-After", "2", []byte(`{"error":{"details":[{"retryDelay":"1281023h1281023h"}]}}`))
	f.Add(200, "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "6m0s", []byte(`{"usage":{"total_tokens":8}}`))
	f.Add(0, "", "", "", "", []byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{"retryDelay":"1s"}]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
	f.Fuzz(func(t *testing.T, status int, k1, v1, k2, v2 string, body []byte) {
		h := http.Header{}
		h.Add(k1, v1)
		h.Add(k2, v2)
		outcome, d := ClassifyAt(fuzzNow, status, h, body)
		if _, ok := outcomeProto[outcome]; !ok || outcome == Cancelled {
			t.Fatalf("Classify(%d) = outcome %v", status, outcome)
		}
		inRange(t, "Classify hint", d)
		if outcome == Success && d != 0 {
			t.Fatalf("Classify(%d) = SUCCESS with hint %v; want none", status, d)
		}
	})
}

// quote makes v a JSON string (enough for the fuzzer: invalid JSON is fine too).
func quote(v string) string {
	b := []byte{'"'}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '"' || c == '\\' {
			b = append(b, '\\', c)
		} else {
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}
