// Package redisgate is the Redis backend of gate: breakers and quotas shared
// by every replica, each decision one Lua function call on the Redis server.
//
// # Functions and scripts
//
// Each Backend method is one call, one round trip: Admit walks every
// candidate of the request at once; Settle, Peek and Override are one call
// each. Admits and Settles of one scope go out in batches (batch.go, group
// commit): at most one batch call of a scope is in flight, and those that
// arrive meanwhile go out together as the next, one run of batch.lua that
// runs each by its own body, its settles first and then its admits, each
// kind in arrival order. The Lua bodies are admit.lua,
// settle.lua (parts of batch.lua), peek.lua and
// override.lua, and restore.lua is the re-assertion of OPEN breakers and
// overrides after Redis lost a scope (reassert.go: before an Admit that
// finds the scope's marker changed, and in the background), run the same
// way; with lib.lua, the port of gate/breaker.go and gate/quota.go
// that all of them share, and a prelude Go writes (the gate package's
// constants and the layouts below), they form one Redis Functions library,
// named by the digest of its text so that sidecars of different versions
// sharing a Redis each call their own. It is loaded (FUNCTION LOAD REPLACE,
// on every master of a Cluster) the first time a call finds it missing
// ("Function not found": first use, a restart, FUNCTION FLUSH), and each
// call is an FCALL that runs only its body. Where FUNCTION LOAD is refused
// (Redis without Functions, an ACL without the FUNCTION command) each
// method is a script of its own, prelude .. lib.lua .. body (EVALSHA, EVAL
// once when the server does not have it cached), which re-runs lib.lua's
// definitions on every call.
//
// Keys are passed only as keys; every key of a scope carries the hash tag
// {scope}, so the library runs on Redis Cluster. The breaker policy and the
// limits come in each call's arguments, never from Redis, so a reloaded
// configuration applies at the next call.
//
// # Layouts
//
// Every block of arguments and every reply record (a candidate, a breaker
// view, an event, ...) is described once, in layout.go: a table of named
// fields from which both the Go side (packing arguments, parsing replies)
// and the Lua side (the prelude's LAYOUT.read and LAYOUT.pack, which turn a
// block into a table of named fields and back) are made. Argument blocks
// and the hot replies (admit's, settle's, and the records in them) are
// packed: one string each, which Lua reads and writes with one struct call
// and Redis passes as one bulk string; the Go parser of a packed reply
// refuses a short one, one longer than its record, and a number that is
// no integer. Lua never counts
// a position by hand (a test greps the sources), and every Lua function
// that follows a Go function names it in a "twin:" comment that a test
// checks against package gate.
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
// and sources do not hold memory forever: the minute's log a little after
// the minute it counts, a scope's progress after Options.IdleTTL without a
// write, and a source's state hash (its breaker and leases) while CLOSED
// between 7/8 of Options.IdleTTL and Options.IdleTTL after its last write
// (the TTL is set again once an eighth of it has passed, not on every
// write). The exception is a breaker that is OPEN or HALF_OPEN, or that an
// operator overrode: its hash is
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
//
// # The client's hooks
//
// An admit's or a settle's argument is written into a buffer the Backend
// keeps between calls (its garbage is what a held call costs in RSS,
// docs/performance.md): once a call returns, its argument bytes are reused.
// A hook of the client that keeps a command's arguments past the call must
// copy them, as internal/redistest's Recorder does.
package redisgate
