package redistest

import "github.com/redis/go-redis/v9"

// PassThrough is a go-redis hook that passes every call on. A test's hook
// embeds it and implements only the method it changes (ProcessHook for
// single calls, ProcessPipelineHook for pipelines).
type PassThrough struct{}

// DialHook implements redis.Hook.
func (PassThrough) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (PassThrough) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (PassThrough) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
