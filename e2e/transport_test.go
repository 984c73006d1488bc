package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
)

// sentLog is a Base transport that records every upstream request (URL and
// body) before sending it.
type sentLog struct {
	mu   sync.Mutex
	urls []string
	body []string
}

func (l *sentLog) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	l.mu.Lock()
	l.urls = append(l.urls, req.URL.String())
	l.body = append(l.body, string(body))
	l.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (l *sentLog) sent() ([]string, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.urls...), append([]string(nil), l.body...)
}

// twoSources is a fail_fast scope over routes a (first) and b of up.
func twoSources(up *upstream.Server) string {
	return `
scopes:
  chat:
    circuit_open: fail_fast
    max_attempts: 3
    backoff: {base: 5ms, max: 10ms}
    breaker: {fail_threshold: 5}
    sources:
      - {name: a, priority: 0, timeout: 5s, tpm: 100000, attributes: {base_url: "` + up.URL + `/a"}}
      - {name: b, priority: 1, timeout: 5s, tpm: 100000, attributes: {base_url: "` + up.URL + `/b/"}}
`
}

// One http.Client request, governed by the Go SDK's Transport: source a
// answers 503, the same request (its body replayed) fails over to b inside
// one client.Do, and b's token usage settles the estimate. Each case runs on
// a fresh sidecar, so that a is not demoted by the previous case's failure.
func TestTransport_FailsOverInsideOneRequest(t *testing.T) {
	const payload = `{"model":"x","messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name string
		body io.Reader
	}{
		{"replayed with GetBody", strings.NewReader(payload)},
		{"buffered without GetBody", io.NopCloser(strings.NewReader(payload))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			sc := startSidecar(t, twoSources(up))
			up.Set("a", upstream.Step{Status: 503})
			log := &sentLog{}
			var prepared []string
			httpClient := &http.Client{Transport: &polygate.Transport{
				Client: sc.client(t), Scope: "chat", Base: log,
				Prepare: func(req *http.Request, a polygate.Attempt) error {
					prepared = append(prepared, a.Source+" "+req.URL.Host)
					req.Header.Set("Authorization", "Bearer key-of-"+a.Source)
					return nil
				},
				Options: []polygate.CallOption{polygate.WithEstimatedTokens(1000)},
			}}
			req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://polygate.invalid/chat/completions?x=1", tt.body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatalf("client.Do = %v; want b's answer", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), `"model":"fake-b"`) {
				t.Fatalf("response %d %q (%v); want b's 200 completion", resp.StatusCode, body, err)
			}
			if a, b := up.Count("a"), up.Count("b"); a != 1 || b != 1 {
				t.Errorf("a received %d requests and b %d; want 1 each (a's 503, then b's answer)", a, b)
			}
			urls, bodies := log.sent()
			want := fmt.Sprint([]string{up.URL + "/a/chat/completions?x=1", up.URL + "/b/chat/completions?x=1"})
			if fmt.Sprint(urls) != want {
				t.Errorf("sent to %v; want %v", urls, want)
			}
			for _, b := range bodies {
				if b != payload {
					t.Errorf("an attempt sent body %q; want the request's %q", b, payload)
				}
			}
			host := strings.TrimPrefix(up.URL, "http://")
			if want := fmt.Sprint([]string{"a " + host, "b " + host}); fmt.Sprint(prepared) != want {
				t.Errorf("Prepare saw %v; want %v (each attempt already pointed at its source)", prepared, want)
			}
			// The 2xx body's usage.total_tokens (8 for a completion of the
			// fake upstream) settled the 1000-token estimate of b's attempt.
			if got := sc.source(t, "chat", "b").GetTokensLastMinute(); got != 8 {
				t.Errorf("b's tokens_last_minute = %d; want 8, the reported usage, not the 1000 estimated", got)
			}
		})
	}
}

// The sidecar's verdicts through Transport: a non_retryable 400 is the
// caller's response to read; a call that every source fails is the last
// upstream answer, with the verdict beside it (FailureOf); a body too large
// to buffer is refused before any upstream request; a provider SDK's own
// retry is refused.
func TestTransport_Verdicts(t *testing.T) {
	up := newUpstream(t)
	sc := startSidecar(t, twoSources(up))
	client := sc.client(t)
	httpClient := &http.Client{Transport: &polygate.Transport{Client: client, Scope: "chat", MaxRequestBody: 16}}
	post := func(t *testing.T, body io.Reader, header ...string) (*http.Response, error) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://polygate.invalid/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		return httpClient.Do(req)
	}

	t.Run("400 is returned", func(t *testing.T) {
		up.Set("a", upstream.Step{Status: 400, Body: `{"error":{"code":"context_length_exceeded"}}`})
		resp, err := post(t, strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("client.Do = %v; want the upstream's 400", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(body), "context_length_exceeded") || up.Count("b") != 0 {
			t.Errorf("response %d %q, b received %d; want a's 400 with its body, b untouched", resp.StatusCode, body, up.Count("b"))
		}
	})

	t.Run("every source failing is the last answer with the verdict", func(t *testing.T) {
		up.Set("a", upstream.Step{Status: 503})
		up.Set("b", upstream.Step{Status: 503})
		resp, err := post(t, strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("client.Do = %v; want the last 503", err)
		}
		resp.Body.Close()
		failed, ok := polygate.FailureOf(resp)
		if resp.StatusCode != 503 || resp.Header.Get("Polygate-Failure-Reason") != "retry_exhausted" || !ok || failed.Reason != polygate.RetryExhausted || failed.Attempts != 3 {
			t.Fatalf("response %d %v, FailureOf %v; want the upstream's 503 and a retry_exhausted verdict after 3 attempts", resp.StatusCode, resp.Header, failed)
		}
	})

	t.Run("body beyond MaxRequestBody without GetBody", func(t *testing.T) {
		before := up.Count("a") + up.Count("b")
		_, err := post(t, io.NopCloser(strings.NewReader(strings.Repeat("x", 17))))
		if err == nil || !strings.Contains(err.Error(), "MaxRequestBody") {
			t.Errorf("client.Do = %v; want the MaxRequestBody refusal", err)
		}
		if n := up.Count("a") + up.Count("b"); n != before {
			t.Errorf("the upstream received %d requests; want none", n-before)
		}
	})

	t.Run("provider SDK retry", func(t *testing.T) {
		_, err := post(t, strings.NewReader(`{}`), "X-Stainless-Retry-Count", "1")
		if !errors.Is(err, polygate.ErrProviderRetry) {
			t.Errorf("client.Do = %v; want ErrProviderRetry", err)
		}
	})
}

// A streamed 2xx body is the caller's to read after the attempt returned:
// the upstream writes the rest only once RoundTrip has returned (so after the
// attempt's context ended), and the caller reads it all.
func TestTransport_StreamOutlivesTheAttempt(t *testing.T) {
	rest := make(chan struct{})
	stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-rest:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(stream.Close)
	t.Cleanup(func() {
		select {
		case <-rest:
		default:
			close(rest)
		}
	})
	sc := startSidecar(t, `
scopes:
  chat:
    sources:
      - {name: s, timeout: 5s, attributes: {base_url: "`+stream.URL+`"}}
`)
	httpClient := &http.Client{Transport: &polygate.Transport{Client: sc.client(t), Scope: "chat"}}
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://polygate.invalid/chat/completions", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	close(rest)
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "data: one\n\ndata: two\n\ndata: [DONE]\n\n" {
		t.Fatalf("streamed body %q (%v); want all three events", body, err)
	}
}
