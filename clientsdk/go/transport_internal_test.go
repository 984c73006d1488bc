package polygate

import (
	"net/http"
	"strings"
	"testing"
)

func TestPointAt(t *testing.T) {
	tests := []struct {
		base, req, want string
	}{
		{"https://api.openai.com/v1", "http://polygate.invalid/chat/completions", "https://api.openai.com/v1/chat/completions"},
		{"https://api.openai.com/v1/", "http://polygate.invalid/chat/completions?x=1", "https://api.openai.com/v1/chat/completions?x=1"},
		{"http://127.0.0.1:8080", "http://polygate.invalid/v1/models", "http://127.0.0.1:8080/v1/models"},
		{"https://x.openai.azure.com/openai/deployments/d?api-version=2024-10-21", "http://polygate.invalid/chat/completions", "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21"},
		{"https://h/p", "http://polygate.invalid/a%2Fb", "https://h/p/a%2Fb"},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(http.MethodPost, tt.req, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "polygate.invalid"
		if err := pointAt(req, Attempt{Source: "s", Attributes: map[string]string{"base_url": tt.base}}); err != nil {
			t.Fatalf("pointAt(%s, %s) = %v", tt.base, tt.req, err)
		}
		if got := req.URL.String(); got != tt.want || req.Host != "" {
			t.Errorf("pointAt(%s, %s) = %s (Host %q); want %s and the URL's host", tt.base, tt.req, got, req.Host, tt.want)
		}
	}
	for _, attrs := range []map[string]string{nil, {"base_url": "/relative"}, {"base_url": "::"}} {
		req, _ := http.NewRequest(http.MethodGet, "http://polygate.invalid/x", nil)
		if err := pointAt(req, Attempt{Source: "s", Attributes: attrs}); err == nil || !strings.Contains(err.Error(), "source s") {
			t.Errorf("pointAt with %v = %v; want an error naming the source", attrs, err)
		}
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		body string
		want int64 // -1: none
	}{
		{`{"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`, 8},
		{`{"usage":{"total_tokens":0}}`, 0},
		{`{"choices":[]}`, -1},
		{`{"usage":{"total_tokens":-3}}`, -1},
		{`{"usage":{"total_tokens":1.5}}`, -1},
		{`{"usage":{"total_tokens":99999999999999999999}}`, -1},
		{`{"usage":null}`, -1},
		{`not json`, -1},
	}
	for _, tt := range tests {
		got := usage([]byte(tt.body))
		if (got == nil) != (tt.want < 0) || got != nil && *got != tt.want {
			t.Errorf("usage(%s) = %v; want %d (-1: none)", tt.body, got, tt.want)
		}
	}
}
