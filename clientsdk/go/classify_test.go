package polygate_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
)

// vectors is testdata/classification.json, shared with the Python SDK.
type vectors struct {
	Now   string `json:"now"`
	Cases []struct {
		Name         string            `json:"name"`
		Status       int               `json:"status"`
		Headers      map[string]string `json:"headers"`
		Body         string            `json:"body"`
		Outcome      string            `json:"outcome"`
		RetryAfterMs int64             `json:"retry_after_ms"`
	} `json:"cases"`
}

func TestClassify_SharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/classification.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("testdata/classification.json: %v", err)
	}
	now, err := http.ParseTime(v.Now)
	if err != nil {
		t.Fatalf("now %q: %v", v.Now, err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			h := http.Header{}
			for k, val := range c.Headers {
				h.Set(k, val)
			}
			outcome, hint := polygate.ClassifyAt(now, c.Status, h, []byte(c.Body))
			want := time.Duration(c.RetryAfterMs) * time.Millisecond
			if outcome.String() != c.Outcome || hint != want {
				t.Errorf("Classify(%d, %v, %q) = %v, %v; want %s, %v", c.Status, c.Headers, c.Body, outcome, hint, c.Outcome, want)
			}
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestResultOf_TransportErrors(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	tests := []struct {
		name string
		err  error
		want polygate.Outcome
	}{
		{"connection refused", refused, polygate.Transient},
		{"timeout", timeoutErr{}, polygate.Transient},
		{"attempt deadline", context.DeadlineExceeded, polygate.Transient},
		{"caller cancelled", context.Canceled, polygate.Cancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := polygate.ResultOf(nil, nil, tt.err); got.Outcome != tt.want || got.Detail == "" {
				t.Errorf("ResultOf(%v) = %+v; want outcome %v with a detail", tt.err, got, tt.want)
			}
		})
	}
	resp := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"3"}}}
	if got := polygate.ResultOf(resp, nil, nil); got.Outcome != polygate.RateLimited || got.RetryAfter != 3*time.Second || got.HTTPStatus != 429 {
		t.Errorf("ResultOf(429 Retry-After 3) = %+v", got)
	}
}
