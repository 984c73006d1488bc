package redisgate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

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
// told their names, and sharded pub/sub has no pattern subscription (it
// would need one subscription per scope, each on the node that owns the
// scope's slot, renewed on every resharding). On a Cluster a PUBLISH reaches
// every node; breakers change state rarely, so that costs nothing.
func (b *Backend) Subscribe(ctx context.Context, handle func(scope string, e gate.Event)) error {
	ps := b.client.PSubscribe(ctx, globEscaper.Replace(b.prefix)+"{*}"+channelSuffix)
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
			if scope, e, err := decodeAnnouncement(m.Payload); err == nil {
				b.hear(scope, e)
				handle(scope, e)
			}
		}
	}
}

// hear remembers another replica's announcement: of a scope this Backend
// may not serve, so it takes no room from one it does (memory.scope).
func (b *Backend) hear(scope string, e gate.Event) {
	b.memory.see(scope, []gate.Event{e}, time.Now(), false)
}

// decodeAnnouncement reads the record ANN (a JSON array), as lib.lua's
// announce writes it.
func decodeAnnouncement(payload string) (string, gate.Event, error) {
	var a []any
	d := json.NewDecoder(strings.NewReader(payload))
	d.UseNumber()
	if err := d.Decode(&a); err != nil {
		return "", gate.Event{}, fmt.Errorf("redisgate: announcement: %w", err)
	}
	if len(a) != len(announcement.fields) {
		return "", gate.Event{}, fmt.Errorf("redisgate: announcement of %d fields, want %d", len(a), len(announcement.fields))
	}
	for i, v := range a {
		if n, ok := v.(json.Number); ok {
			a[i] = jsonInt(n)
		}
	}
	p := &parser{op: "announcement"}
	r := announcement.parse(p, a)
	if p.err == nil && r.version != 1 {
		p.fail("version %d, want 1", r.version)
	}
	if p.err != nil {
		return "", gate.Event{}, p.err
	}
	return r.scope, r.e, nil
}

// jsonInt is n as an int64, or n itself (which the parser refuses) when it
// is not an integer in range.
func jsonInt(n json.Number) any {
	i, err := n.Int64()
	if err != nil {
		return n
	}
	return i
}
