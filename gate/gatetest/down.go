package gatetest

import (
	"context"

	"github.com/polygate/polygate/gate"
)

// Down is a shared backend that never answers: every call fails with
// gate.ErrUnavailable, as a Redis that is gone does.
type Down struct{}

// Admit implements gate.Backend.
func (Down) Admit(context.Context, gate.AdmitRequest) (gate.Admission, error) {
	return gate.Admission{}, gate.ErrUnavailable
}

// Settle implements gate.Backend.
func (Down) Settle(context.Context, gate.SettleRequest) (gate.Settlement, error) {
	return gate.Settlement{}, gate.ErrUnavailable
}

// Peek implements gate.Backend.
func (Down) Peek(context.Context, gate.PeekRequest) (gate.Snapshot, error) {
	return gate.Snapshot{}, gate.ErrUnavailable
}

// Override implements gate.Backend.
func (Down) Override(context.Context, gate.OverrideRequest) (gate.OverrideResult, error) {
	return gate.OverrideResult{}, gate.ErrUnavailable
}

// Leave implements gate.Backend.
func (Down) Leave(context.Context, gate.LeaveRequest) error { return gate.ErrUnavailable }

// Ping fails: the backend is unavailable.
func (Down) Ping(context.Context) error { return gate.ErrUnavailable }
