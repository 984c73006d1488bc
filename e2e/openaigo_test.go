package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/polygate/polygate/e2e/upstream"
	"github.com/polygate/polygate/internal/sidecartest"
)

// The official openai-go client, governed by the Go SDK's Transport, in an
// application of its own (testdata/openaigo, its own module with openai-go
// pinned), against the real sidecar and the fake upstream. The application
// takes the sidecar from $POLYGATE_ADDR and prints what it saw.

var openaigo struct {
	once sync.Once
	bin  string
	err  error
}

// openaigoApp builds the application once per test binary.
func openaigoApp(t *testing.T) string {
	t.Helper()
	openaigo.once.Do(func() {
		dir, err := os.MkdirTemp("", "openaigo")
		if err != nil {
			openaigo.err = err
			return
		}
		openaigo.bin = filepath.Join(dir, "openaigo")
		cmd := exec.Command("go", "build", "-o", openaigo.bin, ".")
		cmd.Dir = filepath.Join("testdata", "openaigo")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			openaigo.err = fmt.Errorf("go build testdata/openaigo: %v\n%s", err, out)
		}
	})
	if openaigo.err != nil {
		t.Fatal(openaigo.err)
	}
	return openaigo.bin
}

// seen is what the application printed.
type seen struct {
	Content     string   `json:"content"`
	Chunks      []string `json:"chunks"`
	APIError    bool     `json:"api_error"`
	Status      int      `json:"status"`
	Code        string   `json:"code"`
	Message     string   `json:"message"`
	Header      string   `json:"failure_reason_header"`
	RetryAfter  string   `json:"retry_after_header"`
	FailureOf   string   `json:"failure_of"`
	Unavailable bool     `json:"unavailable"`
	Error       string   `json:"error"`
	Ungoverned  int64    `json:"ungoverned_attempts"`
}

// runApp runs the application against the sidecar at addr with args.
func runApp(t *testing.T, addr string, args ...string) seen {
	t.Helper()
	cmd := exec.CommandContext(ctxT(t), openaigoApp(t), args...)
	cmd.Env = append(os.Environ(), "POLYGATE_ADDR="+addr, "POLYGATE_TOKEN=", "POLYGATE_ON_SIDECAR_UNAVAILABLE=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openaigo %v: %v\n%s", args, err, out)
	}
	var s seen
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("openaigo printed %q: %v", out, err)
	}
	return s
}

const deadKey = `{"error":{"message":"Incorrect API key provided: sk-dead.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`

func TestOpenAIGo(t *testing.T) {
	openaigoApp(t)
	// twoSources with fail_threshold 1, so that one call's 503s open both.
	fragile := func(up *upstream.Server) string {
		return strings.Replace(twoSources(up), "fail_threshold: 5", "fail_threshold: 1", 1)
	}

	t.Run("fails over", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, twoSources(up))
		up.Set("a", upstream.Step{Status: 503})
		if s := runApp(t, sc.addr); s.Content != "ok from b" || s.Error != "" || s.APIError {
			t.Errorf("saw %+v; want b's completion", s)
		}
	})

	t.Run("streams", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, twoSources(up))
		up.Set("a", upstream.Step{Status: 503})
		var events []string
		for _, c := range []string{"Hel", "lo"} {
			events = append(events, `{"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"`+c+`"}}]}`)
		}
		up.Set("b", upstream.Step{Stream: events})
		if s := runApp(t, sc.addr, "-stream"); fmt.Sprint(s.Chunks) != "[Hel lo]" || s.Error != "" {
			t.Errorf("saw %+v; want the two chunks of b's stream", s)
		}
	})

	t.Run("429 with Retry-After", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, `
scopes:
  chat:
    backoff: {base: 5ms, max: 10ms, max_retry_after: 10s}
    sources:
      - {name: a, timeout: 5s, attributes: {base_url: "`+up.URL+`/a"}}
`)
		up.Set("a", upstream.Step{Status: 429, Headers: map[string]string{"Retry-After": "1"}, Times: 1}, upstream.Step{Status: 200})
		if s := runApp(t, sc.addr); s.Content != "ok from a" {
			t.Errorf("saw %+v; want a's completion after the 429", s)
		}
		assertSpacing(t, "the retry after Retry-After: 1", up.Requests("a"), time.Second)
	})

	t.Run("dead key is the client's 401", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, twoSources(up))
		up.Set("a", upstream.Step{Status: 401, Body: deadKey})
		up.Set("b", upstream.Step{Status: 401, Body: deadKey})
		s := runApp(t, sc.addr)
		if !s.APIError || s.Status != 401 || !strings.Contains(s.Message, "Incorrect API key provided") || s.Code != "invalid_api_key" {
			t.Errorf("saw %+v; want *openai.Error 401 with the provider's message", s)
		}
		if s.Header != "source_dead" || s.FailureOf != "source_dead" {
			t.Errorf("saw %+v; want the source_dead verdict beside it", s)
		}
	})

	t.Run("400 is the client's 400", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, twoSources(up))
		up.Set("a", upstream.Step{Status: 400, Body: `{"error":{"message":"bad model","type":"invalid_request_error","code":null}}`})
		if s := runApp(t, sc.addr); !s.APIError || s.Status != 400 || s.Message != "bad model" || s.FailureOf != "non_retryable" {
			t.Errorf("saw %+v; want *openai.Error 400 bad model", s)
		}
	})

	t.Run("every source open", func(t *testing.T) {
		up := newUpstream(t)
		sc := startSidecar(t, fragile(up))
		up.Set("a", upstream.Step{Status: 503})
		up.Set("b", upstream.Step{Status: 503})
		if s := runApp(t, sc.addr); s.Status != 503 || s.Header != "circuit_open" {
			t.Fatalf("first call saw %+v; want b's 503 as both breakers opened", s)
		}
		s := runApp(t, sc.addr)
		if !s.APIError || s.Status != 503 || s.Code != "circuit_open" || !strings.Contains(s.Message, "circuit_open") || !strings.Contains(s.Message, "retry after "+s.RetryAfter+"s") {
			t.Errorf("saw %+v; want *openai.Error 503 naming circuit_open and when to retry", s)
		}
		if after, err := strconv.ParseFloat(s.RetryAfter, 64); err != nil || after <= 0 {
			t.Errorf("Polygate-Retry-After %q; want the remaining cooldown", s.RetryAfter)
		}
		if n := up.Count("a") + up.Count("b"); n != 2 {
			t.Errorf("the upstream received %d requests; want 2, none while every source is open", n)
		}
	})

	t.Run("sidecar down, fail", func(t *testing.T) {
		up := newUpstream(t)
		s := runApp(t, stoppedSidecar(t, twoSources(up)))
		if s.APIError || !s.Unavailable || up.Count("a")+up.Count("b") != 0 {
			t.Errorf("saw %+v; want polygate's unavailable error, no upstream request", s)
		}
	})

	t.Run("sidecar down, allow", func(t *testing.T) {
		up := newUpstream(t)
		s := runApp(t, stoppedSidecar(t, twoSources(up)), "-allow", "-fallback", up.URL+"/b")
		if s.Content != "ok from b" || s.Ungoverned != 1 || up.Count("b") != 1 {
			t.Errorf("saw %+v; want b's completion, made without the sidecar", s)
		}
	})
}

// stoppedSidecar is the address of a sidecar that was started and stopped.
func stoppedSidecar(t *testing.T, config string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := sidecartest.Start(t, []string{"--config", file, "--listen", "127.0.0.1:0"})
	sc.Stop(t)
	return sc.Addr
}
