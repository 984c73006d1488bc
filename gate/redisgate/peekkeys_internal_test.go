package redisgate

import (
	"fmt"
	"testing"

	"github.com/polygate/polygate/gate"
)

// The peek keys kept per scope follow reloads past maxPeekKeys scopes: a
// kept scope whose sources changed is replaced, and a new scope past the
// bound clears them (once, they neither followed a changed scope nor let go
// of a removed one past the bound). Scopes come from the configuration, so
// the bound is reached by reloads that rename scopes.
func TestPeekKeysFollowReloadsPastTheBound(t *testing.T) {
	b := &Backend{}
	one := []*gate.Source{{Name: "a"}}
	for i := range maxPeekKeys {
		b.peekKeysOf(fmt.Sprint("scope", i), one)
	}
	reloaded := []*gate.Source{{Name: "a"}, {Name: "b"}} // scope0 now has two sources
	first := b.peekKeysOf("scope0", reloaded)
	if again := b.peekKeysOf("scope0", reloaded); again != first {
		t.Fatalf("scope0's keys after its sources changed are made anew on every peek (%d scopes kept, none evicted)", b.npeeks.Load())
	}
}

// What growStack costs a peek when the stack already has room (a lone
// RetryAfter's handler, whose stack the last read grew): its 5 KB frame
// zeroed.
func BenchmarkGrowStack(b *testing.B) {
	for b.Loop() {
		growStack(0)
	}
}
