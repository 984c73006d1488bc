// Package policy decides for one scope: the selector's order, the AIMD pacer,
// the cooldown memo, the Pick walk, the call's two budgets, OnNoRunnable and
// the next action after an outcome. It owns DESIGN's outcome table and keeps
// breakers and quotas in a gate.Backend.
package policy
