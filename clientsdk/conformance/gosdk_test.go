// The Go runner of the conformance kit: every exchange against the Go SDK
// (clientsdk/go), used as an application uses it, an http.Client whose
// Transport is polygate.Transport, against the kit's fake sidecar in this
// process. It lives beside the kit, not in the SDK's module, so that the
// SDK's module requires nothing of the sidecar's (e2e/sdkdeps_test.go).
package conformance_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/clientsdk/conformance/kit"
	polygate "github.com/polygate/polygate/clientsdk/go"
)

// placeholder is the origin the application's requests are written against.
const placeholder = "http://polygate.invalid"

// wait bounds every wait of the runner: the steps that have not come when
// the application is done, and an abort's events.
const wait = 60 * time.Second

func TestGoSDKConformance(t *testing.T) {
	exs, err := kit.Load("exchanges")
	if err != nil {
		t.Fatal(err)
	}
	f := &kit.Fake{}
	t.Cleanup(f.End)
	for _, ex := range exs {
		t.Run(ex.Name, func(t *testing.T) {
			if problems := run(t, f, ex, wait); len(problems) > 0 {
				t.Errorf("the Go SDK differs from the exchange:\n%s", strings.Join(problems, "\n"))
			}
		})
	}
}

// Each case changes one expectation of an exchange; the run must report it.
func TestGoSDKConformanceFailsOnAChangedExpectation(t *testing.T) {
	cases := []struct {
		what, file string
		edit       func(ex map[string]any)
		want       string
		resultWait time.Duration // a step the SDK never sends is reported at once
	}{
		{"an RPC's field", "02-retry-backoff.json", func(ex map[string]any) { step(ex, 2)["request"].(map[string]any)["outcome"] = "RATE_LIMITED" }, `outcome = TRANSIENT, want RATE_LIMITED`, wait},
		{"the opening Pick's options", "01-grant-success.json", func(ex map[string]any) { step(ex, 0)["request"].(map[string]any)["estimated_tokens"] = 501 }, `estimated_tokens = 500, want 501`, wait},
		{"the tokens reported", "01-grant-success.json", func(ex map[string]any) { step(ex, 2)["request"].(map[string]any)["actual_tokens"] = 9 }, `actual_tokens = 8, want 9`, wait},
		{"the retry hint", "07-rate-limited-retry-after.json", func(ex map[string]any) { step(ex, 2)["request"].(map[string]any)["retry_after_hint_ms"] = 2000 }, `retry_after_hint_ms = 1000, want 2000`, wait},
		{"the source attempted", "03-failover.json", func(ex map[string]any) { step(ex, 4)["upstream"] = "c" }, `got upstream b POST /chat/completions, want upstream c`, wait},
		{"a sleep's lower bound", "04-wait.json", func(ex map[string]any) { step(ex, 2)["after_ms"] = 10000 }, `want at least 10000 ms`, wait},
		{"the RPC that comes next", "13-cancel-attempt.json", func(ex map[string]any) {
			ex["script"].([]any)[2] = map[string]any{"rpc": "RecordOutcome", "request": map[string]any{"outcome": "CANCELLED"}, "reply": map[string]any{"done": map[string]any{}}}
		}, `got CancelCall, want RecordOutcome`, wait},
		{"what the application sees", "08-dead-key.json", func(ex map[string]any) {
			appSees(ex)["headers"].(map[string]any)["polygate-failure-reason"] = "circuit_open"
		}, `header polygate-failure-reason = "source_dead", want "circuit_open"`, wait},
		{"a synthesized status", "06-quota-exhausted.json", func(ex map[string]any) { appSees(ex)["status"] = 503 }, `status = 429, want 503`, wait},
		{"an error the application sees", "16-sidecar-down-fail.json", func(ex map[string]any) {
			ex["calls"].([]any)[0].(map[string]any)["app_sees"] = map[string]any{"error": "aborted"}
		}, `want the aborted error`, wait},
		{"a step that never comes", "12-deadline-silent.json", func(ex map[string]any) {
			ex["script"] = append(ex["script"].([]any), map[string]any{"rpc": "Pick", "reply": map[string]any{"hang": true}})
		}, `step 3 (Pick): never came`, 0},
	}
	f := &kit.Fake{}
	t.Cleanup(f.End)
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			problems := run(t, f, mutated(t, c.file, c.edit), c.resultWait)
			for _, p := range problems {
				if strings.Contains(p, c.want) {
					return
				}
			}
			t.Errorf("want a difference matching %q, got:\n%s", c.want, strings.Join(problems, "\n"))
		})
	}
}

func step(ex map[string]any, i int) map[string]any { return ex["script"].([]any)[i].(map[string]any) }

func appSees(ex map[string]any) map[string]any {
	return ex["calls"].([]any)[0].(map[string]any)["app_sees"].(map[string]any)
}

// mutated is the exchange of file with one expectation changed by edit.
func mutated(t *testing.T, file string, edit func(map[string]any)) *kit.Exchange {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("exchanges", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	edit(doc)
	if data, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	ex, err := kit.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// run plays the application's side of ex with one polygate.Client and
// returns every difference: its own (what the application saw) and the
// fake's, waiting at most resultWait for steps that have not come.
func run(t *testing.T, f *kit.Fake, ex *kit.Exchange, resultWait time.Duration) []string {
	t.Helper()
	ep, err := f.Begin(ex)
	if err != nil {
		t.Fatal(err)
	}
	defer f.End()
	scope := ex.Scope // Parse filled in the default
	client, err := polygate.Dial(ep.Sidecar, clientOptions(t, ex, ep, scope)...)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for i, call := range ex.Calls {
		if call.SidecarDown {
			f.StopSidecar()
		}
		for _, p := range doCall(t, f, client, scope, call) {
			problems = append(problems, fmt.Sprintf("calls[%d]: %s", i, p))
		}
	}
	client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), resultWait)
	defer cancel()
	report := f.Result(ctx)
	problems = append(problems, report.Mismatches...)
	if len(problems) > 0 {
		events, _ := json.Marshal(report.Events)
		problems = append(problems, "(events: "+string(events)+")")
	}
	return problems
}

// clientOptions are the exchange's client options, as an application would
// give them: nothing is left to the environment.
func clientOptions(t *testing.T, ex *kit.Exchange, ep kit.Endpoints, scope string) []polygate.Option {
	t.Helper()
	spec := ex.Client
	mode := polygate.SidecarFail
	if spec.OnSidecarUnavailable == "allow" {
		mode = polygate.SidecarAllow
	}
	opts := []polygate.Option{
		polygate.WithOnSidecarUnavailable(mode),
		polygate.WithToken(spec.Token),
		polygate.WithDefaultPriority(spec.Priority),
		polygate.WithDefaultTenant(spec.Tenant),
		polygate.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if fb := spec.Fallback; fb != nil {
		opts = append(opts, polygate.WithFallback(scope, fb.Source, map[string]string{"base_url": ep.Upstream + "/" + fb.Source}))
	}
	if ep.TLS != nil {
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM([]byte(ep.TLS.CA)) {
			t.Fatal("the fake's CA is not PEM")
		}
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if ep.TLS.ClientCert != "" {
			pair, err := tls.X509KeyPair([]byte(ep.TLS.ClientCert), []byte(ep.TLS.ClientKey))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		opts = append(opts, polygate.WithTLS(cfg))
	}
	return opts
}

// doCall sends one request of the application through the governed
// http.Client and checks what it got.
func doCall(t *testing.T, f *kit.Fake, client *polygate.Client, scope string, call kit.Call) []string {
	t.Helper()
	var opts []polygate.CallOption
	o := call.Options
	if o.EstimatedTokens != 0 {
		opts = append(opts, polygate.WithEstimatedTokens(o.EstimatedTokens))
	}
	if o.DeadlineMs != 0 {
		opts = append(opts, polygate.WithTimeout(time.Duration(o.DeadlineMs)*time.Millisecond))
	}
	if o.Priority != nil {
		opts = append(opts, polygate.WithPriority(*o.Priority))
	}
	if o.Tenant != nil {
		opts = append(opts, polygate.WithTenant(*o.Tenant))
	}
	hc := &http.Client{Transport: &polygate.Transport{Client: client, Scope: scope, Options: opts}}

	ctx, abort := context.WithCancel(context.Background())
	defer abort()
	aborted := make(chan error, 1)
	if call.AbortAfter > 0 {
		go func() {
			wctx, stop := context.WithTimeout(ctx, wait)
			defer stop()
			err := f.WaitEvents(wctx, call.AbortAfter)
			abort()
			aborted <- err
		}()
	} else {
		aborted <- nil
	}
	r := call.Request
	req, err := newRequest(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return []string{fmt.Sprintf("reading the response: %v", err)}
		}
	}
	if werr := <-aborted; werr != nil {
		return []string{fmt.Sprintf("the abort's events never came: %v", werr)}
	}
	want := call.AppSees
	switch {
	case want.Error == "" && err != nil:
		return []string{fmt.Sprintf("the application got %v, want a %d response", err, want.Status)}
	case want.Error == "":
		return want.Check(resp.StatusCode, resp.Header, body)
	case err == nil:
		return want.Check(resp.StatusCode, resp.Header, body) // reports the response it got
	case want.Error == "aborted" && !errors.Is(err, context.Canceled),
		want.Error == "unavailable" && !errors.Is(err, polygate.ErrUnavailable):
		return []string{fmt.Sprintf("the application got %v, want the %s error", err, want.Error)}
	}
	return nil
}

func newRequest(ctx context.Context, r kit.AppRequest) (*http.Request, error) {
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, placeholder+r.Path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	return req, nil
}
