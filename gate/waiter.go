package gate

import (
	"slices"
	"strings"
	"time"
)

// DescribeMax bounds what a describe reads of a line: its first DescribeMax
// waiters in line order (those served next) are checked for a replica gone
// and counted in Oldest and Groups; Length counts every waiter. On Redis a
// waiter read is a command of the line's script, and DescribeScope is what
// the status page refreshes: a whole line of LineCap would hold the shared
// Redis for tens of milliseconds per source each time. (The proto's
// SourceLine says 256.)
const DescribeMax = 256

// Waiter names a call in a source's line.
type Waiter struct {
	ID string
	// Replica holds the waiter; "" is the backend's own (the Redis backend
	// fills in its replica id).
	Replica  string
	Priority int32
	Tenant   string
	// Named: the configuration names Tenant, so it always has a bucket of
	// its own in the share table; MaxTenants bounds the buckets of the
	// tenants it does not name.
	Named bool
	// Weight is the tenant's weight, OtherWeight the overflow bucket's.
	Weight, OtherWeight int
	MaxTenants          int
	Aging               time.Duration
	// Lease is how long the replica is trusted without being heard from,
	// and how long a called waiter has to ask.
	Lease time.Duration
	// Place is the place the waiter had in the line at hand ("" none), to
	// take back; Places are its places by source, as the backend's Admit
	// and Peek take them (each line gets its source's as Place).
	Place  string
	Places map[string]string
}

// At is w in source's line: its place there as Place.
func (w *Waiter) At(source string) *Waiter {
	at := *w
	at.Place = w.Places[source]
	return &at
}

// LineRead asks Peek about the line.
type LineRead struct {
	Replica string
	Lease   time.Duration
	// Join, when set, gives the waiter a place (or keeps the one it has) in
	// the lines of the sources named in Joins, those that refused it for
	// capacity.
	Join  *Waiter
	Joins []string
	// Describe counts the line's first DescribeMax waiters (Oldest, Groups).
	Describe bool
}

// LineView is Peek's read of the line.
type LineView struct {
	Length int
	// Place is the place of Join's waiter ("" when the line is full).
	Place string
	// Wake are the replica's waiters handed a slot they have not asked for
	// yet; Head is the replica's waiter at the head of the line when no
	// handed slot is outstanding ("" otherwise).
	Wake []string
	Head string
	// Oldest and Groups are of the first DescribeMax waiters (Describe).
	Oldest time.Duration
	Groups []LineGroup
}

// LineGroup counts the waiters of one priority and tenant.
type LineGroup struct {
	Priority int32
	Tenant   string
	Waiting  int
}

// LineHandoff asks Settle to hand a released slot to the line.
type LineHandoff struct {
	Replica string
	Lease   time.Duration
}

// LeaveRequest takes a waiter out of the lines of some of a scope's sources.
type LeaveRequest struct {
	Scope  string
	Waiter string
	// Sources are the lines to leave.
	Sources []string
}

// SortGroups orders groups highest priority first, then by tenant.
func SortGroups(gs []LineGroup) {
	slices.SortFunc(gs, func(a, b LineGroup) int {
		if a.Priority != b.Priority {
			return int(b.Priority) - int(a.Priority)
		}
		return strings.Compare(a.Tenant, b.Tenant)
	})
}

// CapacityRefused reports whether a walk's refusals include one for capacity
// (a quota or the pacer) rather than only breakers.
func CapacityRefused(rs []Rejection) bool {
	for _, r := range rs {
		if r.Reason == ReasonRateLimited || r.Reason == ReasonAdaptivePaced || r.Reason == ReasonQueued {
			return true
		}
	}
	return false
}
