package server

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
)

// Server implements admissionv1.AdmissionServiceServer over a set of scopes
// sharing one backend.
type Server struct {
	admissionv1.UnimplementedAdmissionServiceServer

	backend     gate.Backend
	backendName func() string
	stateLoss   func(scope string) gate.StateLoss
	log         *slog.Logger
	observer    observers
	events      *hub
	calls       *sessions
	waits       *waitLog

	mu     sync.RWMutex
	scopes map[string]*policy.Scope
	// removed are scopes a reload removed, kept while calls of theirs may
	// still report (or cancel) the permits they hold: see Apply.
	removed map[string]*policy.Scope
	// confs are the served configuration's source messages (Apply).
	confs atomic.Pointer[sourceConfigs]
}

// Options tunes a Server; zero values take a backend named "memory". The
// clock is time.Now, as in policy: tests that step time run in
// testing/synctest bubbles.
type Options struct {
	// BackendName describes the backend for DescribeScope.
	BackendName func() string
	// StateLoss, for a shared backend that can lose a scope's state (Redis),
	// is what this replica saw of it, for DescribeScope.
	StateLoss func(scope string) gate.StateLoss
	// Observers are told every decision, after the built-in log observer
	// and event hub. An observer that also implements Abandoned(*policy.Call,
	// string) is told of calls that end without a decision (expired idle,
	// or open at shutdown); one that implements BackendChanged(bool) of the
	// backend's health.
	Observers []policy.Observer
	// WatchBuffer is each WatchEvents stream's buffer (DefaultWatchBuffer if 0).
	WatchBuffer int
}

// New returns a server for cfg's scopes over backend.
func New(cfg *config.Config, backend gate.Backend, log *slog.Logger, o Options) *Server {
	if o.BackendName == nil {
		o.BackendName = func() string { return "memory" }
	}
	events := newHub(o.WatchBuffer, cfg.Events.MaxWatchers)
	waits := newWaitLog(log, time.Now())
	s := &Server{
		backend: backend, backendName: o.BackendName, stateLoss: o.StateLoss, log: log,
		observer: append(observers{logObserver{log: log, waits: waits}, events}, o.Observers...),
		events:   events,
		waits:    waits,
		calls:    newSessions(cfg.Calls.MaxLive, cfg.Calls.IdleTimeout),
		scopes:   make(map[string]*policy.Scope),
		removed:  make(map[string]*policy.Scope),
	}
	s.Apply(cfg)
	return s
}

// Apply makes cfg's scopes the served ones: existing scopes take their new
// limits and keep their breaker and quota state, new ones start, removed ones
// stop being served: a new Pick answers NOT_FOUND, but their open calls can
// still RecordOutcome and CancelCall, which settle the permit (freeing its
// slot) and end the call with scope_removed; a call held in OnNoRunnable is
// answered scope_removed at once, and so is a later one. Every call of a
// removed scope leaves the scope's lines at once, so that none holds a place
// there if the scope comes back. A removed scope is forgotten once none of
// its calls is live (Sweep), or when it is added again.
func (s *Server) Apply(cfg *config.Config) {
	s.calls.configure(cfg.Calls.MaxLive, cfg.Calls.IdleTimeout)
	confs := newSourceConfigs(cfg)
	s.confs.Store(&confs)
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]*policy.Scope, len(cfg.Scopes))
	for name, sc := range cfg.Scopes {
		if cur, ok := s.scopes[name]; ok {
			cur.Update(sc)
			next[name] = cur
			continue
		}
		next[name] = policy.NewScope(sc, s.backend, policy.Options{Observer: s.observer})
	}
	for name, sc := range s.scopes {
		if _, ok := next[name]; !ok {
			sc.Remove()
			s.removed[name] = sc
			go s.unqueue(sc) // the backend is not asked under the lock
		}
	}
	for name := range next {
		delete(s.removed, name)
	}
	s.scopes = next
}

// unqueue takes every live call of sc, a removed scope, out of its lines.
func (s *Server) unqueue(sc *policy.Scope) {
	for _, c := range s.calls.liveCalls() {
		if c.Scope == sc.Name() {
			sc.Forget(c)
		}
	}
}

// Close ends every server-side wait, answering with the rest of its sleep,
// and every WatchEvents stream, so that a graceful stop does not wait for
// sleeping callers or watchers.
func (s *Server) Close() {
	s.events.close()
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, sc := range s.scopes {
		sc.Close()
	}
}

// LiveCalls is the number of open calls of scope.
func (s *Server) LiveCalls(scope string) int { return s.calls.liveIn(scope) }

// TenantLiveCalls counts the open calls of each tenant of d, a description
// of scope, index by index (~other: every tenant the scope does not name).
func (s *Server) TenantLiveCalls(scope string, d policy.Description) []int {
	if len(d.Tenants) == 0 {
		return nil // a describe that failed
	}
	names := make([]string, len(d.Tenants))
	for i, t := range d.Tenants {
		names[i] = t.Name
	}
	return s.calls.tenantsLive(scope, names, d.Config.Tenants)
}

// EventCounts are the event hub's counters, for metrics.
type EventCounts struct {
	// Watchers is the number of WatchEvents streams connected now.
	Watchers int
	// Published counts events published while a watcher was connected;
	// Dropped, events lost by watchers whose buffer was full (summed).
	Published, Dropped uint64
	// Refused counts streams refused at events.max_watchers; Undecodable,
	// admission requests that did not decode.
	Refused, Undecodable uint64
}

// EventCounts reads the event hub's counters.
func (s *Server) EventCounts() EventCounts {
	return EventCounts{Watchers: int(s.events.watching.Load()), Published: s.events.published.Load(), Dropped: s.events.dropped.Load(),
		Refused: s.events.refused.Load(), Undecodable: undecodableRequests.Load()}
}

// abandon tells the observers that care of calls that end without a decision.
func (s *Server) abandon(calls []*policy.Call, why string) {
	for _, o := range s.observer {
		if a, ok := o.(abandonObserver); ok {
			for _, c := range calls {
				a.Abandoned(c, why)
			}
		}
	}
}

// abandonObserver is an observer that records calls ending without a decision.
type abandonObserver interface {
	Abandoned(c *policy.Call, why string)
}

// Why a call ended without a decision, for Abandoned.
const (
	// AbandonExpired: the call was idle for calls.idle_timeout.
	AbandonExpired = "expired"
	// AbandonShutdown: the call was still open when the sidecar stopped.
	AbandonShutdown = "interrupted"
	// AbandonCancelled: the caller cancelled the call between attempts (CancelCall).
	AbandonCancelled = "cancelled"
)

// Interrupt reports every call still open as ended by the shutdown; the
// composition root calls it once no RPC runs any more.
func (s *Server) Interrupt() {
	s.abandon(s.calls.liveCalls(), AbandonShutdown)
}

// Announce applies a breaker event another replica announced through the
// shared backend; events of scopes this sidecar does not serve are ignored.
func (s *Server) Announce(scope string, e gate.Event) {
	s.mu.RLock()
	sc, ok := s.scopes[scope]
	s.mu.RUnlock()
	if ok {
		s.log.Debug("breaker announced by another replica", "scope", scope, "source", e.Source, "event", e.Kind.String(), "to", e.To.String())
		sc.Announce(e)
	}
}

// Scope returns the named scope.
func (s *Server) Scope(name string) (*policy.Scope, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sc, ok := s.scopes[name]
	if !ok {
		return nil, errorf(errUnknownScope, "%s", clip(name))
	}
	return sc, nil
}

// Scopes returns the served scopes' names, sorted.
func (s *Server) Scopes() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedKeys(s.scopes)
}

// Sweep forgets idle calls, giving back the permits they hold, and writes
// the "calls waiting" lines when they are due; the composition root calls it
// every second.
func (s *Server) Sweep() {
	s.mu.Lock()
	for name := range s.removed {
		if s.calls.liveIn(name) == 0 {
			delete(s.removed, name)
		}
	}
	s.mu.Unlock()
	s.waits.flush(time.Now())
	dropped := s.calls.sweep()
	s.abandon(dropped, AbandonExpired)
	// Each expiry may ask the backend (a give-back, leaving a line): they
	// run together, so that a backend that does not answer holds the sweep
	// one of its timeouts, not one per call (a shared backend batches them).
	var expiring sync.WaitGroup
	slots := make(chan struct{}, maxExpiriesAtOnce)
	for _, c := range dropped {
		slots <- struct{}{}
		expiring.Go(func() {
			defer func() { <-slots }()
			s.expire(c)
		})
	}
	expiring.Wait()
}

// expire lets go of a call the sweep forgot: out of the lines it waited in;
// a permit it holds, which nobody will report, is given back now rather than
// at the end of its lease (a probe would otherwise block its breaker).
func (s *Server) expire(c *policy.Call) {
	st := c.Stats(time.Now())
	sc, _, err := s.scopeOrRemoved(c.Scope)
	if st.Holding == nil {
		if err == nil {
			sc.Forget(c)
		}
		s.log.Info("call expired idle", "scope", c.Scope, "call", c.ID, "attempts", st.Attempts)
		return
	}
	if err == nil {
		err = sc.Release(context.Background(), c) // the backend bounds it
	}
	s.log.Warn("call expired while holding a permit; the permit is given back",
		"scope", c.Scope, "call", c.ID, "permit", st.Holding.ID, "source", st.Holding.Source, "release_err", err)
}

// maxExpiriesAtOnce bounds the expiries one sweep runs together.
const maxExpiriesAtOnce = 64

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
