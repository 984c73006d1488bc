package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
)

// A stream that has not sent its request when the bound has passed is
// cancelled (which closes it), not before, and not one that was heard; the
// sweeps forget heard and ended streams and stop when none is pending.
func TestSilentStreamsAreCancelledAtTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound = 10 * time.Second
		f := &firstMessage{bound: bound, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		open := func() (context.Context, context.CancelFunc) {
			parent, cancel := context.WithCancel(context.Background())
			ctx, err := f.tap(metadata.NewIncomingContext(parent, metadata.MD{}), &tap.Info{FullMethodName: "/s/m"})
			if err != nil {
				t.Fatal(err)
			}
			return ctx, cancel
		}
		silent, _ := open()
		spoke, _ := open()
		gone, reset := open()
		heard(context.WithValue(spoke, silenceKey{}, "not a silence")) // a context of another kind: nothing
		heard(spoke)
		reset() // the client reset the stream before its request

		time.Sleep(bound - time.Millisecond)
		synctest.Wait()
		if silent.Err() != nil {
			t.Fatalf("a silent stream was cancelled before the bound: %v", context.Cause(silent))
		}
		time.Sleep(bound / sweepsPerBound)
		synctest.Wait()
		if !errors.Is(context.Cause(silent), errSilent) {
			t.Fatalf("a silent stream after the bound and a sweep: %v; want cancelled with errSilent", context.Cause(silent))
		}
		if spoke.Err() != nil || !errors.Is(gone.Err(), context.Canceled) || errors.Is(context.Cause(gone), errSilent) {
			t.Fatalf("the heard stream %v, the reset one %v; want them untouched", context.Cause(spoke), context.Cause(gone))
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.pending) != 0 || f.next != nil {
			t.Fatalf("%d streams pending, next sweep %v; want none, and no sweep set", len(f.pending), f.next)
		}
	})
}

// BenchmarkFirstMessage is what the bound costs a stream that speaks at
// once: the tap and heard.
//
//	go test -run '^$' -bench FirstMessage -benchmem ./server/
func BenchmarkFirstMessage(b *testing.B) {
	f := &firstMessage{bound: 10 * time.Second, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	info := &tap.Info{FullMethodName: "/s/m"}
	b.ReportAllocs()
	for b.Loop() {
		parent, cancel := context.WithCancel(context.Background())
		ctx, _ := f.tap(metadata.NewIncomingContext(parent, metadata.MD{}), info)
		heard(ctx)
		cancel()
	}
}
