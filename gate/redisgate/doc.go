// Package redisgate is the Redis backend of gate: breakers, quotas and
// waiting lines shared by every replica, each decision one call of a Lua
// function on the Redis server (docs/redis.md says what it guarantees).
//
// The Lua (lua/, twins of gate's state machines) is one Redis Functions
// library (library.go), and a scope's Admits and Settles share calls
// (batch.go). Every key of a scope carries the hash tag {scope}, so it runs
// on Redis Cluster. Policy and limits come in each call, never from Redis,
// so a reloaded configuration applies at the next call; time is the Redis
// server's.
package redisgate
