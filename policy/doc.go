// Package policy decides for one scope: the selector's order, the AIMD pacer,
// the cooldown memo, the Pick walk, the call's two budgets, OnNoRunnable and
// the next action after an outcome. It owns the outcome table (docs/design.md, Outcomes) and keeps
// breakers and quotas in a gate.Backend.
//
// The Scope's files, one job each: scope.go (configuration, reload, breaker
// events), pick.go (Pick, Release, Cancel), wait.go (OnNoRunnable's
// decision), waiter.go (the waiting machinery: signals, poller, holds),
// record.go (RecordOutcome and the next action), describe.go (RetryAfter,
// Describe, Override).
//
// # Lock order
//
// A lock may be taken while holding only the locks above it:
//
//  1. Call.mu — held across one decision of the call (Pick, OnNoRunnable's
//     decision, RecordOutcome's settling), backend round trip included, so
//     that a call's decisions are serialized; never two calls' at once.
//  2. Scope.mu (read for a snapshot of the configuration, written by Update).
//  3. Leaves, each taken alone: selector.mu, Pacer.mu, Memo.mu, local.mu (a
//     source's failure mark), signal.mu, waiter.mu.
//
// No lock is held while waiting in a hold or calling an Observer; the
// poller calls the backend holding no lock.
package policy
