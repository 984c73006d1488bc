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
			if scope, e, err := decodeAnnouncement(m.Payload); err == nil {
				b.memory.see(scope, []gate.Event{e}, time.Now())
				handle(scope, e)
			}
		}
	}
}

// decodeAnnouncement reads [1, scope, source, kind, from, to, cause, epoch,
// reopens, cooldown_ms, override, actor, why], as lib.lua's announce writes it.
func decodeAnnouncement(payload string) (string, gate.Event, error) {
	var a []any
	if err := json.Unmarshal([]byte(payload), &a); err != nil {
		return "", gate.Event{}, fmt.Errorf("redisgate: announcement: %w", err)
	}
	if len(a) != 13 {
		return "", gate.Event{}, fmt.Errorf("redisgate: announcement of %d fields, want 13", len(a))
	}
	var err error
	num := func(v any) int64 {
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) {
			err = fmt.Errorf("redisgate: announcement: want an integer, got %v", v)
		}
		return int64(f)
	}
	str := func(v any) string {
		s, ok := v.(string)
		if !ok {
			err = fmt.Errorf("redisgate: announcement: want a string, got %v", v)
		}
		return s
	}
	if v := num(a[0]); v != 1 {
		return "", gate.Event{}, fmt.Errorf("redisgate: announcement version %d, want 1", v)
	}
	scope := str(a[1])
	e := gate.Event{
		Source: str(a[2]), Kind: gate.EventKind(num(a[3])), From: gate.State(num(a[4])), To: gate.State(num(a[5])),
		Cause: gate.Cause(num(a[6])), Epoch: uint64(num(a[7])), Reopens: int(num(a[8])), Cooldown: ms(num(a[9])),
		Override: gate.Override(num(a[10])), Actor: str(a[11]), Why: str(a[12]),
	}
	if err != nil {
		return "", gate.Event{}, err
	}
	return scope, e, nil
}
