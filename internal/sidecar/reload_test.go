package sidecar

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/admissiontest"
	"github.com/polygate/polygate/server"
)

// TestReloadKeepsRestartKeys reloads a file that changes a scope, the log
// level, the listen address and the telemetry path: the scope and the level
// apply, the other two are logged as needing a restart and keep their
// running values; a file that fails validation changes nothing.
func TestReloadKeepsRestartKeys(t *testing.T) {
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: 127.0.0.1:7000\nscopes: {chat: {sources: [{name: a}]}}\n")
	opts, err := config.ParseFlags([]string{"--config", file}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	running, err := config.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &admissiontest.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	srv := server.New(running, inmem.New(nil), log, server.Options{})
	t.Cleanup(srv.Close)

	write("listen: 127.0.0.1:7001\ntelemetry: {path: /tmp/t.db}\nlog: {level: debug}\nscopes: {chat: {sources: [{name: a}]}, more: {sources: [{name: b}]}}\n")
	next := reload(log, srv, running, opts, nil)
	if next == nil {
		t.Fatalf("reload rejected:\n%s", logs)
	}
	if next.Listen != "127.0.0.1:7000" || next.Telemetry.Path != "" || next.Log.Level != "debug" {
		t.Errorf("after reload: listen %q, telemetry.path %q, log.level %q; want the running listen and telemetry, the new level",
			next.Listen, next.Telemetry.Path, next.Log.Level)
	}
	if got := strings.Join(srv.Scopes(), ","); got != "chat,more" {
		t.Errorf("scopes %s after reload, want chat,more", got)
	}
	for _, want := range []string{
		`level=WARN msg="configuration reload: listen needs a restart; the running value stays" key=listen change="\"127.0.0.1:7000\" → \"127.0.0.1:7001\""`,
		`level=WARN msg="configuration reload: telemetry.path needs a restart; the running value stays" key=telemetry.path change="\"\" → \"/tmp/t.db\""`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if strings.Count(logs.String(), "needs a restart") != 2 {
		t.Errorf("want exactly two restart warnings:\n%s", logs)
	}

	write("scopes: {chat: {sources: [{name: a, weight: -1}]}}\n")
	if reload(log, srv, running, opts, nil) != nil {
		t.Fatal("a bad file was applied")
	}
	if got := strings.Join(srv.Scopes(), ","); got != "chat,more" {
		t.Errorf("scopes %s after a rejected reload, want chat,more", got)
	}
	if !strings.Contains(logs.String(), "configuration reload rejected") || !strings.Contains(logs.String(), "weight") {
		t.Errorf("the rejection does not say why:\n%s", logs)
	}
}
