package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// TestRunChecksAndHelps: --check prints the effective configuration and
// serves nothing; --help is not an error; a bad flag is.
func TestRunChecksAndHelps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	if err := Run(ctx, []string{"--check"}, nil, &out, &errOut); err != nil {
		t.Fatalf("--check: %v", err)
	}
	var doc struct {
		Listen string         `yaml:"listen"`
		Scopes map[string]any `yaml:"scopes"`
	}
	if err := yaml.Unmarshal([]byte(out.String()), &doc); err != nil || doc.Listen != "127.0.0.1:50051" || len(doc.Scopes) != 1 || doc.Scopes["demo"] == nil {
		t.Errorf("--check printed (%v):\n%s", err, out.String())
	}
	if !strings.Contains(errOut.String(), "configuration OK") {
		t.Errorf("--check said on stderr: %q", errOut.String())
	}
	if err := Run(ctx, []string{"--help"}, nil, io.Discard, io.Discard); err != nil {
		t.Errorf("--help: %v", err)
	}
	if err := Run(ctx, []string{"--no-such-flag"}, nil, io.Discard, io.Discard); err == nil {
		t.Error("an unknown flag was accepted")
	}
}

// TestRunServesAndStops runs the sidecar in-process: it announces both
// listeners, serves health and the admission service, refuses a second start
// on the same address, and returns nil once its context ends.
func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Run(runCtx, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, nil, w, io.Discard)
		w.CloseWithError(fmt.Errorf("Run returned %v", err))
		done <- err
	}()
	defer func() { stop(); <-done }()
	lines := bufio.NewScanner(out)
	var addr, metricsURL string
	for _, want := range []string{"polygate listening on ", "polygate metrics on "} {
		if !lines.Scan() {
			t.Fatalf("want %q: %v", want, lines.Err())
		}
		v, ok := strings.CutPrefix(lines.Text(), want)
		if !ok {
			t.Fatalf("stdout %q, want %q", lines.Text(), want)
		}
		if addr == "" {
			addr = v
		} else {
			metricsURL = v
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if !strings.HasPrefix(metricsURL, "http://127.0.0.1:") || !strings.HasSuffix(metricsURL, "/metrics") {
		t.Errorf("metrics announced at %q", metricsURL)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: BackendHealthService})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("backend health: %v %v", hc, err)
	}
	p, err := admissionv1.NewAdmissionServiceClient(conn).Pick(ctx, &admissionv1.PickRequest{Scope: "demo"})
	if err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick: %v %v", p, err)
	}

	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	b := buildInfo()
	if want := fmt.Sprintf("polygate_build_info{goversion=%q,revision=%q,version=%q} 1\n", b.GoVersion, b.Revision, b.Version); !strings.Contains(string(scrape), want) {
		t.Errorf("the scrape lacks %q", want)
	}

	if err := Run(ctx, []string{"--listen", addr}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "listen "+addr) {
		t.Errorf("a second start on %s: %v, want an error naming the address", addr, err)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	done <- nil // for the deferred wait
}

// TestCheckPrintsTheWholeConfigurationAsJSON: --check --output json's
// stdout is one JSON document with every section of the configuration, and
// no secret in it.
func TestCheckPrintsTheWholeConfigurationAsJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const token, operator, password = "s3cret-token-value", "s3cret-operator-value", "s3cret-redis-password"
	environ := []string{"POLYGATE_AUTH__TOKEN=" + token, "POLYGATE_AUTH__OPERATOR_TOKEN=" + operator, "POLYGATE_BACKEND__REDIS__PASSWORD=" + password}
	var out strings.Builder
	if err := Run(ctx, []string{"--check", "--output", "json"}, environ, &out, io.Discard); err != nil {
		t.Fatalf("--check: %v", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
		t.Fatalf("--check is not one JSON document: %v\n%s", err, out.String())
	}
	for _, key := range []string{"listen", "metrics_listen", "listen_mode", "backend", "telemetry", "events", "log", "auth", "tls", "limits", "calls", "scopes"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("--check lacks %q", key)
		}
	}
	for _, s := range []string{token, operator, password} {
		if strings.Contains(out.String(), s) {
			t.Errorf("--check shows the secret %q", s)
		}
	}
	var auth struct{ Token, OperatorToken string }
	if err := json.Unmarshal(doc["auth"], &struct {
		Token         *string `json:"token"`
		OperatorToken *string `json:"operator_token"`
	}{&auth.Token, &auth.OperatorToken}); err != nil || auth.Token != config.Redacted || auth.OperatorToken != config.Redacted {
		t.Errorf("auth shown as %s (%v), want both %q", doc["auth"], err, config.Redacted)
	}
	if !strings.Contains(string(doc["backend"]), `"password": "(redacted)"`) {
		t.Errorf("backend shown as %s", doc["backend"])
	}
}

// TestVersionNamesTheBuild: --version prints one line with the version, the
// revision and the Go version, as internal/buildinfo reads them (the
// stamps themselves: TestReleaseBinariesNameTheirVersion in cmd/sidecar).
func TestVersionNamesTheBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := Run(ctx, []string{"--version"}, nil, &out, io.Discard); err != nil {
		t.Fatalf("--version: %v", err)
	}
	b := buildInfo()
	if want := "polygate " + b.Version + " revision " + b.Revision + " " + runtime.Version() + "\n"; out.String() != want {
		t.Errorf("--version printed %q, want %q", out.String(), want)
	}
}
