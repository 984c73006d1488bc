package polygate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	polygate "github.com/polygate/polygate/clientsdk/go"
)

// The application keeps its own HTTP client: the attempt makes the request
// to the granted source and classifies the result; the sidecar decides the
// rest. Do returns the successful attempt's value.
func ExampleDo() {
	client, err := polygate.Dial("127.0.0.1:50051") // or "unix:///run/polygate.sock"
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	answer, err := polygate.Do(context.Background(), client, "chat", func(ctx context.Context, a polygate.Attempt) ([]byte, polygate.Result) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.Attributes["base_url"]+"/chat/completions", strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, polygate.ResultOf(nil, nil, err) // timeouts, refused connections: TRANSIENT
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return body, polygate.ResultOf(resp, body, err) // 2xx, 429 + Retry-After, 401, insufficient_quota...
	}, polygate.WithEstimatedTokens(100))

	var failed *polygate.FailureError
	switch {
	case err == nil:
		fmt.Println(string(answer))
	case errors.As(err, &failed):
		fmt.Println("unavailable:", failed.Reason, "retry in", failed.RetryAfter)
	default:
		fmt.Println(err) // a *polygate.StatusError of the sidecar, or the context's error
	}
}

// An http.Client whose every request is one governed call: requests are
// written against http://polygate.invalid and each attempt goes to the
// granted source's base_url. Provider SDKs built on net/http take such a
// client (openai-go: option.WithHTTPClient, with option.WithMaxRetries(0)).
func ExampleTransport() {
	client, err := polygate.Dial("127.0.0.1:50051")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	keys := map[string]string{"openai": os.Getenv("OPENAI_API_KEY"), "azure": os.Getenv("AZURE_API_KEY")}
	httpClient := &http.Client{Transport: &polygate.Transport{
		Client: client,
		Scope:  "chat",
		Prepare: func(req *http.Request, a polygate.Attempt) error {
			req.Header.Set("Authorization", "Bearer "+keys[a.Source])
			return nil
		},
		Options: []polygate.CallOption{polygate.WithEstimatedTokens(500)},
	}}
	resp, err := httpClient.Post("http://polygate.invalid/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"Hello"}]}`))
	if err != nil {
		fmt.Println(err) // errors.As(err, &failed) gives the sidecar's verdict
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
}

// Classify implements the outcome table and reads the upstream's retry
// hints; the largest wins, and none exceeds MaxRetryHint.
func ExampleClassify() {
	h := http.Header{}
	h.Set("Retry-After", "2")
	h.Set("x-ratelimit-reset-requests", "20s") // only used without Retry-After
	fmt.Println(polygate.Classify(429, h, []byte(`{"error":{"details":[{"retryDelay":"7s"}]}}`)))
	fmt.Println(polygate.Classify(429, nil, []byte(`{"error":{"code":"insufficient_quota"}}`)))
	fmt.Println(polygate.Classify(503, http.Header{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}}, nil))
	fmt.Println(polygate.Classify(400, nil, nil))
	// Output:
	// RATE_LIMITED 7s
	// SOURCE_DEAD 0s
	// TRANSIENT 24h0m0s
	// CLIENT_ERROR 0s
}

// With the application's tracer provider, each call is a span under the
// caller's, with a child span per attempt; the sidecar's own spans join the
// same trace. Without the option the global provider is used.
func ExampleWithTracerProvider() {
	tp := sdktrace.NewTracerProvider() // with the application's exporter: sdktrace.WithBatcher(exp)
	defer tp.Shutdown(context.Background())
	client, err := polygate.Dial("127.0.0.1:50051", polygate.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx, span := tp.Tracer("app").Start(context.Background(), "handle request")
	defer span.End()
	_, err = polygate.Do(ctx, client, "chat", func(ctx context.Context, a polygate.Attempt) (string, polygate.Result) {
		// ctx carries the attempt's span: the upstream request's spans nest under it.
		return "answer", polygate.Result{Outcome: polygate.Success}
	})
	fmt.Println(err)
}
