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

// TestMemoryRoom: a scope only heard of gives its room, scope or records, to
// one this Backend asks Redis of, never the other way round; a scope heard
// of first and asked of since is its own; one asked of with no room left is
// logged once.
func TestMemoryRoom(t *testing.T) {
	var logged bytes.Buffer
	newMemory := func() *memory {
		logged.Reset()
		return &memory{log: slog.New(slog.NewTextHandler(&logged, nil))}
	}
	now := time.Now()
	opened := func(src string) []gate.Event {
		return []gate.Event{{Kind: gate.EventTransition, Source: src, To: gate.Open, Cooldown: time.Hour}}
	}
	count := func(what string, want int) {
		t.Helper()
		if got := strings.Count(logged.String(), what); got != want {
			t.Errorf("%d lines logged with %q, want %d:\n%s", got, what, want, logged.String())
		}
	}

	// A scope's room.
	m := newMemory()
	m.see("served", nil, now, false) // heard of first,
	m.see("served", nil, now, true)  // then asked of: its own
	for i := range maxRemembered - 1 {
		m.see(fmt.Sprintf("heard-%d", i), nil, now, false)
	}
	if len(m.scopes) != maxRemembered || m.heard != maxRemembered-1 {
		t.Fatalf("%d scopes, %d only heard of; want %d, %d", len(m.scopes), m.heard, maxRemembered, maxRemembered-1)
	}
	m.see("late", opened("a"), now, false) // no room, and only heard of: dropped
	if m.scopes["late"] != nil || m.n != 0 {
		t.Fatal("a scope heard of took the room of another heard of")
	}
	m.see("new", opened("a"), now, true)
	if sm := m.scopes["new"]; sm == nil || len(sm.sources) != 1 || !sm.own {
		t.Fatal("a scope asked of found no room among scopes only heard of")
	}
	if m.scopes["served"] == nil {
		t.Fatal("a scope heard of, then asked of, was forgotten for another")
	}
	if len(m.scopes) != maxRemembered || m.heard != maxRemembered-2 || m.n != 1 {
		t.Errorf("%d scopes, %d only heard of, %d records; want %d, %d, 1", len(m.scopes), m.heard, m.n, maxRemembered, maxRemembered-2)
	}
	count("forgot a scope only heard of", 1)

	// A record's room: the scope forgotten is one with records, among a
	// hundred without (which would free none).
	m = newMemory()
	m.see("served", opened("a"), now, false)
	m.see("served", nil, now, true)
	for i := range 100 {
		m.see(fmt.Sprintf("bare-%d", i), nil, now, false)
	}
	for i := range maxRemembered - 1 {
		m.see("other", opened(fmt.Sprintf("s-%d", i)), now, false)
	}
	m.see("bare-0", opened("a"), now, false) // no room for a record only heard of
	if m.n != maxRemembered || len(m.scopes["bare-0"].sources) != 0 {
		t.Fatalf("%d records, bare-0 has %d; want %d, 0", m.n, len(m.scopes["bare-0"].sources), maxRemembered)
	}
	m.see("served", opened("b"), now, true)
	if sm := m.scopes["served"]; len(sm.sources) != 2 {
		t.Fatalf("a record of a scope asked of found no room: %d records", len(sm.sources))
	}
	if m.scopes["other"] != nil || len(m.scopes) != 101 || m.n != 2 || m.heard != 100 {
		t.Errorf("other kept %v, %d scopes, %d records, %d only heard of: want the scope with records forgotten, none of those without; 101, 2, 100",
			m.scopes["other"] != nil, len(m.scopes), m.n, m.heard)
	}
	count("forgot a scope only heard of", 1)

	// Every scope its own: none is forgotten, and the first refused is logged.
	m = newMemory()
	for i := range maxRemembered {
		m.scope(fmt.Sprintf("own-%d", i), true)
	}
	if m.scope("heard", false) != nil || m.scope("own-more", true) != nil || m.scope("own-more-2", true) != nil {
		t.Fatal("room found past the bound among scopes all asked of")
	}
	if m.marker("own-more") != unchecked {
		t.Error("an Admit of a scope without room checks a marker the Backend never saw")
	}
	count("no room to remember", 1)
	count("forgot", 0)
}
