// Package redisgate is the Redis backend of gate: breakers, quotas and
// waiting lines shared by every replica, each decision one call of a Lua
// function on the Redis server (docs/redis.md says what it guarantees).
//
// The Lua (lua/: one file per state machine, twins of gate's, and the
// operations) is one Redis Functions library (library.go). Each Backend
// method is one call, one round trip; the Admits and Settles of a scope go
// out together while a call of the scope is in flight (batch.go). The
// arguments and replies are flat lists (wire.go, reply.go); every key of a
// scope carries the hash tag {scope}, so it runs on Redis Cluster.
// Policy and limits come in each call, never from Redis, so a reloaded
// configuration applies at the next call; time is the Redis server's.
//
// Every key expires once it is no longer needed, except the record of a
// breaker that is OPEN, HALF_OPEN or overridden: an expired one would come
// back CLOSED and skip its cooldown and its probe (and so the keys need a
// maxmemory-policy of noeviction).
//
// A call whose reply is lost owes Redis what it may have done (giveback.go);
// a Redis that lost a scope's state gets back the breakers this Backend saw
// before it grants anything of the scope again (loss.go); breaker changes
// are announced to every replica (subscribe.go).
package redisgate
