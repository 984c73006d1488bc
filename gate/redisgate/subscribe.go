package redisgate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/polygate/polygate/gate"
)

var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// Subscribe hears the announcements of every scope under the Backend's
// prefix (a breaker opened or closed, an operator's action) and calls handle
// for each, in order, on one goroutine, until ctx ends (then it returns
// nil). While Redis is unreachable it reconnects, missing what is published
// meanwhile; announcements it cannot decode are skipped. handle must not
// block for long: go-redis drops what it cannot hand over within a minute.
// Not sharded pub/sub, which has no patterns: a replica must hear every
// scope unnamed, and a rare breaker change may reach every Cluster node.
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

// decodeAnnouncement reads lua/breaker.lua's put_events' announcement,
// checked as a reply is: what a replica hears it may re-assert after a loss.
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
