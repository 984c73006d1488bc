package redistest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Recorder is a go-redis hook that records every command a client sends
// (pipelined ones included), for tests that count round trips or read a
// script's arguments: client.AddHook(rec).
type Recorder struct {
	PassThrough
	mu   sync.Mutex
	cmds [][]any
}

// ProcessHook implements redis.Hook.
func (r *Recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (r *Recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.record(cmds...)
		return next(ctx, cmds)
	}
}

func (r *Recorder) record(cmds ...redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cmds {
		// A copy of the arguments as sent: a caller may reuse a byte
		// argument's buffer once its call returns.
		args := slices.Clone(c.Args())
		for i, a := range args {
			if b, ok := a.([]byte); ok {
				args[i] = slices.Clone(b)
			}
		}
		r.cmds = append(r.cmds, args)
	}
}

// Take returns the commands recorded since the last Take: their lowercase
// names and their whole arguments.
func (r *Recorder) Take() (names []string, args [][]any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.cmds {
		names = append(names, strings.ToLower(fmt.Sprint(a[0])))
	}
	args, r.cmds = r.cmds, nil
	return names, args
}

// Names is Take without the arguments.
func (r *Recorder) Names() []string {
	names, _ := r.Take()
	return names
}
