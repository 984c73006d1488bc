package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/polygate/polygate/internal/boundedfile"
)

// Bounds of the fair share: a tenant's weight, the tenants a scope names or
// tracks.
const (
	MaxTenantWeight = 1000
	MaxTenants      = 1024
)

// MaxConcurrency bounds a source's max_concurrency: 2^53, exact in Lua's
// doubles and in the pacer's float64 ceiling (2^63-1 came back from it as
// an int of 1).
const MaxConcurrency = 1 << 53

// MaxName is the longest scope or source name, in bytes; the sidecar refuses
// longer names in requests before looking them up.
const MaxName = 63

// MaxDuration bounds every duration key, as a call's deadline is bounded: far
// above any useful setting, and low enough that the durations derived from
// them (a lease is timeout + lease_grace, probe_ttl up to twice the slowest
// timeout) can never overflow into a negative duration.
const MaxDuration = 365 * 24 * time.Hour

var nameRE = regexp.MustCompile(fmt.Sprintf(`^[a-z0-9][a-z0-9_-]{0,%d}$`, MaxName-1))

var nameAllowed = fmt.Sprintf("a name is 1 to %d lowercase letters, digits, '_' or '-', starting with a letter or digit", MaxName)

// ValidName reports whether name is a valid scope, source or tenant name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// MaxErrors bounds the problems one error reports; the rest are counted.
const MaxErrors = 50

// joinAtMost joins the first MaxErrors of errs and says how many more there
// are, so that a file of thousands of problems is not a log line of
// megabytes.
func joinAtMost(errs []error) error {
	if len(errs) <= MaxErrors {
		return errors.Join(errs...)
	}
	shown := append(errs[:MaxErrors:MaxErrors], fmt.Errorf("and %d more problems", len(errs)-MaxErrors))
	return errors.Join(shown...)
}

// checker collects every problem of a configuration, so that one start
// reports all of them, each once: a scope's value that every source
// inherits is one problem, where it is written, not one per source.
type checker struct {
	errs []error
	seen map[string]bool
}

func (c *checker) fail(key string, value any, allowed string) {
	e := &FieldError{Key: key, Value: value, Allowed: allowed}
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	if msg := e.Error(); !c.seen[msg] {
		c.seen[msg] = true
		c.errs = append(c.errs, e)
	}
}

func (c *checker) oneOf(key, value string, allowed ...string) {
	if !slices.Contains(allowed, value) {
		msg := "allowed: " + strings.Join(allowed, ", ")
		if near := closest(value, allowed); near != "" {
			msg += "; did you mean " + near + "?"
		}
		c.fail(key, value, msg)
	}
}

func (c *checker) atLeast(key string, value, least int64) {
	if value < least {
		c.fail(key, value, fmt.Sprintf("must be at least %d", least))
	}
}

func (c *checker) between(key string, value, least, most int64) {
	if value < least || value > most {
		c.fail(key, value, fmt.Sprintf("must be from %d to %d", least, most))
	}
}

// duration checks a duration is a whole number of milliseconds from least to
// MaxDuration.
func (c *checker) duration(key string, d, least time.Duration) {
	switch {
	case d%time.Millisecond != 0:
		c.fail(key, d, "durations are whole milliseconds (a Go duration with a unit, e.g. 60s or 250ms)")
	case d < least:
		c.fail(key, d, "must be at least "+formatDuration(least))
	case d > MaxDuration:
		c.fail(key, d, "must be at most "+formatDuration(MaxDuration)+" (365 days)")
	}
}

func (c *checker) address(key, addr string, unix bool) {
	if unix && strings.HasPrefix(addr, "unix://") {
		if strings.TrimPrefix(addr, "unix://") == "" {
			c.fail(key, addr, "a unix socket needs a path: unix:///run/polygate.sock")
		}
		return
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		allowed := "expected host:port"
		if unix {
			allowed += " or unix:///path"
		}
		c.fail(key, addr, allowed)
	}
}

// pair refuses one of two keys that only make sense together.
func (c *checker) pair(keyA, a, keyB, b string) {
	switch {
	case a != "" && b == "":
		c.fail(keyB, b, "must be set with "+keyA)
	case a == "" && b != "":
		c.fail(keyA, a, "must be set with "+keyB)
	}
}

// readable checks that a configured file can be read now.
func (c *checker) readable(key, path string) {
	if path == "" {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		c.fail(key, path, fmt.Sprintf("a readable file (%v)", errors.Unwrap(err)))
		return
	}
	f.Close()
}

// maxSecret bounds a token read from a file.
const maxSecret = 4096

// secret is a token given inline (key) or in a file (key_file, e.g. a
// Kubernetes secret), without its trailing newline; "" when neither is set.
func (c *checker) secret(key string, inline, file *string) string {
	switch {
	case inline != nil && file != nil:
		c.fail(key+"_file", *file, "set "+key+" or "+key+"_file, not both")
		return ""
	case inline != nil:
		if *inline == Redacted {
			c.fail(key, *inline, "--check prints this in place of a secret; write the secret here, or set "+key+"_file or "+envName(key))
			return ""
		}
		if strings.TrimSpace(*inline) == "" {
			c.fail(key, "(blank)", "a token must not be blank; remove the key to turn it off")
		}
		return *inline
	case file != nil:
		b, err := boundedfile.Read(*file, maxSecret)
		if err != nil {
			c.fail(key+"_file", *file, fmt.Sprintf("a readable file of at most %d bytes holding the token (%v)", maxSecret, err))
			return ""
		}
		tok := strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(tok) == "" {
			c.fail(key+"_file", *file, "the file holds no token")
		}
		return tok
	}
	return ""
}

// fileMode reads a unix socket mode written as an octal string ("0660").
// A YAML number is refused: 0660 and 660 would read as different modes.
func (c *checker) fileMode(key string, v any) os.FileMode {
	const allowed = "an octal mode in quotes, e.g. \"0660\" (at most 0777)"
	switch v := v.(type) {
	case nil:
		return 0
	case string:
		if v == "" {
			return 0 // as --check prints an unset mode
		}
		m, err := strconv.ParseUint(strings.TrimPrefix(v, "0o"), 8, 32)
		if err != nil || m > 0o777 || m == 0 {
			c.fail(key, v, allowed)
			return 0
		}
		return os.FileMode(m)
	}
	c.fail(key, v, allowed)
	return 0
}
