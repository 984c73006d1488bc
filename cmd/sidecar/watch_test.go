package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

// configMap lays out dir as the kubelet mounts a ConfigMap: the data in a
// timestamped directory, ..data a symlink to it, and config.yaml a symlink
// through ..data. Each call writes a new data directory and swaps ..data
// atomically (a new link renamed over the old one), as the kubelet does.
type configMap struct {
	t   *testing.T
	dir string
	gen int
}

func (m *configMap) write(body string) {
	m.t.Helper()
	m.gen++
	data := "..2026_11_30_00_00_0" + string(rune('0'+m.gen))
	if err := os.Mkdir(filepath.Join(m.dir, data), 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, data, "config.yaml"), []byte(body), 0o644); err != nil {
		m.t.Fatal(err)
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(data, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
	if m.gen == 1 {
		if err := os.Symlink("..data/config.yaml", filepath.Join(m.dir, "config.yaml")); err != nil {
			m.t.Fatal(err)
		}
	}
}

// TestReloadOnConfigMapSwap: a ConfigMap update (the ..data symlink swap)
// reloads the configuration without a signal, logged as SIGHUP's reload is,
// and the new limit applies.
func TestReloadOnConfigMapSwap(t *testing.T) {
	m := &configMap{t: t, dir: t.TempDir()}
	m.write(strings.Replace(reloadConfig, "MAX", "1", 1))
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", filepath.Join(m.dir, "config.yaml")})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	concurrency := func() int32 {
		t.Helper()
		d, err := client.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Scope.Sources[0].Config.MaxConcurrency
	}
	if got := concurrency(); got != 1 {
		t.Fatalf("max_concurrency %d at start, want 1", got)
	}

	m.write(strings.Replace(reloadConfig, "MAX", "3", 1))
	for concurrency() != 3 {
		select {
		case <-ctx.Done():
			t.Fatalf("the swapped ConfigMap never applied:\n%s", s.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.WaitLog(t, ctx, "configuration reloaded")
	if !strings.Contains(s.Logs(), "configuration file changed; reloading") {
		t.Errorf("the reload does not say the file changed:\n%s", s.Logs())
	}

	// A bad update is rejected as a bad SIGHUP reload is; the limit stays.
	m.write("scopes: {chat: {max_attempts: 0, sources: [{name: only}]}}\n")
	s.WaitLog(t, ctx, "configuration reload rejected")
	if !strings.Contains(s.Logs(), "scopes.chat.max_attempts: 0 is not allowed") {
		t.Fatalf("the rejection does not say why:\n%s", s.Logs())
	}
	if got := concurrency(); got != 3 {
		t.Fatalf("max_concurrency %d after a rejected update, want 3", got)
	}
}
