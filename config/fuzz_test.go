package config_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/polygate/polygate/config"
)

// FuzzParse: any YAML is either a configuration that holds the checker's
// promises or an error naming what is wrong; never a panic, never a
// half-checked configuration.
func FuzzParse(f *testing.F) {
	f.Add([]byte(string(config.Demo())))
	f.Add([]byte(full))
	f.Add([]byte("scopes: {chat: {sources: [{name: a}]}}"))
	f.Add([]byte("listen: unix:///tmp/p.sock\nlisten_mode: \"0660\"\nscopes: {chat: {backoff: {max_retry_after: 1m}, sources: [{name: a, tpm: 10}]}}"))
	f.Add([]byte("limits: {max_request_bytes: 1024}\nevents: {max_watchers: 1}\nscopes: {c: {sources: [{name: a}, {name: a}]}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if strings.Contains(string(data), "_file") {
			t.Skip("file keys read the file system")
		}
		cfg, err := config.Parse(data, nil)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error that says nothing")
			}
			return
		}
		if len(cfg.Scopes) == 0 {
			t.Fatal("a configuration without scopes")
		}
		for name, sc := range cfg.Scopes {
			if len(name) > config.MaxName || len(sc.Sources) == 0 {
				t.Fatalf("scope %q with %d sources", name, len(sc.Sources))
			}
			if sc.BackoffMax < sc.BackoffBase || sc.MaxRetryAfter <= 0 || sc.PollInterval > sc.StallWindow {
				t.Fatalf("scope %q: %+v", name, sc)
			}
			for _, s := range sc.Sources {
				if len(s.Name) > config.MaxName || s.Weight < 1 || s.MaxConcurrency < 1 || s.RPM < 0 || s.TPM < 0 ||
					s.Breaker.MaxCooldown < s.Breaker.Cooldown || s.Breaker.FailRate <= 0 || s.Breaker.FailRate > 1 ||
					s.Lease(sc.LeaseGrace) <= 0 || s.Breaker.ProbeTTL <= 0 {
					t.Fatalf("source %q of %q: %+v", s.Name, name, s)
				}
			}
		}
		if l := cfg.Limits; l.MaxRequestBytes < 1024 || l.MaxStreamsPerConnection < 1 || cfg.Events.MaxWatchers < 1 {
			t.Fatalf("limits %+v, events %+v", l, cfg.Events)
		}
		// What --check prints of it reads back as the same configuration:
		// printed again, it is the same document. (A secret given inline is
		// printed Redacted, which the loader refuses.)
		if cfg.Auth.Token != "" || cfg.Auth.OperatorToken != "" || cfg.Backend.Redis.Password != "" {
			return
		}
		for _, output := range config.Outputs {
			var once, twice bytes.Buffer
			if err := config.Print(&once, cfg, output); err != nil {
				t.Fatal(err)
			}
			again, err := config.Parse(once.Bytes(), nil)
			if err != nil {
				t.Fatalf("--output %s does not read back: %v\n%s", output, err, once.String())
			}
			if err := config.Print(&twice, again, output); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(once.Bytes(), twice.Bytes()) {
				t.Fatalf("--output %s printed again differs:\n%s\n---\n%s", output, once.String(), twice.String())
			}
		}
	})
}
