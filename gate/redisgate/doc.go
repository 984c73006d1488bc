// Package redisgate is the Redis backend of gate: breakers and quotas shared
// by every replica, each decision one Lua script run on the Redis server.
package redisgate
