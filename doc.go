// Package redlimit limits how often something may happen per key (per
// user, per IP address, per API token), with the state kept in Redis so
// that every instance of a service shares one limit.
//
// # Use
//
// Build a limiter once with a go-redis client (a *redis.Client,
// *redis.ClusterClient or *redis.Ring) and a [Limit], then ask it per call:
//
//	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10))
//	...
//	res, err := lim.Allow(ctx, "user:42")
//	if err != nil { ... }       // no decision could be made (see FallbackPolicy)
//	if !res.Allowed { ... }     // answer 429, retry after res.RetryAfter
//
// Every decision is one atomic Lua script, run with EVALSHA (EVAL when the
// script cache is empty): one round trip. Time is the Redis server's (TIME,
// in microseconds), never the clients', so instances with skewed clocks
// agree. Every key written expires when its state no longer matters.
//
// A denial is not an error: err is non-nil only when no decision was made.
// When Redis is unavailable, the default is to decide in-process (see
// [FallbackPolicy]), with Result.Degraded set, and to go back to Redis by
// itself once it answers again. What is marked unavailable is one Redis
// node (a cluster master, a ring shard), so keys on other nodes stay on
// Redis, and one slow call marks nothing: its node is probed first.
//
// # Choosing a strategy
//
//	strategy        accuracy                         Redis memory per key           writes per decision
//	FixedWindow     Rate per aligned window; up to   88 bytes (one integer)         1 (allowed only)
//	                2×Rate across a window edge
//	SlidingLog      exact: Rate in any Period        ~36 bytes per admitted event   2 (allowed only)
//	                                                 (~120 past 128 events)
//	SlidingCounter  approximate: assumes the last    88 bytes (two packed counts)   1 (allowed only)
//	                window's events were even
//	TokenBucket     exact: Burst at once, then       88 bytes (one integer)         1 (allowed only)
//	                Rate per Period
//	LeakyBucket     exact spacing of Period/Rate;    88 bytes (one integer)         1 (allowed only)
//	                callers wait Result.Delay
//
// Pick TokenBucket for APIs (clients may burst, then keep a steady rate);
// SlidingLog when a limit must hold in any interval exactly and Rate is
// small (login attempts); SlidingCounter for the same with large Rates in
// constant memory; FixedWindow for quotas tied to clock periods ("1000 per
// hour"); LeakyBucket to pace work (a worker calling an upstream API at a
// fixed rate) rather than reject it.
//
// # Keys
//
// The Redis key of a limited key is
//
//	<prefix>:{<key>}:<strategy code><Period in µs>
//
// with '%', '{' and '}' in key percent-encoded, so any non-empty string
// (braces, spaces, newlines, invalid UTF-8, 10 KB keys) is safe, two keys
// never share a Redis key, and every key a call touches is in the key's one
// Redis Cluster slot. Two limiters with different strategies or Periods
// never share state, so a key can be limited at 10 per second and 1000 per
// hour at once. Limiters that differ only in Rate or Burst share state, so
// a limit can be changed during a rolling deploy without resetting anyone.
//
// # Concurrency
//
// A limiter is safe for concurrent use by many goroutines; many instances
// with the same strategy, Period and prefix share the limit through Redis.
// Call Close when done, to stop the fallback monitor.
package redlimit
