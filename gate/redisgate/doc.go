// Package redisgate is the Redis backend of gate: breakers and quotas shared
// by every replica, each decision one Lua script run on the Redis server.
//
// # Scripts
//
// Each Backend method is one script, one round trip (EVALSHA, or EVAL once
// when the server does not have the script cached): Admit walks every
// candidate of the request in one script; Settle, Peek and Override are one
// each. The scripts are admit.lua, settle.lua, peek.lua and override.lua;
// each is sent as a prelude of the gate package's constants, written by Go,
// then lib.lua, the port of gate/breaker.go and gate/quota.go that all four
// share, then its own body. Keys are passed only in KEYS; every key of a
// scope carries the hash tag {scope}, so the scripts run on Redis Cluster.
// The breaker policy and the limits come in each call's arguments, never
// from Redis, so a reloaded configuration applies at the next call.
//
// # Time
//
// Every script reads the Redis server's own clock (TIME, in whole
// milliseconds), so replicas whose clocks disagree still take the same
// decisions and every decision about one breaker is measured on one clock.
//
// Tests need exact boundaries instead ("1ms before the end of the
// cooldown"), which an offset added to a moving TIME cannot give: the
// script runs some microseconds after the offset was computed. So each
// script takes a now_ms argument instead: 0 in production, where the script
// uses TIME, and the test clock's time when Options.Clock is set.
// Options.Clock is for tests only; a production Backend leaves it nil.
//
// # Expiry
//
// Every key expires once it is no longer needed, so that abandoned scopes
// and sources do not hold memory forever: the quota keys a little after the
// longest lease or the minute they count, a scope's progress and a CLOSED
// breaker after Options.IdleTTL without a write. The exception is a breaker
// that is OPEN or HALF_OPEN, or that an operator overrode: its hash is
// PERSISTed, because an expired OPEN breaker would come back as a fresh
// CLOSED one and skip its cooldown and its probe, and an expired override
// would silently end an operator's decision. Such a hash lives until the
// breaker closes (probe success, reset) or the override is cleared, and then
// goes idle. The keys hold correct state only under a maxmemory-policy that
// never evicts them (noeviction): an evicted lease gives its slot back early.
//
// # Announcements
//
// A script that opens or closes a breaker, or carries out an operator's
// action, PUBLISHes the event on the scope's channel in the same round
// trip; Subscribe hears every scope through one pattern subscription, so a
// sidecar can drop its cooldown memo of a source at once. Delivery is at
// most once: a replica that misses an announcement (it was reconnecting)
// keeps a memo until the memo's own deadline.
package redisgate
