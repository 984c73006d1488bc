package policy

import (
	"testing"
	"unsafe"
)

// A call held in OnNoRunnable, never granted, costs its Call and nothing
// made at a grant or a RecordOutcome: keep the Call within the 240-byte
// size class (10 000 held calls: 2.4 MB), or say in docs/performance.md
// ("What a held call costs") what the growth buys.
func TestCallStaysSmall(t *testing.T) {
	if n := unsafe.Sizeof(Call{}); n > 240 {
		t.Fatalf("Call is %d bytes, more than the 240 a held call is budgeted", n)
	}
}
