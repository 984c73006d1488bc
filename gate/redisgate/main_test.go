package redisgate_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the outage tests cause hundreds.
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}
