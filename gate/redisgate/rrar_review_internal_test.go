package redisgate

import (
	"fmt"
	"testing"

	"github.com/polygate/polygate/gate"
)

// Review (rrar): the peek keys kept per scope stop following reloads once
// maxPeekKeys scopes were ever kept: nothing is evicted (a removed scope's
// keys stay for good), and a kept scope whose sources changed is not
// replaced (Swap only runs below the bound), so each of its peeks makes its
// keys anew, for as long as the process lives. Scopes come from the
// configuration, so the bound is reached by reloads that rename scopes.
func TestReviewPeekKeysFollowReloadsPastTheBound(t *testing.T) {
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
