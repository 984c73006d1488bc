package status

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Health is a scope's headline state.
type Health string

const (
	// Up: every source CLOSED, nothing waits.
	Up Health = "up"
	// Degraded: calls go through, but a source is refused, overridden or
	// recovering, calls wait, or the shared backend is degraded.
	Degraded Health = "degraded"
	// Down: no call can be granted now: every source's breaker refuses, the
	// shared backend fails closed, or the state cannot be read.
	Down Health = "down"
)

// Headline is the answer at the top of a scope: up, degraded or down, why,
// how many calls wait, and what comes next.
type Headline struct {
	Health  Health   `json:"health"`
	Why     []string `json:"why"`
	Waiting int      `json:"waiting_calls"`
	// Next is the next probe, the end of a cooldown, or why none comes on
	// its own ("" when up).
	Next string `json:"next,omitempty"`
}

// sourceView is one source's row.
type sourceView struct {
	Name  string
	Class string // CLOSED, OPEN, HALF_OPEN or FORCED: the cell's colour
	Does  string // what the breaker does now, an override included
	Why   string // why it is OPEN ("" when CLOSED)
	Last  string // the last upstream status
	S     *admissionv1.SourceState
}

// maxEcho bounds free text (override actors and reasons) on the page.
const maxEcho = 200

// headline says how the scope is doing from its description d (nil when err
// says why it could not be read) and what the Recorder kept.
func headline(d *admissionv1.ScopeDescription, err string, rec ScopeRecord) Headline {
	h := Headline{Health: Up, Waiting: rec.Waiting}
	if err != "" {
		return Headline{Health: Down, Why: []string{"its state cannot be read: " + bounded(err, maxEcho)}, Waiting: rec.Waiting}
	}
	down := func(why string) {
		h.Health = Down
		h.Why = append(h.Why, why)
	}
	backend := d.GetBackend()
	switch {
	case strings.Contains(backend, "fail_closed"):
		down("the shared backend is unavailable and on_unavailable is fail_closed: every call is refused")
	case d.GetStateLoss().GetReassertPending():
		down("redis lost the scope's state; nothing is granted until this replica re-asserts what it knew")
	case strings.Contains(backend, "unavailable"):
		h.Health = Degraded
		h.Why = append(h.Why, "the shared backend is unavailable: "+backend)
	}
	admitting, recovering := 0, false
	var nextIn time.Duration
	nextOf := ""
	for _, s := range d.GetSources() {
		v := viewSource(s, rec.Sources[s.GetName()], time.Time{})
		if s.GetReason() == admissionv1.Reason_REASON_UNSPECIFIED {
			admitting++
		}
		if v.Class != "CLOSED" || s.GetOverride() != admissionv1.Override_OVERRIDE_UNSPECIFIED {
			line := s.GetName() + " " + v.Does
			if v.Why != "" {
				line += ": " + v.Why
				if rec := rec.Sources[s.GetName()]; !rec.StatusAt.IsZero() && s.GetOverride() != admissionv1.Override_OVERRIDE_FORCED_OPEN {
					line += ", last " + lastStatus(rec)
				}
			}
			h.Why = append(h.Why, line)
		}
		auto := s.GetState()
		switch {
		case s.GetOverride() == admissionv1.Override_OVERRIDE_FORCED_OPEN:
		case auto == admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN && s.GetProbeOut():
			recovering = true
			if h.Next == "" {
				h.Next = "probe out on " + s.GetName() + " (lease " + dur(s.GetProbeLeft()) + " left)"
			}
		case auto == admissionv1.BreakerState_BREAKER_STATE_HALF_OPEN:
			recovering = true
			if h.Next == "" {
				h.Next = "the next attempt on " + s.GetName() + " probes it"
			}
		case auto == admissionv1.BreakerState_BREAKER_STATE_OPEN:
			if left := s.GetRetryAfter().AsDuration(); nextOf == "" || left < nextIn {
				nextIn, nextOf = left, s.GetName()
			}
		}
	}
	if nextOf != "" && !recovering {
		h.Next = "cooldown of " + nextOf + " ends in " + short(nextIn) + ", then it is probed"
	}
	n := len(d.GetSources())
	switch {
	case n > 0 && admitting == 0 && h.Health != Down:
		h.Health = Down
		h.Why = append([]string{"every source refuses"}, h.Why...)
	case len(h.Why) > 0 && h.Health == Up:
		h.Health = Degraded
	case rec.Waiting > 0 && h.Health == Up:
		h.Health = Degraded
		h.Why = append(h.Why, "calls wait for capacity")
	}
	if h.Health == Up {
		h.Why = []string{fmt.Sprintf("all %d sources CLOSED", n)}
		h.Next = ""
	} else if h.Next == "" && n > 0 && admitting == 0 {
		h.Next = "nothing recovers on its own: an operator forced every refusing source open"
	}
	return h
}

// viewSource is s's row; now times the last upstream status ("" ago when
// zero).
func viewSource(s *admissionv1.SourceState, rec Source, now time.Time) sourceView {
	v := sourceView{Name: s.GetName(), S: s}
	auto := state(s.GetState())
	v.Class, v.Does = auto, auto
	who := ""
	if a := s.GetOverrideActor(); a != "" {
		who = fmt.Sprintf(" by %s: %q", bounded(a, maxEcho), bounded(s.GetOverrideReason(), maxEcho))
	}
	switch s.GetOverride() {
	case admissionv1.Override_OVERRIDE_FORCED_OPEN:
		v.Class, v.Does = "FORCED", "OPEN (forced"+who+unlike("OPEN", auto)+")"
	case admissionv1.Override_OVERRIDE_FORCED_CLOSED:
		v.Class, v.Does = "FORCED", "CLOSED (forced"+who+unlike("CLOSED", auto)+")"
	case admissionv1.Override_OVERRIDE_DISABLED:
		v.Class, v.Does = "FORCED", "DISABLED (admits every attempt, records nothing"+who+"; breaker "+auto+")"
	}
	if s.GetState() != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
		v.Why = openWhy(s, rec)
	}
	if !rec.StatusAt.IsZero() {
		v.Last = lastStatus(rec)
		if !now.IsZero() {
			v.Last += ", " + short(now.Sub(rec.StatusAt)) + " ago"
		}
	}
	return v
}

func unlike(does, auto string) string {
	if does == auto {
		return ""
	}
	return "; breaker " + auto
}

// openWhy is why a breaker that is not CLOSED opened: the description's
// cause, refined by the transition the Recorder saw, and how often it
// reopened.
func openWhy(s *admissionv1.SourceState, rec Source) string {
	why := strings.ToLower(strings.TrimPrefix(s.GetOpenCause().String(), "OPEN_CAUSE_"))
	switch {
	case rec.OpenCause != "":
		why = rec.OpenCause
	case s.GetOpenCause() == admissionv1.OpenCause_OPEN_CAUSE_UNSPECIFIED:
		why = "opened before this sidecar saw it"
	}
	if n := s.GetReopens(); n > 1 {
		why += ", reopened " + strconv.Itoa(int(n)) + "× in a row"
	}
	return why
}

func lastStatus(rec Source) string {
	if rec.Status == 0 {
		return rec.Outcome + " (no HTTP status)"
	}
	return "HTTP " + strconv.Itoa(rec.Status) + " (" + rec.Outcome + ")"
}

// transitionRow is a run of alike events, newest first: Count events of
// one source, the same kind, states, cause and action, from First to At.
type transitionRow struct {
	Transition
	First time.Time
	Count int
}

// Filter selects the transitions shown: one scope, one source, one kind
// ("transition" or "override"); empty selects all.
type Filter struct {
	Scope, Source, Kind string
}

// groupTransitions filters ts (newest first) and folds runs of alike
// events into one row.
func groupTransitions(ts []Transition, f Filter) []transitionRow {
	var rows []transitionRow
	for _, t := range ts {
		if f.Source != "" && t.Source != f.Source || f.Kind != "" && t.Kind != f.Kind {
			continue
		}
		if n := len(rows); n > 0 && alike(rows[n-1].Transition, t) {
			rows[n-1].First = t.At
			rows[n-1].Count++
			continue
		}
		rows = append(rows, transitionRow{Transition: t, First: t.At, Count: 1})
	}
	return rows
}

func alike(a, b Transition) bool {
	return a.Scope == b.Scope && a.Source == b.Source && a.Kind == b.Kind && a.From == b.From && a.To == b.To &&
		a.Cause == b.Cause && a.Action == b.Action && a.Actor == b.Actor && a.Why == b.Why
}

// bounded cuts s to at most n bytes, on a rune boundary, and marks the cut.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
