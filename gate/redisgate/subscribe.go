package redisgate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/polygate/polygate/gate"
)

// globEscaper escapes the glob characters of PSUBSCRIBE patterns.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// Subscribe hears the announcements of every scope under the Backend's
// prefix (a breaker opened or closed, an operator's action) and calls handle
// for each, in the order they arrive, on one goroutine. It blocks until ctx
// ends, then returns nil; while Redis is unreachable it keeps reconnecting
// (and misses what is published meanwhile). Announcements it cannot decode
// are skipped. handle must not block for long: go-redis drops messages it
// cannot hand over within a minute.
//
// The announcements use PUBLISH and one PSUBSCRIBE pattern rather than
// sharded SPUBLISH/SSUBSCRIBE: a replica must hear every scope without being
// told their names, and sharded pub/sub has no pattern subscription. On a
// Cluster a PUBLISH reaches every node; breakers change state rarely.
func (b *Backend) Subscribe(ctx context.Context, handle func(scope string, e gate.Event)) error {
	ps := b.client.PSubscribe(ctx, globEscaper.Replace(b.prefix)+"{*}:events")
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			a, err := decodeAnnouncement(m.Payload)
			if err != nil {
				continue
			}
			b.loss.marked(a.Scope, a.Marker)
			b.loss.heard(a.Scope, []gate.Event{a.event()})
			handle(a.Scope, a.event())
		}
	}
}

// announcement is lua/store.lua's announce: an event, its scope and the
// scope's marker. It is checked as a reply is: what a replica hears it may
// re-assert after a loss.
type announcement struct {
	V        int            `json:"v"`
	Scope    string         `json:"scope"`
	Source   string         `json:"source"`
	Marker   string         `json:"marker"`
	Kind     gate.EventKind `json:"kind"`
	From     gate.State     `json:"from"`
	To       gate.State     `json:"to"`
	Cause    gate.Cause     `json:"cause"`
	Epoch    uint64         `json:"epoch"`
	Reopens  int            `json:"reopens"`
	Cooldown int64          `json:"cooldown"`
	Permit   string         `json:"permit"`
	Override gate.Override  `json:"override"`
	Actor    string         `json:"actor"`
	Why      string         `json:"why"`
}

func (a *announcement) event() gate.Event {
	return gate.Event{Kind: a.Kind, Source: a.Source, From: a.From, To: a.To, Cause: a.Cause, Epoch: a.Epoch,
		Reopens: a.Reopens, Cooldown: gate.Millis(a.Cooldown), PermitID: a.Permit, Override: a.Override, Actor: a.Actor, Why: a.Why}
}

func decodeAnnouncement(payload string) (*announcement, error) {
	var a announcement
	d := json.NewDecoder(bytes.NewReader([]byte(payload)))
	if err := d.Decode(&a); err != nil {
		return nil, fmt.Errorf("redisgate: announcement: %w", err)
	}
	switch {
	case a.V != 1:
		return nil, fmt.Errorf("redisgate: announcement of version %d, want 1", a.V)
	case a.Kind < gate.EventTransition || a.Kind > gate.EventOverride || a.From > gate.HalfOpen || a.To > gate.HalfOpen ||
		a.Cause > gate.CauseReset || a.Override > gate.Disabled:
		return nil, fmt.Errorf("redisgate: announcement with a value outside its enum")
	case a.Reopens < 0 || a.Cooldown < 0:
		return nil, fmt.Errorf("redisgate: announcement with a negative count")
	}
	for _, s := range []string{a.Scope, a.Source, a.Marker, a.Permit, a.Actor, a.Why} {
		if len(s) > gate.MaxText {
			return nil, fmt.Errorf("redisgate: announcement with a text of %d bytes, at most %d", len(s), gate.MaxText)
		}
	}
	return &a, nil
}
