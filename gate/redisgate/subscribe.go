package redisgate

import (
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
			scope, marker, e, err := decodeAnnouncement(m.Payload)
			if err != nil {
				continue
			}
			b.loss.marked(scope, marker)
			b.loss.heard(scope, []gate.Event{e})
			handle(scope, e)
		}
	}
}

// decodeAnnouncement reads lua/store.lua's announce: a JSON list of the
// version, the scope, the source, the scope's marker, then the event as a
// reply carries it (put_events'). It is checked as a reply is: what a
// replica hears it may re-assert after a loss.
func decodeAnnouncement(payload string) (scope, marker string, e gate.Event, err error) {
	var a []any
	d := json.NewDecoder(strings.NewReader(payload))
	d.UseNumber()
	if err := d.Decode(&a); err != nil {
		return "", "", e, fmt.Errorf("redisgate: announcement: %w", err)
	}
	for i, v := range a {
		if n, ok := v.(json.Number); ok {
			if k, err := n.Int64(); err == nil {
				a[i] = k
			}
		}
	}
	c := &cursor{what: "announcement", a: a}
	c.num("version", 1, 1)
	scope, source, marker := c.str("scope"), c.str("source"), c.str("marker")
	c.num("group", groupEvent, groupEvent)
	e = c.event(func(int64) string { return source })
	c.done()
	return scope, marker, e, c.err
}
