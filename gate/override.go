package gate

import (
	"errors"
	"fmt"
)

// ErrUnknownAction is returned for an Action outside the defined ones.
var ErrUnknownAction = errors.New("gate: unknown breaker action")

// MaxText bounds the ids and operator text a backend stores and reads back
// (a permit id, an override's actor and why): longer ones are refused when
// written, and a stored one longer is read as corrupt. The sidecar's API
// allows far less (64-byte ids, 256 bytes of operator text).
const MaxText = 1024

// CheckOverride refuses an action outside the defined ones and operator
// text longer than MaxText, before a backend stores anything.
func CheckOverride(a Action, actor, why string) error {
	switch {
	case a < ActionForceOpen || a > ActionReset:
		return fmt.Errorf("%w: %d", ErrUnknownAction, a)
	case len(actor) > MaxText || len(why) > MaxText:
		return fmt.Errorf("gate: an override's actor (%d bytes) and why (%d bytes) are at most %d bytes each", len(actor), len(why), MaxText)
	}
	return nil
}

// Apply carries out an operator's action.
func (b *Breaker) Apply(a Action, actor, why string, now int64) ([]Event, error) {
	if err := CheckOverride(a, actor, why); err != nil {
		return nil, err
	}
	var events []Event
	switch a {
	case ActionForceOpen:
		b.Override = ForcedOpen
	case ActionForceClosed:
		b.Override = ForcedClosed
	case ActionDisable:
		b.Override = Disabled
	case ActionClear:
		b.Override = NoOverride
	case ActionReset:
		from := b.State
		b.Override = NoOverride
		b.resetRound()
		b.Reopens = 0
		b.State = Closed
		b.Epoch++
		if from != Closed {
			events = append(events, b.event(EventTransition, from, CauseReset))
		}
	}
	b.Actor, b.Why, b.OverrideAt = actor, why, now
	if b.Override == NoOverride {
		b.Actor, b.Why = "", ""
	}
	e := b.event(EventOverride, b.State, CauseNone)
	e.Override, e.Actor, e.Why = b.Override, actor, why
	return append([]Event{e}, events...), nil
}
