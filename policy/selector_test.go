package policy

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/inmem"
)

// The selector forgets the sources a reload removed.
func TestSelectorForgetsRemovedSources(t *testing.T) {
	parse := func(sources string) *config.Scope {
		cfg, err := config.Parse([]byte("scopes:\n  s:\n    sources: "+sources+"\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Scopes["s"]
	}
	s := NewScope(parse(`[{name: a}, {name: b}, {name: c}]`), inmem.New(nil), Options{})
	defer s.Close()
	_, srcs := s.snapshot()
	s.sel.order(srcs, nil, time.Now())
	if got := slices.Sorted(maps.Keys(s.sel.current)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("selector state for %v after a walk, want a b c", got)
	}
	s.Update(parse(`[{name: a}, {name: c}]`))
	if got := slices.Sorted(maps.Keys(s.sel.current)); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("selector state for %v after b was removed, want a c", got)
	}
}
