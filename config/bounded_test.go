package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polygate/polygate/config"
)

// TestErrorsShowValuesBounded: a configuration error names the key and
// shows the value, but a hostile value (a 100 KB string from the file, the
// environment or a flag) is cut, so that a rejected reload's log line stays
// small.
func TestErrorsShowValuesBounded(t *testing.T) {
	long := strings.Repeat("A", 100_000)
	const ok = "scopes:\n  s:\n    sources: [{name: a}]\n"
	for _, tc := range []struct {
		name, yaml string
		env        []string
		key        string // the error names it
	}{
		{"enum", "scopes:\n  s:\n    circuit_open: " + long + "\n    sources: [{name: a}]\n", nil, "scopes.s.circuit_open"},
		{"source name", "scopes:\n  s:\n    sources: [{name: " + long + "}]\n", nil, "scopes.s.sources[0].name"},
		{"address", "listen: " + long + "\n" + ok, nil, "listen"},
		{"redis address", "backend: {kind: redis, redis: {addrs: [" + long + "]}}\n" + ok, nil, "backend.redis.addrs[0]"},
		{"duration", "scopes:\n  s:\n    backoff: {base: " + long + "}\n    sources: [{name: a}]\n", nil, "backoff.base"},
		{"number", "scopes:\n  s:\n    max_attempts: " + long + "\n    sources: [{name: a}]\n", nil, "max_attempts"},
		{"environment value", ok, []string{"POLYGATE_SCOPES__S__CIRCUIT_OPEN=" + long}, "scopes.s.circuit_open"},
		{"environment key", ok, []string{"POLYGATE_" + long + "=1"}, "unknown key"},
		{"environment source", ok, []string{"POLYGATE_SCOPES__S__SOURCES__" + long + "__RPM=1"}, "POLYGATE_SCOPES__S__SOURCES__"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml), tc.env)
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.key) {
				t.Errorf("error does not name %s: %.300s", tc.key, msg)
			}
			if len(msg) > 1024 {
				t.Errorf("error of %d bytes for a value of %d: %.300s…", len(msg), len(long), msg)
			}
			var fe *config.FieldError
			if errors.As(err, &fe) && fe.Value == nil {
				t.Errorf("FieldError without its value")
			}
		})
	}
}

// TestMaxConcurrencyIsBounded: max_concurrency is at most 2^53 (exact in
// Lua's doubles and in the pacer's float64 ceiling). Were 2^63-1, written
// to mean "no real limit", accepted, the pacer's ceiling, float64(2^63-1)
// converted back to int, would wrap to its floor of 1: the source would
// serve one attempt at a time.
func TestMaxConcurrencyIsBounded(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{"9007199254740992", true}, // 2^53
		{"9007199254740993", false},
		{"9223372036854775807", false},
	} {
		_, err := config.Parse([]byte("scopes:\n  s:\n    sources: [{name: a, max_concurrency: "+tc.value+"}]\n"), nil)
		var fe *config.FieldError
		switch {
		case tc.ok && err != nil:
			t.Errorf("max_concurrency %s: %v, want accepted", tc.value, err)
		case !tc.ok && (!errors.As(err, &fe) || fe.Key != "scopes.s.sources.a.max_concurrency"):
			t.Errorf("max_concurrency %s: %v, want refused naming scopes.s.sources.a.max_concurrency", tc.value, err)
		}
	}
}

// TestConfigFileIsBounded: the configuration file is read up to
// config.MaxFileBytes (a Kubernetes ConfigMap holds at most 1 MiB); a
// larger one (--config pointed at a log by mistake) is refused with its
// path, not read whole into memory at every reload.
func TestConfigFileIsBounded(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.yaml")
	body := "scopes:\n  s:\n    sources: [{name: a}]\n"
	if err := os.WriteFile(ok, []byte(body+strings.Repeat("#", config.MaxFileBytes-len(body)-1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(config.Options{File: ok}, nil); err != nil {
		t.Fatalf("a file of config.MaxFileBytes: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(body+strings.Repeat("#", config.MaxFileBytes-len(body))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(config.Options{File: big}, nil)
	if err == nil || !strings.Contains(err.Error(), big) || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("a file one byte over config.MaxFileBytes: %v, want refused naming it and the limit", err)
	}
}

// TestManyErrorsAreCounted: a file with thousands of problems reports the
// first config.MaxErrors of them and how many more there are, not a log
// line of megabytes.
func TestManyErrorsAreCounted(t *testing.T) {
	var b strings.Builder
	b.WriteString("scopes:\n  s:\n    sources:\n")
	const n = 5000
	for i := range n {
		fmt.Fprintf(&b, "      - {name: s%d, weight: 0}\n", i)
	}
	_, err := config.Parse([]byte(b.String()), nil)
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if got := strings.Count(msg, ".weight:"); got != config.MaxErrors {
		t.Errorf("%d problems shown, want config.MaxErrors = %d", got, config.MaxErrors)
	}
	if want := fmt.Sprintf("and %d more", n-config.MaxErrors); !strings.Contains(msg, want) {
		t.Errorf("error does not say %q: …%s", want, msg[max(0, len(msg)-200):])
	}
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		t.Error("the shown problems are no longer FieldErrors")
	}
}

// TestManyDecodeErrorsAreCounted: the decoder's problems (unknown keys,
// wrong types) are cut to config.MaxErrors too.
func TestManyDecodeErrorsAreCounted(t *testing.T) {
	var b strings.Builder
	b.WriteString("scopes:\n  s:\n    sources:\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "      - {name: s%d, weight: many}\n", i)
	}
	_, err := config.Parse([]byte(b.String()), nil)
	if err == nil {
		t.Fatal("accepted")
	}
	if lines := strings.Count(err.Error(), "\n"); lines > config.MaxErrors+1 {
		t.Errorf("an error of %d lines, want at most config.MaxErrors + 1 = %d", lines, config.MaxErrors+1)
	}
	if !strings.Contains(err.Error(), "weight") || !strings.Contains(err.Error(), "more problems") {
		t.Errorf("error %.300s…, want the key named and the rest counted", err)
	}
}
