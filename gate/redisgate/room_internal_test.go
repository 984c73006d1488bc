package redisgate

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// roomFixture is a memory whose log is kept, with checks of its counts.
type roomFixture struct {
	t      *testing.T
	m      *memory
	logged bytes.Buffer
}

func newRoomFixture(t *testing.T) *roomFixture {
	f := &roomFixture{t: t}
	f.m = &memory{log: slog.New(slog.NewTextHandler(&f.logged, nil))}
	return f
}

// counts checks the memory's counters against its maps, and its size.
func (f *roomFixture) counts(scopes, heard, records, heardRecs int) {
	f.t.Helper()
	m := f.m
	h, n, hr := 0, 0, 0
	for _, sm := range m.scopes {
		if !sm.own {
			h++
		}
		for _, r := range sm.sources {
			n++
			if !r.own {
				hr++
			}
			if r.own && !sm.own {
				f.t.Errorf("a record of its own in a scope only heard of")
			}
		}
	}
	if h != m.heard || n != m.n || hr != m.heardRecs {
		f.t.Fatalf("counters heard %d, n %d, heardRecs %d; the maps hold %d, %d, %d", m.heard, m.n, m.heardRecs, h, n, hr)
	}
	if len(m.scopes) != scopes || h != heard || n != records || hr != heardRecs {
		f.t.Fatalf("%d scopes (%d heard of), %d records (%d heard of); want %d (%d), %d (%d)", len(m.scopes), h, n, hr, scopes, heard, records, heardRecs)
	}
}

// logs checks how many lines with what were logged since the last call.
func (f *roomFixture) logs(what string, want int) {
	f.t.Helper()
	if got := strings.Count(f.logged.String(), what); got != want {
		f.t.Errorf("%d lines logged with %q, want %d:\n%s", got, what, want, f.logged.String())
	}
}

func opened(src string) []gate.Event {
	return []gate.Event{{Kind: gate.EventTransition, Source: src, To: gate.Open, Cooldown: time.Hour}}
}

// own asks for the scope as this Backend's own call does (marker).
func (f *roomFixture) own(scope string) *scopeMemory {
	f.m.mu.Lock()
	defer f.m.unlock()
	return f.m.scope(scope, true)
}

// TestMemoryRoomForScopes: a scope only heard of gives its room to one
// this Backend asks Redis of, one without records first; never the other
// way round, and never a scope of its own, even one heard of first.
func TestMemoryRoomForScopes(t *testing.T) {
	const own, withRecord = maxRemembered / 2, 100
	const bare = maxRemembered - 1 - own - withRecord
	f := newRoomFixture(t)
	now := time.Now()
	f.m.see("served", opened("a"), now, false) // heard of first, with a record,
	f.m.see("served", nil, now, true)          // then its own
	for i := range own {
		f.own(fmt.Sprintf("own-%d", i))
	}
	for i := range withRecord {
		f.m.see(fmt.Sprintf("rec-%d", i), opened("a"), now, false)
	}
	for i := range bare {
		f.m.see(fmt.Sprintf("bare-%d", i), nil, now, false)
	}
	f.counts(maxRemembered, withRecord+bare, withRecord+1, withRecord+1)
	f.m.see("late", opened("a"), now, false) // only heard of: no room
	if f.m.scopes["late"] != nil {
		t.Fatal("a scope heard of took the room of another")
	}

	for i := range bare { // the scopes without records go first
		f.own(fmt.Sprintf("new-%d", i))
	}
	f.counts(maxRemembered, withRecord, withRecord+1, withRecord+1)
	for i := range withRecord {
		if f.m.scopes[fmt.Sprintf("rec-%d", i)] == nil {
			t.Fatalf("rec-%d, heard of with a record, was forgotten while scopes without records were there", i)
		}
	}
	for i := range withRecord { // then those with records
		f.own(fmt.Sprintf("new-rec-%d", i))
	}
	f.counts(maxRemembered, 0, 1, 1) // served's record, heard of
	if f.own("new-more") != nil || f.own("new-more-2") != nil || f.m.marker("new-more-3") != unchecked {
		t.Fatal("room found past the bound among scopes all its own")
	}
	if f.m.scopes["served"] == nil {
		t.Fatal("a scope heard of first, then its own, was forgotten")
	}
	for i := range own {
		if f.m.scopes[fmt.Sprintf("own-%d", i)] == nil {
			t.Fatalf("own-%d, a scope of its own, was forgotten for another", i)
		}
	}
	f.logs("forgot a scope only heard of", bare+withRecord)
	f.logs("no room to remember the scope's breakers", 1)
}

// TestMemoryRoomForRecords: a record only heard of gives its room to one of
// this Backend's own (in any scope); a record of its own never does; an
// event that leaves nothing to re-assert makes no record; a record pruned
// as empty is counted out.
func TestMemoryRoomForRecords(t *testing.T) {
	f := newRoomFixture(t)
	now := time.Now()
	f.m.see("served", opened("a"), now, true)
	f.m.see("served", opened("b"), now, false) // heard of, in a scope of its own
	for i := range maxRemembered - 3 {
		f.m.see("mine", opened(fmt.Sprintf("s-%d", i)), now, true)
	}
	f.m.see("other", []gate.Event{{Kind: gate.EventTransition, Source: "c", To: gate.Open, Cooldown: time.Millisecond}}, now, false)
	f.counts(3, 1, maxRemembered, 2)

	f.m.see("served", []gate.Event{{Kind: gate.EventTransition, Source: "z", To: gate.Closed}}, now, true)
	f.m.see("served", []gate.Event{{Kind: gate.EventOverride, Source: "z", Override: gate.NoOverride}}, now, true)
	f.counts(3, 1, maxRemembered, 2) // nothing to re-assert: no record, nothing forgotten
	f.logs("forgot", 0)

	f.m.see("heard", opened("d"), now, false) // a record only heard of: no room
	f.m.see("served", opened("e"), now, true) // its own: takes a heard record's room
	f.counts(4, 2, maxRemembered, 1)
	f.logs("forgot a breaker only heard of", 1)
	f.m.see("served", opened("b"), now, true) // a record heard of, said by its own reply since
	f.counts(4, 2, maxRemembered, 0)
	if r := f.m.scopes["served"].sources["b"]; r == nil || !r.own {
		t.Fatal("a record heard of, then said by its own reply, is not its own")
	}

	f.m.see("served", opened("f"), now, true) // every record its own: no room
	f.m.see("served", opened("g"), now, true)
	if f.m.scopes["served"].sources["f"] != nil {
		t.Fatal("a record of its own took the room of another of its own")
	}
	f.counts(4, 2, maxRemembered, 0)
	f.logs("no room to remember the breaker", 1)

	// A record heard of whose OPEN is over is pruned and counted out.
	f2 := newRoomFixture(t)
	f2.m.see("other", []gate.Event{{Kind: gate.EventTransition, Source: "c", To: gate.Open, Cooldown: time.Millisecond}}, now, false)
	f2.m.see("served", opened("a"), now, true)
	f2.counts(2, 1, 2, 1)
	f2.m.restoreArgs(f2.m.scopes["other"], now.Add(time.Second))
	f2.counts(2, 1, 1, 0)
}
