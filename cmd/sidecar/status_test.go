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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// statusConfig has a scope with two sources that the test opens (chat)
// and one whose second source an operator forces open (embed).
const statusConfig = `
metrics_listen: %s
scopes:
  chat:
    circuit_open: wait
    backpressure: {stall_window: 1h}
    breaker: {fail_threshold: 1, cooldown: %s, max_cooldown: %s}
    sources:
      - {name: primary-llm, priority: 0, max_concurrency: 8, rpm: 600, tpm: 90000}
      - {name: fallback-llm, priority: 1, max_concurrency: 4}
  embed:
    sources:
      - {name: embed-a, max_concurrency: 4}
      - {name: embed-b, max_concurrency: 4}
`

// TestStatusPageInChromium opens /status in a real browser while scope chat
// is down (both sources OPEN, calls held waiting) and scope embed runs on
// one source because an operator forced the other open, and reads what the
// person on call would: each scope's headline (DOWN, why, the calls
// waiting, when the next probe comes), why each source opened and its last
// upstream status, the override as what it does, the transitions, and the
// 15-minute chart; the page's script then swaps in a fresh copy.
// /status.json says the same. STATUS_SCREENSHOTS=DIR saves the screenshots
// docs/operations.md shows (status.png, status-filtered.png), after a few
// minutes of traffic so that the chart has a history.
func TestStatusPageInChromium(t *testing.T) {
	chromium(t)
	shots := os.Getenv("STATUS_SCREENSHOTS")
	metricsAddr := freeTCPAddr(t)
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	const cooldown = time.Hour
	if err := os.WriteFile(file, []byte(fmt.Sprintf(statusConfig, metricsAddr, cooldown, cooldown)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := caller{t: t, ctx: ctx, c: client}
	attempt := func(scope string, o admissionv1.Outcome, status int32) *admissionv1.RecordOutcomeResponse {
		t.Helper()
		p := c.pick(scope)
		r, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: scope, CallId: p.GetCallId(),
			PermitId: p.GetGrant().GetPermitId(), Outcome: o, HttpStatus: status})
		if err != nil {
			t.Fatalf("RecordOutcome(%s): %v", scope, err)
		}
		return r
	}
	if shots != "" {
		// Traffic for a few of the chart's intervals, some of it refused.
		for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); {
			for range 6 {
				attempt("chat", admissionv1.Outcome_OUTCOME_SUCCESS, 200)
				attempt("embed", admissionv1.Outcome_OUTCOME_SUCCESS, 200)
			}
			time.Sleep(2 * time.Second)
		}
	}
	for range 3 {
		attempt("chat", admissionv1.Outcome_OUTCOME_SUCCESS, 200)
		attempt("embed", admissionv1.Outcome_OUTCOME_SUCCESS, 200)
	}
	// The primary answers 503 and opens; the fallback answers 401 and opens.
	if r := attempt("chat", admissionv1.Outcome_OUTCOME_TRANSIENT, 503); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("the primary's 503 left its breaker %v", r.GetBreakerState())
	}
	if r := attempt("chat", admissionv1.Outcome_OUTCOME_SOURCE_DEAD, 401); r.GetBreakerState() != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("the fallback's 401 left its breaker %v", r.GetBreakerState())
	}
	if _, err := client.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{Scope: "embed", Source: "embed-b",
		Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "alice", Reason: "key rotation"}); err != nil {
		t.Fatal(err)
	}
	// Six calls of chat wait, held in OnNoRunnable until the test ends.
	const held = 6
	holdCtx, release := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { release(); wg.Wait() }()
	for range held {
		p := c.pick("chat")
		if p.GetNoRunnable() == nil {
			t.Fatalf("Pick with both sources OPEN: %v", p)
		}
		wg.Go(func() {
			_, err := client.OnNoRunnable(holdCtx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
			if status.Code(err) != codes.Canceled {
				t.Errorf("a held call was answered before the test let go: %v", err)
			}
		})
	}
	base := "http://" + metricsAddr
	eventually(t, ctx, "six calls waiting", func() bool {
		return strings.Contains(get(t, ctx, base+"/status?fragment=1"), "<b>6</b> calls waiting")
	})

	// --virtual-time-budget lets the page's timers run: its script fetches
	// the live part again and swaps it in (data-refreshed counts swaps).
	dom := html.UnescapeString(browse(t, ctx, base+"/status", "--dump-dom", "--virtual-time-budget=12000"))
	chat := section(t, dom, "chat")
	for _, want := range []string{
		`<section class="scope down" id="scope-chat">`,
		`<span class="badge">DOWN</span>`,
		`<span class="waiting some"><b>6</b> calls waiting</span>`,
		`<li>every source refuses</li>`,
		`<li>primary-llm OPEN: consecutive_failures, last HTTP 503 (transient)</li>`,
		`<li>fallback-llm OPEN: source_dead, last HTTP 401 (source_dead)</li>`,
		`<td class="wrap">HTTP 401 (source_dead), `,
		`<td>primary-llm</td><td>closed → open</td><td>consecutive_failures</td>`,
		`<svg class="chart"`,
	} {
		if !strings.Contains(chat, want) {
			t.Errorf("scope chat lacks %q:\n%s", want, chat)
		}
	}
	if next := regexp.MustCompile(`<span class="next">cooldown of (\S+) ends in (\S+), then it is probed</span>`).FindStringSubmatch(chat); next == nil {
		t.Errorf("scope chat does not say when the next probe comes:\n%s", chat)
	} else if left, err := time.ParseDuration(next[2]); err != nil || left <= 0 || left > cooldown || next[1] != "primary-llm" {
		t.Errorf("next probe: %q in %q (%v), want primary-llm's, within (0, %v]", next[1], next[2], err, cooldown)
	}
	if bars := strings.Count(chat, `<rect x=`); bars < 4 {
		t.Errorf("the chart of chat has %d bars, want grants, refusals, waits and failures", bars)
	}
	embed := section(t, dom, "embed")
	for _, want := range []string{
		`<section class="scope degraded" id="scope-embed">`,
		`<td class="FORCED">OPEN (forced by alice: "key rotation"; breaker CLOSED)</td>`,
		`override force_open by alice: “key rotation” → forced_open`,
	} {
		if !strings.Contains(embed, want) {
			t.Errorf("scope embed lacks %q:\n%s", want, embed)
		}
	}
	if m := regexp.MustCompile(`data-refreshed="(\d+)"`).FindStringSubmatch(dom); m == nil {
		t.Errorf("the page's script never swapped in a fresh copy:\n%s", dom)
	} else if n, _ := strconv.Atoi(m[1]); n < 1 {
		t.Errorf("data-refreshed %s", m[1])
	}
	if strings.Contains(dom, "<script src") || strings.Contains(dom, "http://") && !strings.Contains(dom, base) {
		t.Error("the page loads something from elsewhere")
	}

	// A filter by source and kind keeps one scope's transitions of that
	// source; the fragment is the live part alone.
	filtered := html.UnescapeString(get(t, ctx, base+"/status?scope=chat&source=fallback-llm&kind=transition&fragment=1"))
	if strings.Contains(filtered, "<html") || strings.Contains(filtered, `id="scope-embed"`) ||
		!strings.Contains(filtered, `<td>fallback-llm</td><td>closed → open</td><td>source_dead</td>`) ||
		strings.Contains(filtered, `<td>primary-llm</td><td>closed → open</td>`) {
		t.Errorf("the filtered fragment:\n%s", filtered)
	}

	if shots != "" {
		browse(t, ctx, base+"/status", "--screenshot="+filepath.Join(shots, "status.png"), "--window-size=1280,1450", "--hide-scrollbars")
		browse(t, ctx, base+"/status?scope=chat&source=primary-llm", "--screenshot="+filepath.Join(shots, "status-filtered.png"),
			"--window-size=1280,1000", "--hide-scrollbars")
	}

	var doc struct {
		Scopes []struct {
			Name     string `json:"name"`
			Headline struct {
				Health  string   `json:"health"`
				Why     []string `json:"why"`
				Waiting int      `json:"waiting_calls"`
			} `json:"headline"`
			Description struct {
				Sources []map[string]any `json:"sources"`
			} `json:"description"`
			Sources map[string]struct {
				OpenCause string `json:"open_cause"`
				Status    int    `json:"last_http_status"`
			} `json:"sources"`
			History []struct {
				Grants  int `json:"grants"`
				Waiting int `json:"waiting"`
			} `json:"history"`
		} `json:"scopes"`
		Transitions []struct{ Source, To, Kind, Action string } `json:"transitions"`
	}
	body := get(t, ctx, base+"/status.json")
	if err := json.Unmarshal([]byte(body), &doc); err != nil || len(doc.Scopes) != 2 {
		t.Fatalf("status.json (%v):\n%s", err, body)
	}
	js := doc.Scopes[0]
	if js.Name != "chat" || js.Headline.Health != "down" || js.Headline.Waiting != held ||
		js.Sources["fallback-llm"].OpenCause != "source_dead" || js.Sources["fallback-llm"].Status != 401 || len(js.History) != 60 ||
		js.History[59].Waiting != held {
		t.Errorf("status.json's chat: %+v", js)
	}
	for _, key := range []string{"epoch", "window_calls", "window_failures", "in_flight", "requests_last_minute"} {
		if _, ok := doc.Scopes[1].Description.Sources[0][key]; !ok {
			t.Errorf("status.json omits the zero %s of embed-a: %v", key, doc.Scopes[1].Description.Sources[0])
		}
	}
	if len(doc.Transitions) != 3 || doc.Transitions[0].Kind != "override" || doc.Transitions[0].Action != "force_open" {
		t.Errorf("transitions %+v, want the override newest, then the two openings", doc.Transitions)
	}
}

// section returns scope's <section> of the page.
func section(t *testing.T, dom, scope string) string {
	t.Helper()
	start := strings.Index(dom, `id="scope-`+scope+`"`)
	if start < 0 {
		t.Fatalf("the page has no section of scope %s:\n%s", scope, dom)
	}
	start = strings.LastIndex(dom[:start], "<section")
	end := strings.Index(dom[start:], "</section>")
	return dom[start : start+end]
}

func get(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}
