package status

import (
	"time"

	"github.com/polygate/polygate/gate"
)

// The history of a scope is Buckets intervals of BucketWidth: the last 15
// minutes, in fixed memory whatever the traffic.
const (
	BucketWidth = 15 * time.Second
	Buckets     = 60
)

// numReasons sizes the refusal counters: every gate.Reason but none.
const numReasons = int(gate.ReasonQueued) + 1

// Interval is what happened in a scope during one BucketWidth.
type Interval struct {
	Start  time.Time `json:"start"`
	Grants int64     `json:"grants"`
	// Refusals counts sources refused, by reason (a Pick refused by three
	// sources counts three).
	Refusals map[string]int64 `json:"refusals"`
	// WaitsStarted counts calls that started waiting; Waiting is the most
	// calls waiting at once.
	WaitsStarted int64 `json:"waits_started"`
	Waiting      int64 `json:"waiting"`
	// FailedAttempts counts attempts reported TRANSIENT or SOURCE_DEAD (the
	// outcomes a breaker counts as failures); FailedCalls, calls that ended
	// with a failure.
	FailedAttempts int64 `json:"failed_attempts"`
	FailedCalls    int64 `json:"failed_calls"`
}

// bucket is one interval's counters; index is its interval number (Unix
// time / BucketWidth), so a bucket left from an earlier turn of the ring is
// told apart and reset.
type bucket struct {
	index          int64
	grants         int64
	refusals       [numReasons]int64
	waitsStarted   int64
	waitingStart   int64 // calls waiting when the interval's first event came
	waitingPeak    int64
	waitingEnd     int64
	failedAttempts int64
	failedCalls    int64
}

// history is a scope's ring of buckets; the Recorder's lock guards it.
type history struct {
	ring [Buckets]bucket
	// waiting is the scope's calls waiting now, carried into each new
	// bucket.
	waiting int64
}

func intervalOf(t time.Time) int64 { return t.Unix() / int64(BucketWidth/time.Second) }

// at returns the bucket of the interval of now, reset if it held an
// earlier one.
func (h *history) at(now time.Time) *bucket {
	i := intervalOf(now)
	b := &h.ring[i%Buckets]
	if b.index != i {
		*b = bucket{index: i, waitingStart: h.waiting, waitingPeak: h.waiting, waitingEnd: h.waiting}
	}
	return b
}

// setWaiting records that n calls wait now.
func (h *history) setWaiting(now time.Time, n int64) {
	b := h.at(now)
	h.waiting = n
	b.waitingEnd = n
	b.waitingPeak = max(b.waitingPeak, n)
}

// intervals returns the last Buckets intervals up to now, oldest first. An
// interval without events had as many calls waiting as the one before it
// ended with (the first ones: as many as the first recorded one started
// with, or as wait now when none is recorded).
func (h *history) intervals(now time.Time) []Interval {
	last := intervalOf(now)
	first := last - Buckets + 1
	carry := h.waiting
	for i := first; i <= last; i++ {
		if b := &h.ring[i%Buckets]; b.index == i {
			carry = b.waitingStart
			break
		}
	}
	width := int64(BucketWidth / time.Second)
	out := make([]Interval, 0, Buckets)
	for i := first; i <= last; i++ {
		iv := Interval{Start: time.Unix(i*width, 0).UTC(), Waiting: carry}
		if b := &h.ring[i%Buckets]; b.index == i {
			iv.Grants, iv.WaitsStarted, iv.Waiting = b.grants, b.waitsStarted, b.waitingPeak
			iv.FailedAttempts, iv.FailedCalls = b.failedAttempts, b.failedCalls
			for r, n := range b.refusals {
				if n > 0 {
					if iv.Refusals == nil {
						iv.Refusals = map[string]int64{}
					}
					iv.Refusals[gate.Reason(r).String()] = n
				}
			}
			carry = b.waitingEnd
		}
		out = append(out, iv)
	}
	return out
}
