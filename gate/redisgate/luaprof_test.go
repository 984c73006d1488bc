package redisgate

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/internal/redistest"
)

// TestRecordForLuaProfile is a tool more than a test: with
// POLYGATE_LUAPROF=dir it writes the library (dir/lib.lua) and every FCALL
// of 6 400 attempt cycles of the sidecar's kind (BenchmarkAttemptCycle's
// ordered/limits=concurrency) by 64 callers on one scope (dir/calls.bin),
// for testdata/luaprof/profile.sh to replay under callgrind, per function
// of the library (docs/performance.md). Without it, it skips.
func TestRecordForLuaProfile(t *testing.T) {
	dir := os.Getenv("POLYGATE_LUAPROF")
	if dir == "" {
		t.Skip("POLYGATE_LUAPROF is not set")
	}
	if err := os.WriteFile(filepath.Join(dir, "lib.lua"), []byte(library()), 0o644); err != nil {
		t.Fatal(err)
	}
	client := redistest.Start(t).Client(t)
	rec := &fcallRecorder{}
	client.AddHook(rec)
	rb, err := New(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1_000_000 })
	var ids atomic.Int64
	cycle := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		id := fmt.Sprint("p", ids.Add(1))
		a, err := rb.Admit(ctx, gate.AdmitRequest{
			Scope: "bench", PermitID: id, Tokens: 10,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}},
			Line:       &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 64, Lease: time.Second},
		})
		if err != nil || !a.Granted {
			return fmt.Errorf("Admit: %+v %v", a, err)
		}
		_, err = rb.Settle(ctx, gate.SettleRequest{
			Scope: "bench", Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch,
			Verdict: gate.VerdictSuccess, ActualTokens: 12, Progress: true, Line: &gate.LineHandoff{Lease: time.Second},
		})
		return err
	}
	if err := cycle(); err != nil { // the scope's first admit, its re-assertion: recorded too
		t.Fatal(err)
	}
	// POLYGATE_LUAPROF_CALLERS=1 records lone calls (the serial cell's).
	callers := 64
	if n, err := strconv.Atoi(os.Getenv("POLYGATE_LUAPROF_CALLERS")); err == nil && n > 0 && n <= 64 {
		callers = n
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range 6400 / callers {
				if err := cycle(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := os.WriteFile(filepath.Join(dir, "calls.bin"), rec.out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fcallRecorder records every FCALL: per call the count of its strings,
// then each as a 4-byte little-endian length and its bytes.
type fcallRecorder struct {
	redistest.PassThrough
	mu  sync.Mutex
	out []byte
}

func (r *fcallRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if strings.EqualFold(fmt.Sprint(a[0]), "fcall") {
			r.mu.Lock()
			r.out = binary.LittleEndian.AppendUint32(r.out, uint32(len(a)))
			for _, x := range a {
				s, ok := x.([]byte)
				if !ok {
					s = []byte(fmt.Sprint(x))
				}
				r.out = binary.LittleEndian.AppendUint32(r.out, uint32(len(s)))
				r.out = append(r.out, s...)
			}
			r.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
