package polygate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
)

// The application keeps its own HTTP transport: fn makes the request to the
// granted source and classifies the result; the sidecar decides the rest.
// Here the upstream fails once with 503 and then answers.
func ExampleClient_Do() {
	var hits atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hello"}}]}`)
	}))
	defer upstream.Close()

	addr, stop, err := startSidecar(`
scopes:
  chat:
    backoff: {base: 10ms, max: 100ms}
    sources:
      - name: primary
        timeout: 5s
        attributes: {base_url: "` + upstream.URL + `/v1"}
`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	client, err := polygate.Dial(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	var answer string
	err = client.Do(context.Background(), "chat", func(ctx context.Context, g polygate.Grant) polygate.Result {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.Attributes["base_url"]+"/chat/completions", strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return polygate.ResultOf(nil, nil, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		res := polygate.ResultOf(resp, body, err)
		fmt.Printf("attempt %d on %s: %s\n", g.Attempt, g.Source, res.Outcome)
		answer = string(body)
		return res
	}, polygate.WithEstimatedTokens(100))
	fmt.Println(err, answer)
	// Output:
	// attempt 1 on primary: TRANSIENT
	// attempt 2 on primary: SUCCESS
	// <nil> {"choices":[{"message":{"content":"hello"}}]}
}

// Verdicts are typed errors: a dead key opens its source's breaker at once,
// and the next call of a fail_fast scope fails with circuit_open and the
// remaining cooldown, without calling the upstream.
func ExampleFailureError() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"code":"invalid_api_key"}}`, http.StatusUnauthorized)
	}))
	defer upstream.Close()
	addr, stop, err := startSidecar(`
scopes:
  chat:
    circuit_open: fail_fast
    max_attempts: 1
    breaker: {cooldown: 60s, max_cooldown: 60s}
    sources:
      - name: primary
        attributes: {base_url: "` + upstream.URL + `"}
`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	client, _ := polygate.Dial(addr)
	defer client.Close()

	attempt := func(ctx context.Context, g polygate.Grant) polygate.Result {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.Attributes["base_url"], nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return polygate.ResultOf(nil, nil, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return polygate.ResultOf(resp, body, err)
	}
	for range 2 {
		err := client.Do(context.Background(), "chat", attempt)
		var f *polygate.FailureError
		if errors.As(err, &f) {
			fmt.Println(f.Reason, f.Attempts, errors.Is(err, polygate.ErrCircuitOpen),
				f.RetryAfter > 59*time.Second && f.RetryAfter <= 60*time.Second)
			for _, s := range f.PerSource {
				fmt.Println(" ", s.Source, s.Reason)
			}
		}
	}
	// Output:
	// retry_exhausted 1 false false
	// circuit_open 0 true true
	//   primary cooldown
}

// Classify implements DESIGN's outcome table and reads the upstream's retry
// hints; the largest wins.
func ExampleClassify() {
	h := http.Header{}
	h.Set("Retry-After", "2")
	h.Set("x-ratelimit-reset-requests", "20s") // only used without Retry-After
	fmt.Println(polygate.Classify(429, h, []byte(`{"error":{"details":[{"retryDelay":"7s"}]}}`)))
	fmt.Println(polygate.Classify(429, nil, []byte(`{"error":{"code":"insufficient_quota"}}`)))
	fmt.Println(polygate.Classify(503, nil, nil))
	fmt.Println(polygate.Classify(400, nil, nil))
	// Output:
	// RATE_LIMITED 7s
	// SOURCE_DEAD 0s
	// TRANSIENT 0s
	// CLIENT_ERROR 0s
}
