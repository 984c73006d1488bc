package redisgate

import (
	"encoding/binary"
	"testing"
)

// fuzzReply decodes fuzz bytes into a Redis script reply tree of the shapes
// go-redis hands back (int64, string, []any, nil), bounded in depth and size.
func fuzzReply(b []byte, depth int) (any, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	op, b := b[0], b[1:]
	switch op % 4 {
	case 0:
		var buf [8]byte
		n := copy(buf[:], b)
		return int64(binary.LittleEndian.Uint64(buf[:])), b[n:]
	case 1:
		n := 0
		if len(b) > 0 {
			n, b = int(b[0]%32), b[1:]
		}
		n = min(n, len(b))
		return string(b[:n]), b[n:]
	case 2:
		if depth == 0 || len(b) == 0 {
			return []any{}, b
		}
		n := int(b[0] % 16)
		b = b[1:]
		out := make([]any, 0, n)
		for range n {
			var v any
			v, b = fuzzReply(b, depth-1)
			out = append(out, v)
		}
		return out, b
	}
	return nil, b
}

// FuzzReplyParser: whatever a script (or a compromised Redis) replies, the
// parser returns values or an error, never panics, and a parse without
// error has read every field it promises.
func FuzzReplyParser(f *testing.F) {
	f.Add([]byte{2, 13, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 3, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 1, 2, 12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 3, 'a', 'b', 'c'})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, _ := fuzzReply(b, 4)
		p := &parser{op: "fuzz"}
		bv := breakerView.parse(p, v)
		qv := quotaView.parse(p, v)
		evs := p.events(v, p.single("s"))
		if p.err != nil {
			return
		}
		if bv.Epoch > 1<<63-1 {
			t.Fatalf("epoch %d read from a signed integer", bv.Epoch)
		}
		for _, e := range evs {
			if e.Source != "s" {
				t.Fatalf("event of source %q", e.Source)
			}
		}
		_ = qv
	})
}
