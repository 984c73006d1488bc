package redisgate

import "slices"

// Gathering is how many ops of scope wait for its next call.
func (b *Backend) Gathering(scope string) int {
	b.batches.mu.Lock()
	defer b.batches.mu.Unlock()
	if q := b.batches.scopes[scope]; q != nil {
		return len(q.ops)
	}
	return 0
}

// SourceKey is the key of a source's state (which: "state", "leases",
// "minute", "tokens", "line", "waiters"), for tests that look at what is
// stored.
func (b *Backend) SourceKey(scope, source, which string) string {
	i := slices.Index(sourceKeys, ":"+which)
	if i < 0 {
		panic("no source key " + which)
	}
	return b.tag(scope) + ":src4:" + source + sourceKeys[i]
}

// ScopeKey is the key of a scope's progress, marker or tombstones.
func (b *Backend) ScopeKey(scope, which string) string {
	i := slices.Index(scopeKeys, ":"+which)
	if i < 0 {
		panic("no scope key " + which)
	}
	return b.tag(scope) + scopeKeys[i]
}

// Function is the name of the library's function.
var Function = fn

// SetMaxQueuedOps sets the bound of a scope's waiting ops, for a test.
func SetMaxQueuedOps(n int) (restore func()) {
	old := maxQueuedOps
	maxQueuedOps = n
	return func() { maxQueuedOps = old }
}

// WatchedScopes is how many scopes the Backend keeps a loss watch of.
func (b *Backend) WatchedScopes() int {
	b.loss.mu.Lock()
	defer b.loss.mu.Unlock()
	return len(b.loss.scopes)
}

// MaxRecords is the bound of the breakers a Backend remembers.
const MaxRecords = maxRecords
