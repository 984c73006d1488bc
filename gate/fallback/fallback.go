package fallback

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/internal/enum"
)

// Mode is what to do while the shared backend is unavailable.
type Mode uint8

const (
	// FailClosed returns the shared backend's error (the server answers
	// UNAVAILABLE); every call still tries the shared backend first.
	FailClosed Mode = iota
	// Local serves calls from a memory backend whose limits are this
	// replica's share, and checks at most every PingEvery whether the shared
	// backend answers again.
	Local
)

var modeNames = []string{
	FailClosed: "fail_closed",
	Local:      "local",
}

func (m Mode) String() string { return enum.String(m, modeNames) }

// Shared is the backend to protect: the Redis backend.
type Shared interface {
	gate.Backend
	// Ping reports whether the backend answers; its error wraps
	// gate.ErrUnavailable when it does not.
	Ping(ctx context.Context) error
}

// DefaultPingEvery is how often a degraded Local backend checks the shared one.
const DefaultPingEvery = time.Second

// Options configure a Backend.
type Options struct {
	Mode Mode
	// Replicas is how many replicas share the limits: the local backend
	// gives each source MaxConcurrency, RPM and TPM divided by it, rounded
	// up, at least 1 (a 0 limit stays unlimited). Values below 1 count as 1.
	Replicas int
	// PingEvery is the least time between two checks of the shared backend
	// while degraded in Local mode; default DefaultPingEvery.
	PingEvery time.Duration
	// OnChange is called once per change of mode, in order, with the error
	// that made the backend degraded (nil when it recovers). It must not
	// call the Backend.
	OnChange func(degraded bool, cause error)
	// Now is the clock of the local backend and of the checks; default time.Now.
	Now func() time.Time
}

// Backend is a gate.Backend that delegates to a shared one and follows
// Options.Mode while that one is unavailable.
//
// In Local mode the local backend knows of the shared state only what a
// Recorder remembers of its breakers (OPEN ones and overrides): a
// permit the shared backend granted and that is settled while degraded is
// reported stale (and handed to the shared backend to settle later, see
// Settle). Permits the local backend granted still hold their slots when
// the shared backend is back, which it does not know of: until they are
// settled (locally) or their leases end, its Admits and Peeks of their
// sources leave them room (see lent). The reverse holds too: permits the
// shared backend granted this replica still hold their slots when it goes
// away, which the local backend does not know of; until they are settled
// or their leases end, local Admits and Peeks of their sources leave them
// room (see out). Override is never served locally: an operator's action
// that would vanish when the shared backend comes back fails instead.
type Backend struct {
	shared Shared
	local  *inmem.Backend
	o      Options
	lent   lent
	out    out

	degraded atomic.Bool
	kept     atomic.Int64  // see Kept
	changes  atomic.Uint64 // counts changes of mode, twice each (odd while one is under way)
	nextPing atomic.Int64  // UnixNano of the next allowed check
	mu       sync.Mutex    // serializes changes of mode and their OnChange
}

var _ gate.Backend = (*Backend)(nil)

// New wraps shared.
func New(shared Shared, o Options) *Backend {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.PingEvery <= 0 {
		o.PingEvery = DefaultPingEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Backend{shared: shared, local: inmem.New(o.Now), o: o}
}

// Degraded reports whether the shared backend is currently held unavailable.
func (b *Backend) Degraded() bool { return b.degraded.Load() }

// Kept is how many of the local backend's breakers the last change to
// degraded (in Local mode) left OPEN, HALF_OPEN or overridden, from what the
// replica knew of the shared ones: OnChange may log it.
func (b *Backend) Kept() int { return int(b.kept.Load()) }

// Check asks the shared backend whether it answers, and records the answer
// as any call would: a change of mode is reported through OnChange.
func (b *Backend) Check(ctx context.Context) error {
	seen := b.changes.Load()
	err := b.shared.Ping(ctx)
	b.observe(err, seen)
	return err
}

// Admit implements gate.Backend. A permit granted by one side while the
// mode changed (a decision in flight at the switch) may not have been
// counted by the other side's decisions since: it is given back where it
// was granted and the Admit is asked again, once, so that the switch
// never makes more holders than the limits (see lent and out). The count
// of changes is read before call reads the mode, so that a change between
// the two is seen; an odd count is a change under way (see set).
func (b *Backend) Admit(ctx context.Context, req gate.AdmitRequest) (gate.Admission, error) {
	for try := 0; ; try++ {
		var racedShared, racedLocal bool
		seen := b.changes.Load()
		raced := func() bool { return seen%2 == 1 || b.changes.Load() != seen }
		a, err := call(b, ctx,
			func() (gate.Admission, error) {
				a, err := b.shared.Admit(ctx, b.leaveRoom(ctx, req))
				if err == nil && a.Granted && b.o.Mode == Local {
					b.out.add(req, a.Permit, b.o.Now())
					racedShared = raced()
				}
				return a, err
			},
			func() (gate.Admission, error) {
				a, err := b.local.Admit(ctx, b.leaveOut(b.share(b.localAdmit(req))))
				if err == nil && a.Granted {
					b.lent.add(req.Scope, a.Permit.Source)
					racedLocal = raced()
				}
				return a, err
			})
		if try > 0 || !(racedShared || racedLocal) {
			return a, err
		}
		give := gate.SettleRequest{Scope: req.Scope, Source: grantedSource(req, a.Permit), PermitID: a.Permit.ID,
			Epoch: a.Permit.Epoch, Probe: a.Permit.Probe, Verdict: gate.VerdictNone, ActualTokens: 0}
		// The same permit id again: the one given back no longer holds a
		// slot where it was granted, and the other side never had it.
		if racedLocal {
			_, _ = b.local.Settle(ctx, b.localSettle(give))
		} else {
			_, _ = b.Settle(ctx, give) // to Redis, or deferred for it
		}
	}
}

// grantedSource is the candidate of req that p is of.
func grantedSource(req gate.AdmitRequest, p gate.Permit) *gate.Source {
	for _, c := range req.Candidates {
		if c.Source.Name == p.Source {
			return c.Source
		}
	}
	return &gate.Source{Name: p.Source}
}

// Settle implements gate.Backend. A settle served locally may be of a
// permit the shared backend granted before it went away: a shared backend
// that can defer settles (a Deferrer) is handed it too, to settle when it
// answers again, so that its slot does not stay held until its lease ends.
func (b *Backend) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	// Its holder is done: a permit of the shared backend that the local
	// backend left room for frees that room.
	wasOut := req.Source != nil && b.out.remove(req.Scope, req.Source.Name, req.PermitID)
	return call(b, ctx,
		func() (gate.Settlement, error) {
			if req.Source != nil && b.lent.has(req.Scope, req.Source.Name) {
				// Perhaps a permit the local backend granted: settle it
				// there, where its slot is held.
				if st, err := b.local.Settle(ctx, b.localSettle(req)); err == nil && st.Released {
					return st, nil
				}
			}
			return b.shared.Settle(ctx, req)
		},
		func() (gate.Settlement, error) {
			if d, ok := b.shared.(Deferrer); ok {
				d.DeferSettle(req)
			}
			st, err := b.local.Settle(ctx, b.localSettle(req))
			st.Released = st.Released || wasOut // wakes callers held for its room (those in a line: the poller)
			return st, err
		})
}

// Recorder is a shared backend that remembers the OPEN breakers and the
// overrides it saw (redisgate's records of them). At each change to
// degraded in Local mode the local backend adopts them, with the probes
// of the shared backend this replica holds (see records and
// inmem.Backend.Adopt), so that a source forced open, OPEN or being probed
// in the shared backend stays so while it is away.
type Recorder interface {
	Records() []gate.Record
}

// Deferrer is a shared backend that can keep a settle until it answers.
type Deferrer interface {
	DeferSettle(req gate.SettleRequest)
}

// Peek implements gate.Backend.
// Its in_flight counts the other side's permits still out that its
// verdicts leave room for, so that a refusal is explained by what it shows.
func (b *Backend) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	return call(b, ctx,
		func() (gate.Snapshot, error) {
			n := b.room(ctx, req.Scope, req.Sources)
			snap, err := b.shared.Peek(ctx, lessPeek(req, n))
			return addInFlight(snap, n), err
		},
		func() (gate.Snapshot, error) {
			n := b.outOf(req.Scope, req.Sources)
			snap, err := b.local.Peek(ctx, lessPeek(b.sharePeek(b.localPeek(req)), n))
			return addInFlight(snap, n), err
		})
}

// addInFlight is snap with n[i] more in flight on source i (n may be nil).
func addInFlight(snap gate.Snapshot, n []int) gate.Snapshot {
	for i := range snap.Sources {
		if i < len(n) {
			snap.Sources[i].Quota.InFlight += n[i]
		}
	}
	return snap
}

// Leave implements gate.Backend.
func (b *Backend) Leave(ctx context.Context, req gate.LeaveRequest) error {
	_, err := call(b, ctx,
		func() (struct{}, error) { return struct{}{}, b.shared.Leave(ctx, req) },
		func() (struct{}, error) { return struct{}{}, b.local.Leave(ctx, req) })
	return err
}

// Override implements gate.Backend; it always goes to the shared backend.
func (b *Backend) Override(ctx context.Context, req gate.OverrideRequest) (gate.OverrideResult, error) {
	seen := b.changes.Load()
	r, err := b.shared.Override(ctx, req)
	b.observe(err, seen)
	return r, err
}
