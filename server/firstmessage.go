package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"
)

// A stream whose request never arrives (headers, then nothing) holds a
// goroutine and its buffers for as long as its connection lives: grpc-go
// reads the request before any interceptor runs, so neither auth nor a
// handler ever sees it. The transport bounds how many streams a connection
// opens at once (limits.max_streams_per_connection), before any
// authentication; firstMessage bounds how long each may stay silent
// (limits.first_message_timeout): a tap gives every stream a context of its
// own, which a sweep cancels once the bound has passed without a request,
// ending the read that waits for it and closing the stream; the chain marks
// the stream heard when its request has arrived.
//
// One timer of sweeps for every stream rather than a timer each: a timer
// per stream, and the context.AfterFunc that would stop it when the stream
// ends first, more than doubled what the bound costs an RPC
// (BenchmarkFirstMessage); an entry in the sweeps' list costs nothing of its
// own and is dropped at the next sweep once the stream is heard or gone.

// errSilent is the cause of a silent stream's cancellation.
var errSilent = errors.New("no request message within limits.first_message_timeout")

// firstMessage is the tap that bounds the time from a stream's headers to
// its first request message, and the sweeper that enforces it.
type firstMessage struct {
	bound time.Duration
	log   *slog.Logger

	mu      sync.Mutex
	pending []*silence  // streams not heard at the last pass, or opened since
	next    *time.Timer // the next pass, while pending is not empty
}

// silence is one stream until its first request message: the stream's
// context, which the sweeper cancels, and when the stream opened.
type silence struct {
	context.Context
	cancel context.CancelCauseFunc
	opened time.Time
	method string
	heard  atomic.Bool
}

type silenceKey struct{}

// Value finds the silence in the stream's context without a context of its
// own.
func (s *silence) Value(key any) any {
	if key == (silenceKey{}) {
		return s
	}
	return s.Context.Value(key)
}

// tap implements tap.ServerInHandle; grpc-go calls it for each new stream,
// under its connection's lock, so it only notes the stream.
func (f *firstMessage) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	s := &silence{opened: time.Now(), method: info.FullMethodName}
	s.Context, s.cancel = context.WithCancelCause(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, s)
	if f.next == nil {
		f.next = time.AfterFunc(f.bound/sweepsPerBound, f.sweep)
	}
	return s, nil
}

// sweepsPerBound is how many sweeps there are per bound while streams are
// pending: a silent stream is closed between the bound and an eighth of it
// later, and a heard or ended one is forgotten within an eighth of the bound.
const sweepsPerBound = 8

// sweep is one pass: it closes the streams silent for the bound and forgets
// those heard or ended, then sets the next pass, bound/sweepsPerBound later,
// unless none is pending (no timer runs while every stream is heard).
func (f *firstMessage) sweep() {
	now := time.Now()
	f.mu.Lock()
	pending := f.pending
	f.pending = nil
	f.mu.Unlock()
	keep := pending[:0]
	for _, s := range pending {
		switch {
		case s.heard.Load() || s.Err() != nil:
		case now.Sub(s.opened) >= f.bound:
			s.cancel(errSilent)
			f.closed(s)
		default:
			keep = append(keep, s)
		}
	}
	clear(pending[len(keep):])
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, keep...)
	if len(f.pending) == 0 {
		f.next = nil
		return
	}
	f.next.Reset(f.bound / sweepsPerBound)
}

// closed logs a stream closed for its silence.
func (f *firstMessage) closed(s *silence) {
	addr := ""
	if p, ok := peer.FromContext(s); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	f.log.Warn("stream closed: no request message within limits.first_message_timeout",
		"grpc.method", s.method, "peer.address", addr, "limit", f.bound)
}

// heard marks ctx's stream as heard: its first request message has arrived.
// Calling it again, or on a context without a silence, does nothing.
func heard(ctx context.Context) {
	if s, ok := ctx.Value(silenceKey{}).(*silence); ok {
		s.heard.Store(true)
	}
}

// heardStream is the chain's outermost stream interceptor: it marks the
// stream heard when its first request message has been received.
func heardStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &listened{ServerStream: ss})
}

// listened is a stream whose first received message marks it heard.
type listened struct {
	grpc.ServerStream
	heard bool
}

func (l *listened) RecvMsg(m any) error {
	err := l.ServerStream.RecvMsg(m)
	if err == nil && !l.heard {
		l.heard = true
		heard(l.Context())
	}
	return err
}
