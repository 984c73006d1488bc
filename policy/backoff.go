package policy

import "time"

// Backoff is the sleep after a failed attempt: exponential in the call's
// failure count from base up to max, jittered over its upper half after the
// cap (so sleeps never pile up at the cap), and never shorter than floor, an
// upstream Retry-After. rand returns a number in [0, 1).
func Backoff(base, maxDelay time.Duration, failures int, floor time.Duration, rand func() float64) time.Duration {
	d := maxDelay
	if shift := max(failures, 1) - 1; shift < 62 && base <= maxDelay>>uint(shift) {
		d = base << uint(shift)
	}
	jittered := d/2 + time.Duration(rand()*float64(d/2))
	return ceilMs(max(jittered, floor))
}
