package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// chromium finds Debian's headless browser; `make test` installs it
// (`make chromium`). Without it the test is skipped, saying how to get it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is missing; `make chromium` installs it")
	}
	t.Skip("chromium is missing; `make chromium` (apt-get install -y chromium) installs it")
	return ""
}

// browse runs headless Chromium on url with extra flags (--dump-dom,
// --screenshot=FILE) and returns its stdout.
func browse(t *testing.T, ctx context.Context, url string, flags ...string) string {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir()}, flags...)
	cmd := exec.CommandContext(ctx, chromium(t), append(args, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", flags, err, stderr.String())
	}
	return string(out)
}

// TestStatusPageInChromium opens /status in a real browser while a breaker
// is OPEN and reads what a person would: the source, OPEN, the cooldown left,
// the transition that opened it. /status.json says the same, zero values
// included. STATUS_SCREENSHOT=FILE also saves a screenshot (how
// docs/status.png was taken).
func TestStatusPageInChromium(t *testing.T) {
	chromium(t)
	metricsAddr := freeTCPAddr(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	const cooldown = time.Hour
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`
metrics_listen: %s
scopes:
  chat:
    breaker: {fail_threshold: 1, cooldown: %s, max_cooldown: %s}
    sources:
      - {name: primary-llm, priority: 0, max_concurrency: 8, rpm: 600, tpm: 90000}
      - {name: fallback-llm, priority: 1}
`, metricsAddr, cooldown, cooldown)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 100})
	if err != nil || p.GetGrant().GetSource() != "primary-llm" {
		t.Fatalf("Pick: %v %v", p, err)
	}
	if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(),
		Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, HttpStatus: 503}); err != nil {
		t.Fatal(err)
	}

	base := "http://" + metricsAddr
	dom := html.UnescapeString(browse(t, ctx, base+"/status", "--dump-dom"))
	row := regexp.MustCompile(`<td>primary-llm</td>\s*<td class="OPEN">OPEN</td>\s*<td class="n">([^<]+)</td>`).FindStringSubmatch(dom)
	if row == nil {
		t.Fatalf("the page does not show primary-llm OPEN with its cooldown:\n%s", dom)
	}
	if left, err := time.ParseDuration(row[1]); err != nil || left <= 0 || left > cooldown {
		t.Errorf("cooldown left %q (%v), want within (0, %v]", row[1], err, cooldown)
	}
	for _, want := range []string{
		`<td>fallback-llm</td>`, `<td class="CLOSED">CLOSED</td>`, // the other source, zero values shown
		`primary-llm</td><td>transition</td><td>closed → open</td><td>consecutive_failures</td>`, // the transition
		`http-equiv="refresh"`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %q:\n%s", want, dom)
		}
	}
	if shot := os.Getenv("STATUS_SCREENSHOT"); shot != "" {
		browse(t, ctx, base+"/status", "--screenshot="+shot, "--window-size=1200,800", "--hide-scrollbars")
	}

	resp, err := http.Get(base + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var doc struct {
		Scopes []struct {
			Name        string `json:"name"`
			Description struct {
				Sources []map[string]any `json:"sources"`
			} `json:"description"`
		} `json:"scopes"`
		Transitions []struct{ Source, To string } `json:"transitions"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || len(doc.Scopes) != 1 || len(doc.Scopes[0].Description.Sources) != 2 {
		t.Fatalf("status.json (%v):\n%s", err, body)
	}
	fallback := doc.Scopes[0].Description.Sources[1]
	for _, key := range []string{"epoch", "window_calls", "window_failures", "in_flight", "requests_last_minute"} {
		if _, ok := fallback[key]; !ok {
			t.Errorf("status.json omits the zero %s of fallback-llm: %v", key, fallback)
		}
	}
	if len(doc.Transitions) != 1 || doc.Transitions[0].Source != "primary-llm" || doc.Transitions[0].To != "open" {
		t.Errorf("transitions %+v, want primary-llm → open", doc.Transitions)
	}
}
