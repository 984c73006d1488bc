package inmem

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/polygate/polygate/gate"
)

// FlushInterval is how often changed quota use is written to the state
// file; breaker changes and overrides are written at once.
const FlushInterval = time.Second

// maxWait bounds how long a decision that changed a breaker waits for the
// state file to hold it; past it the decision answers anyway and the flusher
// keeps trying (and logging).
const maxWait = 2 * time.Second

// Options configure a memory backend.
type Options struct {
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// StatePath, when set, is the file that keeps overrides, breakers and the
	// minute's RPM and TPM use across restarts (backend.memory.state_path).
	StatePath string
	// MaxOpen is, for a source of the state file, the longest its breaker
	// may stay OPEN from the load on: its breaker.max_cooldown (nil or 0:
	// not bounded). A longer OPEN in the file is clamped to it with a
	// warning, as is any time in the file after the load.
	MaxOpen func(scope, source string) time.Duration
	// Log receives the state file's write failures and what its load
	// clamped (slog.Default() if nil).
	Log *slog.Logger
}

// store writes a backend's state to its file: one flusher goroutine, fed by
// a generation counter that every decision advances under its scope's lock.
type store struct {
	path string
	log  *slog.Logger
	gen  atomic.Uint64
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	saved   uint64        // every change up to this generation is on disk
	tried   uint64        // generation of the last write attempt
	err     error         // its error
	flushed chan struct{} // closed after each write attempt
	closed  bool
}

// Open returns a memory backend. With o.StatePath set it starts from the
// state saved there (a missing file is a fresh start; an unreadable or
// corrupt one is an error naming the path), writes it back at once to prove
// the file writable, and keeps it up to date until Close.
func Open(o Options) (*Backend, error) {
	b := New(o.Now)
	if o.StatePath == "" {
		return b, nil
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	scopes, fixed, err := load(o.StatePath, b.now().UnixMilli(), o.MaxOpen)
	if err != nil {
		return nil, err
	}
	for _, f := range fixed {
		log.Warn("memory state file: a value out of its bounds was clamped", "path", o.StatePath,
			"field", f.field, "value", f.was, "clamped_to", f.is, "allowed", f.allowed)
	}
	if scopes != nil {
		b.scopes = scopes
	}
	removeTemps(o.StatePath)
	st := &store{
		path: o.StatePath, log: log, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}), flushed: make(chan struct{}),
	}
	if err := b.write(st, 0); err != nil {
		return nil, fmt.Errorf("memory state file %s: %w", o.StatePath, err)
	}
	b.store = st
	go b.flusher(st)
	return b, nil
}

// Close stops the flusher after a last write, and reports that write's
// error. A backend without a state file has nothing to close.
func (b *Backend) Close() error {
	st := b.store
	if st == nil {
		return nil
	}
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	st.mu.Unlock()
	close(st.stop)
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

// unlock ends a decision on s: it counts the change for the state file while
// s is still locked, unlocks, and, when the decision changed a breaker or an
// override, waits (outside every lock) until the file holds it, so that an
// answer reporting a transition or an override survives a crash.
func (b *Backend) unlock(ctx context.Context, s *scope, events *[]gate.Event) {
	st := b.store
	if st == nil {
		s.mu.Unlock()
		return
	}
	gen := st.gen.Add(1)
	s.mu.Unlock()
	for _, e := range *events {
		if e.Kind != gate.EventStaleOutcome {
			st.wait(ctx, gen)
			return
		}
	}
}

// wait asks the flusher to write and waits until generation gen is on disk,
// a write covering it failed, the store closed, or maxWait passed.
func (st *store) wait(ctx context.Context, gen uint64) {
	ctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	for {
		st.mu.Lock()
		if st.saved >= gen || st.tried >= gen || st.closed {
			st.mu.Unlock()
			return
		}
		ch := st.flushed
		st.mu.Unlock()
		select {
		case st.kick <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

func (b *Backend) flusher(st *store) {
	defer close(st.done)
	tick := time.NewTicker(FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-st.stop:
			_ = b.write(st, st.gen.Load())
			return
		case <-st.kick:
		case <-tick.C:
		}
		st.mu.Lock()
		saved := st.saved
		st.mu.Unlock()
		if gen := st.gen.Load(); gen > saved {
			_ = b.write(st, gen)
		}
	}
}

// write saves the state as of at least generation gen (read before the
// snapshot, so every change it counts is in it) and tells the waiters.
func (b *Backend) write(st *store, gen uint64) error {
	data, err := json.Marshal(b.snapshot())
	if err == nil {
		err = writeAtomic(st.path, data)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	failing := st.err != nil
	st.tried, st.err = gen, err
	switch {
	case b.store != st:
		// Open's first write: its error is Open's.
	case err == nil:
		st.saved = gen
		if failing {
			st.log.Info("memory state file written again", "path", st.path)
		}
	case !failing:
		st.log.Error("memory state file not written; state changes since are lost if the process dies", "path", st.path, "err", err)
	}
	close(st.flushed)
	st.flushed = make(chan struct{})
	return err
}

// snapshot copies every scope's state, one scope lock at a time; the disk is
// never touched under a lock.
func (b *Backend) snapshot() stateFile {
	now := b.now().UnixMilli()
	b.mu.Lock()
	scopes := make(map[string]*scope, len(b.scopes))
	for name, s := range b.scopes {
		scopes[name] = s
	}
	b.mu.Unlock()
	doc := stateFile{Version: StateVersion, WrittenAtMs: now, Scopes: make(map[string]scopeState, len(scopes))}
	for name, s := range scopes {
		s.mu.Lock()
		ss := scopeState{ProgressMs: s.progress, Sources: make(map[string]sourceState, len(s.sources))}
		for src, state := range s.sources {
			ss.Sources[src] = encodeSource(state, now)
		}
		s.mu.Unlock()
		doc.Scopes[name] = ss
	}
	return doc
}

// writeAtomic replaces the file at path with data so that a reader, or a
// restart after a crash at any moment, sees either the old file or the new
// one, whole: a temporary file in the same directory, synced, renamed over
// path, and the directory synced so that the rename itself is durable.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// removeTemps deletes temporary files a crash left behind mid-write.
func removeTemps(path string) {
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), tempPrefix(path)+"*"))
	for _, f := range left {
		_ = os.Remove(f)
	}
}
