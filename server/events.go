package server

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/policy"
)

// DefaultWatchBuffer is how many events a watcher may have waiting before
// it loses the next ones.
const DefaultWatchBuffer = 1024

// hub publishes typed events to the watchers of WatchEvents. It is a
// policy.Observer: it is told of decisions outside every lock of the
// decision, converts the event once and queues it; one goroutine fans the
// queue out to the watchers. A decision's cost is therefore the same
// whatever the number of watchers: an atomic load with none, a conversion
// and a non-blocking send with any. Each watcher has a bounded buffer; a
// watcher whose buffer is full (or every watcher, when the queue itself is
// full) loses the event, and the next event it gets carries the count.
// At most max watchers are connected at once.
type hub struct {
	policy.NopObserver
	buffer int
	max    int

	watching atomic.Int32
	queue    chan published
	// lost counts events the queue refused, not yet told to the watchers.
	lost    atomic.Uint64
	fanning sync.Once

	mu       sync.Mutex
	watchers map[*watcher]struct{}
	closed   chan struct{}

	published atomic.Uint64
	dropped   atomic.Uint64
	refused   atomic.Uint64
}

// published is one event on its way to the watchers; a nil ev with a done
// channel is a marker that the fan-out closes when it gets there (sync).
type published struct {
	scope string
	at    time.Time
	ev    *admissionv1.WatchEventsResponse
	done  chan struct{}
}

// queueSize bounds the events published but not yet fanned out.
const queueSize = 4096

// watcher is one WatchEvents stream.
type watcher struct {
	scope string
	ch    chan *admissionv1.WatchEventsResponse
	lost  uint64 // lost since the last event queued; owned by the fan-out
}

func newHub(buffer, max int) *hub {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	if max <= 0 {
		max = config.DefaultMaxWatchers
	}
	return &hub{buffer: buffer, max: max, queue: make(chan published, queueSize),
		watchers: make(map[*watcher]struct{}), closed: make(chan struct{})}
}

// subscribe registers a watcher, unless max are connected already.
func (h *hub) subscribe(scope string) (*watcher, error) {
	w := &watcher{scope: scope, ch: make(chan *admissionv1.WatchEventsResponse, h.buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.watchers) >= h.max {
		h.refused.Add(1)
		return nil, fmt.Errorf("%w: %d streams are open (events.max_watchers)", errTooManyWatchers, len(h.watchers))
	}
	h.watchers[w] = struct{}{}
	h.watching.Add(1)
	h.fanning.Do(func() { go h.fanOut() })
	return w, nil
}

func (h *hub) unsubscribe(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
		h.watching.Add(-1)
	}
}

// close ends every watch stream and the fan-out, now and later.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.closed:
	default:
		close(h.closed)
	}
}

// active reports whether anybody watches; observers check it before they
// build an event.
func (h *hub) active() bool { return h.watching.Load() > 0 }

// publish queues one event for the watchers of its scope (all watchers when
// scope is empty). It never blocks: when the queue is full the event is
// lost, and every watcher's next event counts it.
// ev carries only the event (its oneof); the fan-out stamps each watcher's copy.
func (h *hub) publish(scope string, ev *admissionv1.WatchEventsResponse) {
	if !h.active() {
		return
	}
	select {
	case h.queue <- published{scope: scope, at: time.Now(), ev: ev}:
	default:
		h.lost.Add(1)
		h.dropped.Add(1)
	}
}

// sync waits until every event published before it has been fanned out
// (tests), or the hub is closed.
func (h *hub) sync() {
	done := make(chan struct{})
	select {
	case h.queue <- published{done: done}:
	case <-h.closed:
		return
	}
	select {
	case <-done:
	case <-h.closed:
	}
}

// fanOut offers each queued event to every watcher of its scope, without
// ever waiting for one. It runs from the first subscription until close.
func (h *hub) fanOut() {
	var seq uint64
	var targets []*watcher
	for {
		var p published
		select {
		case p = <-h.queue:
		case <-h.closed:
			return
		}
		if p.ev == nil {
			close(p.done)
			continue
		}
		// Events the queue refused take their sequence numbers too, so a
		// watcher sees the gap as well as the count.
		lost := h.lost.Swap(0)
		seq += lost + 1
		h.published.Add(1)
		h.mu.Lock()
		targets = targets[:0]
		for w := range h.watchers {
			if w.scope == "" || p.scope == "" || w.scope == p.scope {
				targets = append(targets, w)
			}
		}
		h.mu.Unlock()
		at := timestamppb.New(p.at)
		for _, w := range targets {
			w.lost += lost
			// The event message is shared, read-only, by every watcher's copy.
			msg := &admissionv1.WatchEventsResponse{Sequence: seq, Time: at, Scope: p.scope, Dropped: w.lost, Event: p.ev.Event}
			select {
			case w.ch <- msg:
				w.lost = 0
			default:
				w.lost++
				h.dropped.Add(1)
			}
		}
	}
}

var causes = map[gate.Cause]admissionv1.TransitionCause{
	gate.CauseConsecutiveFailures: admissionv1.TransitionCause_TRANSITION_CAUSE_CONSECUTIVE_FAILURES,
	gate.CauseFailureRate:         admissionv1.TransitionCause_TRANSITION_CAUSE_FAILURE_RATE,
	gate.CauseSourceDead:          admissionv1.TransitionCause_TRANSITION_CAUSE_SOURCE_DEAD,
	gate.CauseCooldownElapsed:     admissionv1.TransitionCause_TRANSITION_CAUSE_COOLDOWN_ELAPSED,
	gate.CauseProbeSucceeded:      admissionv1.TransitionCause_TRANSITION_CAUSE_PROBE_SUCCEEDED,
	gate.CauseProbeFailed:         admissionv1.TransitionCause_TRANSITION_CAUSE_PROBE_FAILED,
	gate.CauseReset:               admissionv1.TransitionCause_TRANSITION_CAUSE_RESET,
}

var probeKinds = map[gate.EventKind]admissionv1.ProbeEventKind{
	gate.EventProbeLeased:   admissionv1.ProbeEventKind_PROBE_EVENT_KIND_LEASED,
	gate.EventProbeExpired:  admissionv1.ProbeEventKind_PROBE_EVENT_KIND_EXPIRED,
	gate.EventProbeReleased: admissionv1.ProbeEventKind_PROBE_EVENT_KIND_RELEASED,
}

var outcomeNames = map[policy.Outcome]admissionv1.Outcome{}

func init() {
	for k, v := range outcomes {
		outcomeNames[v] = k
	}
}

// Breaker implements policy.Observer.
func (h *hub) Breaker(scope string, e gate.Event) {
	if !h.active() {
		return
	}
	var ev admissionv1.WatchEventsResponse
	switch e.Kind {
	case gate.EventTransition:
		t := &admissionv1.BreakerTransition{
			Source: e.Source, From: states[e.From], To: states[e.To], Cause: causes[e.Cause],
			Epoch: e.Epoch, Reopens: int32(e.Reopens),
		}
		if e.To == gate.Open {
			t.Cooldown = dur(e.Cooldown)
		}
		ev.Event = &admissionv1.WatchEventsResponse_BreakerTransition{BreakerTransition: t}
	case gate.EventProbeLeased, gate.EventProbeExpired, gate.EventProbeReleased:
		ev.Event = &admissionv1.WatchEventsResponse_Probe{Probe: &admissionv1.ProbeEvent{Source: e.Source, Kind: probeKinds[e.Kind], PermitId: e.PermitID, Epoch: e.Epoch}}
	case gate.EventStaleOutcome:
		ev.Event = &admissionv1.WatchEventsResponse_StaleOutcome{StaleOutcome: &admissionv1.StaleOutcome{Source: e.Source, PermitId: e.PermitID, Epoch: e.Epoch, State: states[e.To]}}
	case gate.EventOverride:
		ev.Event = &admissionv1.WatchEventsResponse_OverrideChanged{OverrideChanged: &admissionv1.OverrideChanged{
			Source: e.Source, Override: overrides[e.Override], Actor: e.Actor, Reason: e.Why, State: states[e.To], Epoch: e.Epoch,
			Action: actionNames[e.Action],
		}}
	default:
		return
	}
	h.publish(scope, &ev)
}

// Settled implements policy.Observer: a probe whose outcome carried a
// verdict is published as settled, after the transition it caused.
func (h *hub) Settled(c *policy.Call, a policy.Attempt, r policy.Recorded) {
	if !a.Probe || r.Effect != gate.EffectApplied || !h.active() {
		return
	}
	h.publish(c.Scope, &admissionv1.WatchEventsResponse{Event: &admissionv1.WatchEventsResponse_Probe{Probe: &admissionv1.ProbeEvent{
		Source: a.Source, Kind: admissionv1.ProbeEventKind_PROBE_EVENT_KIND_SETTLED, PermitId: a.PermitID,
		Epoch: a.Epoch, CallId: c.ID, Outcome: outcomeNames[a.Outcome], State: states[r.Breaker.State],
	}}})
}

// Waiting implements policy.Observer.
func (h *hub) Waiting(c *policy.Call, sleep time.Duration, rs []gate.Rejection) {
	if !h.active() {
		return
	}
	gateN := 0
	for _, r := range rs {
		if r.Reason.Gate() {
			gateN++
		}
	}
	h.publish(c.Scope, &admissionv1.WatchEventsResponse{Event: &admissionv1.WatchEventsResponse_WaitStarted{WaitStarted: &admissionv1.WaitStarted{
		CallId: c.ID, Sleep: dur(sleep), GateRejections: int32(gateN), PerSourceReasons: sourceReasons(rs),
		Attempts: int32(c.Stats(time.Now()).Attempts),
	}}})
}

// backend publishes a change of the backend's health.
func (h *hub) backend(c BackendChange) {
	if !h.active() {
		return
	}
	h.publish(c.Scope, &admissionv1.WatchEventsResponse{Event: &admissionv1.WatchEventsResponse_BackendHealth{
		BackendHealth: &admissionv1.BackendHealth{Backend: c.Backend, Degraded: c.Degraded, Detail: c.Detail},
	}})
}

// WatchEvents implements admissionv1.AdmissionServiceServer.
func (s *Server) WatchEvents(req *admissionv1.WatchEventsRequest, stream grpc.ServerStreamingServer[admissionv1.WatchEventsResponse]) error {
	if err := validate(req); err != nil {
		return err
	}
	if scope := req.GetScope(); scope != "" {
		if _, err := s.Scope(scope); err != nil {
			return err
		}
	}
	w, err := s.events.subscribe(req.GetScope())
	if err != nil {
		return err
	}
	defer s.events.unsubscribe(w)
	// The headers tell the client that the watch is registered: every event
	// published from now on reaches it (or is counted as dropped).
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.events.closed:
			return nil
		case msg := <-w.ch:
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
	}
}

// BackendChange is a change of the backend's health, reported by the
// backend (the Redis backend when it loses or regains its server).
type BackendChange struct {
	// Scope concerned; empty: every scope.
	Scope string
	// Backend names it, e.g. "redis".
	Backend string
	// Degraded: unreachable (scopes fail closed, or a local gate serves);
	// false: recovered.
	Degraded bool
	// Detail says what happened and what serves meanwhile.
	Detail string
}

// backendObserver is an observer that also counts backend health changes.
type backendObserver interface {
	BackendChanged(degraded bool)
}

// BackendChanged is where a backend's health changes go: it publishes the
// change to event watchers and tells the observers that count it (the
// metrics). The backend logs its own changes (see openRedis). It never
// blocks; call it outside the backend's own locks.
func (s *Server) BackendChanged(c BackendChange) {
	s.events.backend(c)
	for _, o := range s.observer {
		if b, ok := o.(backendObserver); ok {
			b.BackendChanged(c.Degraded)
		}
	}
}
