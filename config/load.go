package config

import (
	_ "embed"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"

	"github.com/polygate/polygate/internal/boundedfile"
)

//go:embed demo.yaml
var demo []byte

// Demo returns the embedded default configuration's YAML.
func Demo() []byte { return demo }

// EnvPrefix starts every environment variable the sidecar reads.
const EnvPrefix = "POLYGATE_"

// Options are the command line's view of the configuration.
type Options struct {
	// File is the YAML file (--config or POLYGATE_CONFIG); empty serves the
	// embedded demo.
	File string
	// Check: validate, print the effective configuration in Output ("yaml"
	// or "json") and exit.
	Check  bool
	Output string
	// Version: print the version and exit.
	Version bool
	// flags set on the command line, as configuration keys.
	flags map[string]string
}

// ParseFlags reads the command line. environ supplies POLYGATE_CONFIG.
func ParseFlags(args []string, environ []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("polygate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.StringVar(&o.File, "config", lookup(environ, EnvPrefix+"CONFIG"), "YAML configuration `file` (env POLYGATE_CONFIG); none serves the embedded demo scope")
	fs.BoolVar(&o.Check, "check", false, "validate the configuration, print it with every default filled in (as --output) and exit")
	fs.StringVar(&o.Output, "output", "yaml", "`format` of --check: yaml or json")
	fs.BoolVar(&o.Version, "version", false, "print the version, revision and Go version and exit")
	listen := fs.String("listen", "", "gRPC listen `address`, host:port or unix:///path (env POLYGATE_LISTEN)")
	metrics := fs.String("metrics-listen", "", "Prometheus listen `address` host:port (env POLYGATE_METRICS_LISTEN)")
	level := fs.String("log-level", "", "log `level`: debug, info, warn, error (env POLYGATE_LOG__LEVEL)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %s: polygate takes flags only", shown(fs.Args()))
	}
	if !slices.Contains(Outputs, o.Output) {
		return o, fmt.Errorf("--output: %s is not allowed; allowed: %s", shown(o.Output), strings.Join(Outputs, ", "))
	}
	o.flags = map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "listen":
			o.flags["listen"] = *listen
		case "metrics-listen":
			o.flags["metrics_listen"] = *metrics
		case "log-level":
			o.flags["log.level"] = *level
		}
	})
	return o, nil
}

func lookup(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// applicationVariables are the POLYGATE_ variables the SDKs and polygatectl
// read (lowercased, without the prefix). An application and its sidecar may
// share an environment (one shell, one env file, an envFrom given to both
// containers): the sidecar passes over them instead of refusing them as
// unknown keys.
var applicationVariables = []string{"addr", "token", "on_sidecar_unavailable"}

// MaxFileBytes bounds the configuration file (a Kubernetes ConfigMap holds
// at most 1 MiB): a larger one is refused, not read whole at every reload.
const MaxFileBytes = 4 << 20

// Load builds the configuration from, in increasing precedence, the YAML file
// (or the embedded demo), POLYGATE_ environment variables (__ between levels;
// a source is addressed by its name: POLYGATE_SCOPES__CHAT__SOURCES__PRIMARY__RPM)
// and flags, and validates it.
func Load(o Options, environ []string) (*Config, error) {
	k := koanf.New(".")
	var err error
	if o.File == "" {
		err = k.Load(rawbytes.Provider(demo), yaml.Parser())
	} else {
		var data []byte
		if data, err = boundedfile.Read(o.File, MaxFileBytes); err == nil {
			err = k.Load(rawbytes.Provider(data), yaml.Parser())
		}
	}
	if err != nil {
		name := o.File
		if name == "" {
			name = "embedded demo"
		}
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	return load(k, o.flags, environ)
}

// Parse validates a YAML configuration, with environ's POLYGATE_ variables over it.
func Parse(data []byte, environ []string) (*Config, error) {
	k := koanf.New(".")
	if err := k.Load(rawbytes.Provider(data), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return load(k, nil, environ)
}

func load(k *koanf.Koanf, flags map[string]string, environ []string) (*Config, error) {

	ek := koanf.New(".")
	if err := ek.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(key, value string) (string, any) {
			key = strings.ToLower(strings.TrimPrefix(key, EnvPrefix))
			if key == "config" || slices.Contains(applicationVariables, key) {
				return "", nil
			}
			return strings.ReplaceAll(key, "__", "."), value
		},
	}), nil); err != nil {
		return nil, fmt.Errorf("config environment: %w", err)
	}
	var errs []error
	for key, value := range ek.All() {
		if err := set(k, key, value); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", cut(envName(key), maxLine), err))
		}
	}
	for key, value := range flags {
		if err := set(k, key, value); err != nil {
			errs = append(errs, fmt.Errorf("flag for %s: %w", cut(key, maxLine), err))
		}
	}
	if len(errs) > 0 {
		return nil, joinAtMost(errs)
	}

	var f fileConfig
	if errs := decode(k.Raw(), &f); len(errs) > 0 {
		return nil, joinAtMost(errs)
	}
	return resolve(&f)
}

// set writes one overriding key. A key inside a scope's source list names the
// source: scopes.<scope>.sources.<source>.<key...>.
func set(k *koanf.Koanf, key string, value any) error {
	parts := strings.Split(key, ".")
	if len(parts) < 5 || parts[0] != "scopes" || parts[2] != "sources" {
		return k.Set(key, value)
	}
	listKey := strings.Join(parts[:3], ".")
	list, _ := k.Get(listKey).([]any)
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok || m["name"] != parts[3] {
			continue
		}
		for _, p := range parts[4 : len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = value
		list[i] = item
		return k.Set(listKey, list)
	}
	return fmt.Errorf("scope %s has no source named %s to override", shown(parts[1]), shown(parts[3]))
}

// envName is the environment variable that sets key.
func envName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}
