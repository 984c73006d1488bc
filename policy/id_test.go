package policy_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/polygate/polygate/policy"
)

// An id is its kind, a dash and 26 base32 characters (128 random bits), the
// form clients and the server's validation know; ids do not repeat, and a
// kind longer than the stack buffer is kept whole.
func TestNewIDForm(t *testing.T) {
	seen := map[string]bool{}
	for _, kind := range []string{"c", "p", "", "kind1234", strings.Repeat("k", 40)} {
		form := regexp.MustCompile("^" + regexp.QuoteMeta(kind) + "-[A-Z2-7]{26}$")
		for range 100 {
			id := policy.NewID(kind)
			if !form.MatchString(id) {
				t.Fatalf("NewID(%q) = %q, want %s", kind, id, form)
			}
			if seen[id] {
				t.Fatalf("NewID(%q) repeated %q", kind, id)
			}
			seen[id] = true
		}
	}
}
