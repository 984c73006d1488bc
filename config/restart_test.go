package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
)

const restartBase = `
listen: 127.0.0.1:7000
backend: {kind: redis, redis: {addrs: ['a:6379'], password: hunter2}}
scopes: {chat: {sources: [{name: primary}]}}
`

// TestKeepRestartKeys reloads a changed file over a running one: keys that
// need a restart are reported (key, running value, file value) and set back
// to the running value; every other change stays in the new configuration.
func TestKeepRestartKeys(t *testing.T) {
	long := "/var/lib/polygate/" + strings.Repeat("é", 100) + ".db"
	for _, tc := range []struct {
		name string
		// edit turns restartBase into the reloaded file.
		edit func(string) string
		want []config.Change
		// applied checks what the reload keeps of the new file.
		applied func(t *testing.T, next *config.Config)
	}{
		{name: "nothing changed", edit: func(s string) string { return s }},
		{
			name: "scopes, log.level and auth.token apply",
			edit: func(s string) string {
				return strings.Replace(s, "name: primary", "name: primary, max_concurrency: 3", 1) + "log: {level: debug}\nauth: {token: t}\n"
			},
			applied: func(t *testing.T, next *config.Config) {
				if next.Scopes["chat"].Sources[0].MaxConcurrency != 3 || next.Log.Level != "debug" || next.Auth.Token != "t" {
					t.Errorf("reload lost a change that applies: %+v", next)
				}
			},
		},
		{
			name: "listen",
			edit: func(s string) string { return strings.Replace(s, "7000", "7001", 1) },
			want: []config.Change{{Key: "listen", Old: `"127.0.0.1:7000"`, New: `"127.0.0.1:7001"`}},
		},
		{
			name: "listen and log.format and a scope, in table order",
			edit: func(s string) string {
				return strings.Replace(strings.Replace(s, "7000", "7001", 1), "name: primary", "name: primary, rpm: 10", 1) + "log: {format: json}\n"
			},
			want: []config.Change{
				{Key: "listen", Old: `"127.0.0.1:7000"`, New: `"127.0.0.1:7001"`},
				{Key: "log.format", Old: `"text"`, New: `"json"`},
			},
			applied: func(t *testing.T, next *config.Config) {
				if next.Scopes["chat"].Sources[0].RPM != 10 {
					t.Errorf("the scope change was not kept")
				}
			},
		},
		{
			name: "backend.redis.addrs",
			edit: func(s string) string { return strings.Replace(s, "['a:6379']", "['a:6379', 'b:6379']", 1) },
			want: []config.Change{{Key: "backend.redis.addrs", Old: `["a:6379"]`, New: `["a:6379" "b:6379"]`}},
		},
		{
			name: "a secret is never shown",
			edit: func(s string) string { return strings.Replace(s, "hunter2", "hunter3", 1) },
			want: []config.Change{{Key: "backend.redis.password", Old: "(redacted)", New: "(redacted)"}},
		},
		{
			name: "a long value is cut on a character boundary",
			edit: func(s string) string { return s + "telemetry: {path: " + long + "}\n" },
			want: []config.Change{{Key: "telemetry.path", Old: `""`, New: `"/var/lib/polygate/` + strings.Repeat("é", 50) + `… (223 bytes)`}},
		},
		{
			name: "backend.kind",
			edit: func(s string) string { return strings.Replace(s, "kind: redis", "kind: memory", 1) },
			want: []config.Change{{Key: "backend.kind", Old: `"redis"`, New: `"memory"`}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			running := parse(t, restartBase)
			next := parse(t, tc.edit(restartBase))
			got := next.KeepRestartKeys(running)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("changes\n got %q\nwant %q", got, tc.want)
			}
			if next.Listen != running.Listen || !reflect.DeepEqual(next.Backend, running.Backend) || next.Telemetry != running.Telemetry ||
				next.Events != running.Events || next.MetricsListen != running.MetricsListen || next.Log.Format != running.Log.Format {
				t.Errorf("a key that needs a restart kept the file's value: %+v", next)
			}
			if tc.applied != nil {
				tc.applied(t, next)
			}
		})
	}
}

// TestEveryRestartSectionFieldIsAKey changes each field of the sections built
// at start, one at a time, and checks that KeepRestartKeys reports it and
// undoes it: a field added to backend, telemetry or events without a row in
// the restart table fails here.
func TestEveryRestartSectionFieldIsAKey(t *testing.T) {
	running := parse(t, restartBase)
	sections := []string{"Listen", "ListenMode", "TLS", "Limits", "MetricsListen", "Backend", "Telemetry", "Events"}
	var leaves [][]int
	var walk func(tp reflect.Type, path []int)
	walk = func(tp reflect.Type, path []int) {
		if tp.Kind() != reflect.Struct {
			leaves = append(leaves, path)
			return
		}
		for i := range tp.NumField() {
			walk(tp.Field(i).Type, append(append([]int(nil), path...), i))
		}
	}
	ct := reflect.TypeFor[config.Config]()
	for _, name := range sections {
		f, _ := ct.FieldByName(name)
		walk(f.Type, f.Index)
	}
	logFormat, _ := ct.FieldByName("Log")
	format, _ := logFormat.Type.FieldByName("Format")
	leaves = append(leaves, append(logFormat.Index, format.Index...))

	for _, path := range leaves {
		next := parse(t, restartBase)
		v := reflect.ValueOf(next).Elem().FieldByIndex(path)
		name := ct.FieldByIndex(path).Name
		switch {
		case v.Type() == reflect.TypeFor[time.Duration]():
			v.SetInt(v.Int() + int64(time.Second))
		case v.Kind() == reflect.String:
			v.SetString(v.String() + "x")
		case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
			v.SetInt(v.Int() + 1)
		case v.Kind() == reflect.Uint32 || v.Kind() == reflect.Uint64 || v.Kind() == reflect.Uint:
			v.SetUint(v.Uint() + 1)
		case v.Kind() == reflect.Bool:
			v.SetBool(!v.Bool())
		case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
			v.Set(reflect.Append(v, reflect.ValueOf("x:1")))
		default:
			t.Fatalf("field %s of kind %s: teach this test to change it", name, v.Kind())
		}
		if got := next.KeepRestartKeys(running); len(got) != 1 {
			t.Errorf("changing %s: %d restart changes reported, want 1", name, len(got))
		}
		if !reflect.DeepEqual(next.Backend, running.Backend) || next.Telemetry != running.Telemetry || next.Events != running.Events ||
			next.Listen != running.Listen || next.ListenMode != running.ListenMode || next.TLS != running.TLS || next.Limits != running.Limits || next.MetricsListen != running.MetricsListen || next.Log != running.Log {
			t.Errorf("changing %s: not set back to the running value", name)
		}
	}
	if n := len(config.RestartKeys()); n != len(leaves) {
		t.Errorf("%d restart keys for %d fields", n, len(leaves))
	}
}

func parse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
