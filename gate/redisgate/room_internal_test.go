package redisgate

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
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
	// lockedLog: a line was logged while m.mu was held.
	lockedLog bool
}

// lockCheck is a log handler that notes a line logged under m.mu.
type lockCheck struct {
	slog.Handler
	f *roomFixture
}

func (h lockCheck) Handle(ctx context.Context, r slog.Record) error {
	if h.f.m.mu.TryLock() {
		h.f.m.mu.Unlock()
	} else {
		h.f.lockedLog = true
	}
	return h.Handler.Handle(ctx, r)
}

func newRoomFixture(t *testing.T) *roomFixture {
	f := &roomFixture{t: t}
	f.m = &memory{log: slog.New(lockCheck{slog.NewTextHandler(&f.logged, nil), f})}
	t.Cleanup(func() {
		if f.lockedLog {
			t.Error("a line was logged while m.mu was held")
		}
	})
	return f
}

// counts checks the memory's indexes against its maps, and its size.
func (f *roomFixture) counts(scopes, heard, records, heardRecs int) {
	f.t.Helper()
	m := f.m
	h, n, hr := 0, 0, 0
	for name, sm := range m.scopes {
		if !sm.own {
			h++
			if m.heardScopes[name] != sm || len(sm.sources) == 0 {
				f.t.Fatalf("scope %s only heard of: indexed %v, %d records", name, m.heardScopes[name] == sm, len(sm.sources))
			}
		}
		for _, r := range sm.sources {
			n++
			if !r.own {
				hr++
				if m.heardRecs[r] != sm {
					f.t.Fatalf("a record heard of in %s is not indexed with its scope", name)
				}
			} else if !sm.own {
				f.t.Fatalf("a record of its own in %s, a scope only heard of", name)
			}
		}
	}
	if h != len(m.heardScopes) || n != m.n || hr != len(m.heardRecs) {
		f.t.Fatalf("indexes: %d scopes heard of, n %d, %d records heard of; the maps hold %d, %d, %d", len(m.heardScopes), m.n, len(m.heardRecs), h, n, hr)
	}
	if len(m.scopes) != scopes || h != heard || n != records || hr != heardRecs {
		f.t.Fatalf("%d scopes (%d heard of), %d records (%d heard of); want %d (%d), %d (%d)", len(m.scopes), h, n, hr, scopes, heard, records, heardRecs)
	}
}

// logs checks how many lines logged so far hold every one of what.
func (f *roomFixture) logs(want int, what ...string) {
	f.t.Helper()
	got := 0
	for _, line := range strings.Split(f.logged.String(), "\n") {
		all := line != ""
		for _, w := range what {
			all = all && strings.Contains(line, w)
		}
		if all {
			got++
		}
	}
	if got != want {
		f.t.Errorf("%d lines logged with %q, want %d:\n%s", got, what, want, f.logged.String())
	}
}

// own asks for the scope as this Backend's own call does.
func (f *roomFixture) own(scope string) *scopeMemory {
	f.m.mu.Lock()
	defer f.m.unlock()
	return f.m.scope(scope, true)
}

func opened(src string) []gate.Event {
	return []gate.Event{{Kind: gate.EventTransition, Source: src, To: gate.Open, Cooldown: time.Hour}}
}

// TestMemoryRoomForScopes: a scope only heard of gives its room to one this
// Backend asks Redis of; never the other way round, and never a scope of
// its own, even one heard of first. An announcement with nothing to
// re-assert makes no scope.
func TestMemoryRoomForScopes(t *testing.T) {
	const own = maxRemembered / 2
	const heard = maxRemembered - 1 - own
	f := newRoomFixture(t)
	now := time.Now()
	f.m.see("quiet", []gate.Event{{Kind: gate.EventTransition, Source: "a", To: gate.Closed}}, now, false)
	if f.m.scopes["quiet"] != nil {
		t.Fatal("an announcement with nothing to re-assert made a scope")
	}
	f.m.see("served", opened("a"), now, false) // heard of first, with a record,
	f.m.see("served", nil, now, true)          // then its own
	for i := range own {
		f.own(fmt.Sprintf("own-%d", i))
	}
	for i := range heard {
		f.m.see(fmt.Sprintf("heard-%d", i), opened("a"), now, false)
	}
	f.counts(maxRemembered, heard, heard+1, heard+1)
	f.m.see("late", opened("a"), now, false) // only heard of: no room, no line
	if f.m.scopes["late"] != nil {
		t.Fatal("a scope heard of took the room of another")
	}
	f.counts(maxRemembered, heard, heard+1, heard+1)

	for i := range heard { // every scope heard of gives its room
		f.own(fmt.Sprintf("new-%d", i))
	}
	f.counts(maxRemembered, 0, 1, 1) // served's record, heard of
	f.logs(heard, "forgot a scope only heard of", "records=1")
	f.logs(0, "no room")
	if f.m.marker("new-more") != unchecked {
		t.Fatal("room found past the bound among scopes all its own")
	}
	f.logs(1, "no room to remember the scope's breakers", "scope=new-more ") // (logged by marker's own unlock)
	if f.own("new-more-2") != nil {
		t.Fatal("room found past the bound among scopes all its own")
	}
	f.logs(1, "no room")
	if f.m.scopes["served"] == nil {
		t.Fatal("a scope heard of first, then its own, was forgotten")
	}
	for i := range own {
		if f.m.scopes[fmt.Sprintf("own-%d", i)] == nil {
			t.Fatalf("own-%d, a scope of its own, was forgotten for another", i)
		}
	}
}

// TestMemoryRoomForRecords: a record only heard of gives its room to one of
// this Backend's own, in any scope, and a scope only heard of goes with its
// last record; a record of its own never gives its room; an event that
// leaves nothing to re-assert takes none; a record pruned as empty is
// counted out, and a scope only heard of with it.
func TestMemoryRoomForRecords(t *testing.T) {
	now := time.Now()
	fill := func(f *roomFixture, records int) {
		for i := range records {
			f.m.see("mine", opened(fmt.Sprintf("s-%d", i)), now, true)
		}
	}

	f := newRoomFixture(t)
	f.m.see("served", opened("a"), now, true)
	fill(f, maxRemembered-2)
	f.m.see("other", opened("c"), now, false)
	f.counts(3, 1, maxRemembered, 1)
	f.m.see("served", []gate.Event{{Kind: gate.EventTransition, Source: "z", To: gate.Closed}}, now, true)
	f.m.see("served", []gate.Event{{Kind: gate.EventOverride, Source: "z", Override: gate.NoOverride}}, now, true)
	f.m.see("heard", opened("d"), now, false) // only heard of: no room, no line
	f.counts(3, 1, maxRemembered, 1)
	f.logs(0, "forgot")
	f.logs(0, "no room")
	f.m.see("served", opened("e"), now, true) // takes c's room, and other's with its last record
	f.counts(2, 0, maxRemembered, 0)
	f.logs(1, "forgot a breaker only heard of", "forgotten_scope=other", "forgotten_source=c", "for_source=e")
	f.m.see("served", opened("f"), now, true) // every record its own: no room
	f.m.see("served", opened("g"), now, true)
	if f.m.scopes["served"].sources["f"] != nil {
		t.Fatal("a record of its own took the room of another of its own")
	}
	f.counts(2, 0, maxRemembered, 0)
	f.logs(1, "no room to remember the breaker", "source=f")
	f.logs(1, "no room")

	// A record heard of in a scope of its own gives its room too, unless
	// its own reply said it since.
	f = newRoomFixture(t)
	f.m.see("served", opened("a"), now, true)
	f.m.see("served", opened("b"), now, false)
	f.m.see("served", opened("h"), now, false)
	fill(f, maxRemembered-3)
	f.m.see("served", opened("b"), now, true)
	if r := f.m.scopes["served"].sources["b"]; r == nil || !r.own {
		t.Fatal("a record heard of, then said by its own reply, is not its own")
	}
	f.counts(2, 0, maxRemembered, 1)
	f.m.see("served", opened("e"), now, true)
	if src := f.m.scopes["served"].sources; src["h"] != nil || src["b"] == nil || src["e"] == nil {
		t.Fatal("the record heard of did not give its room to one of its own")
	}
	f.counts(2, 0, maxRemembered, 0)

	// Pruned: a record heard of whose OPEN is over, and its scope with it.
	f = newRoomFixture(t)
	f.m.see("other", opened("c"), now, false)
	f.m.see("served", opened("a"), now, true)
	f.m.see("served", opened("b"), now, false)
	f.counts(2, 1, 3, 2)
	f.m.restoreArgs(f.m.scopes["other"], now.Add(2*time.Hour))
	f.m.restoreArgs(f.m.scopes["served"], now.Add(2*time.Hour))
	f.counts(1, 0, 0, 0)
}

// BenchmarkMemoryOwnRecordWhenFull: a record of this Backend's own on a
// memory full of records: it takes the room of a record only heard of, or
// is refused where there is none. Each op of "heard" also puts a record
// heard of back (the same again), "none" only refuses.
func BenchmarkMemoryOwnRecordWhenFull(b *testing.B) {
	now := time.Now()
	for _, heard := range []bool{true, false} {
		b.Run(map[bool]string{true: "heard", false: "none"}[heard], func(b *testing.B) {
			m := &memory{}
			for i := range maxRemembered - 1 {
				m.see(fmt.Sprintf("own-%d", i%(maxRemembered/2)), opened("s-"+strconv.Itoa(i)), now, true)
			}
			m.see("other", opened("c"), now, !heard)
			b.ResetTimer()
			for i := range b.N {
				m.see("own-0", opened("new"), now, true)
				if heard {
					sm := m.scopes["own-0"]
					delete(sm.sources, "new")
					m.n--
					m.see("other", opened(fmt.Sprint("c", i)), now, false)
				}
			}
		})
	}
}
