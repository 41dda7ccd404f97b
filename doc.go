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
// in microseconds), not the clients', so instances with skewed clocks agree
// (see Clock below for servers that refuse TIME in a script).
// Every key written expires when its state no longer matters.
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
//	strategy        accuracy                         Redis memory per key             writes per decision
//	FixedWindow     Rate per aligned window; up to   88 bytes (one integer)           1 (allowed only)
//	                2×Rate across a window edge
//	SlidingLog      exact: Rate in any Period        ~36 bytes per admitted event     1 to 3 (allowed only)
//	                                                 (~120 past 128 events)
//	SlidingCounter  approximate: assumes the last    88 bytes (two packed counts)     1 (allowed only)
//	                window's events were even
//	TokenBucket     exact: Burst at once, then       88 bytes (one integer: the       1 (allowed only)
//	                Rate per Period, to the event    tokens used; 136 when the key
//	                even at byte rates               must live over 5.8 days)
//	LeakyBucket     exact spacing of Period/Rate;    as TokenBucket                   1 (allowed only)
//	                callers wait Result.Delay
//
// Pick TokenBucket for APIs (clients may burst, then keep a steady rate);
// SlidingLog when a limit must hold in any interval exactly and Rate is
// small (login attempts); SlidingCounter for the same with large Rates in
// constant memory; FixedWindow for quotas tied to clock periods ("1000 per
// hour"); LeakyBucket to pace work (a worker calling an upstream API at a
// fixed rate) rather than reject it.
//
// The buckets count the tokens used, in exact integers, so they suit byte
// rates: at 1e9 bytes per second, one microsecond refills exactly 1000, and
// 1500-byte packets pass one every 1.5 µs. A caller that keeps asking for
// more gets at least 99.9% of Burst + Rate·d over a time d, and never more.
//
// # Policies
//
// A [Policy] holds several rules on one key, all or nothing, in one script
// call: "10 per second AND 1000 per hour" is
//
//	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
//		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
//		{Name: "hour", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(1000)},
//	})
//
// n events are allowed only if every rule allows them, and a denial takes
// nothing from any rule; Result.Rule names the rule that decided. Every
// rule counts the call's n, but a rule with PerCall counts each call as
// one: requests per second beside tokens per minute in one policy.
//
// Limits per key, such as a customer's plan: [WithLimitFunc] gives a
// single-strategy limiter the limit of each call's key, [WithRulesFunc] a
// policy the rules. The limit travels with the call (no extra round trip),
// and limits that differ only in Rate or Burst share the key's state, so a
// plan change keeps what was used.
//
// # Reservations
//
// When the cost of a call is known only after it (an LLM request's tokens,
// an upload's bytes), [RateLimiter.Reserve] and [Policy.Reserve] take the
// most it may use, and [Reservation.Settle] records what it used: the
// unused events come back (within the bounds Settle describes), an
// overspend is owed, and a reservation settles once ([ErrSettled] on a
// second Settle, also a retry after a lost reply). A reservation not
// settled within its lifetime ([WithReservationTTL], one hour by default)
// stands as taken.
//
// # Keys
//
// The Redis key of a limited key is
//
//	<prefix>:{<key>}:<strategy code><Period in µs>
//
// (with ":b" after it for a penalty block, and ":r" for pending
// reservations), with '%', '{' and '}' in key percent-encoded (a key longer
// than MaxKeyLen is written as "%h" and its SHA-256 in hex instead), so any
// non-empty string (braces, spaces, newlines, invalid UTF-8, 10 KB keys) is
// safe, two keys
// never share a Redis key, and every key a call touches is in the key's one
// Redis Cluster slot. Two limiters with different strategies or Periods
// never share state, so a key can be limited at 10 per second and 1000 per
// hour at once. Limiters that differ only in Rate or Burst share state, so
// a limit can be changed during a rolling deploy without resetting anyone.
//
// # Clock
//
// By default every script reads the server's clock, TIME, so every instance
// decides on one clock, exact to the microsecond. Where a server refuses
// TIME in a script (AWS ElastiCache Serverless, some proxies),
// [WithClientClock] sends the time with each call instead: the limiter
// measures its clock's offset to the server's with the plain TIME command,
// again every 10 s and after an outage, so instances agree
// to within about one round trip. No script uses a command newer than
// Redis 6.0 (PXAT and PEXPIRETIME are not used).
//
// # Redis Functions
//
// A decision is one EVALSHA of a script with the limiter's rules written
// in. Where Redis has functions (7.0 and later, Valkey),
// [WithRedisFunctions] loads the same code as a library once and decides
// with FCALL, for which Redis executes 10 to 16% fewer instructions per
// decision; the library then stays in Redis (saved and replicated), which
// is why it is opt-in.
//
// # Concurrency
//
// A limiter is safe for concurrent use by many goroutines; many instances
// with the same strategy, Period and prefix share the limit through Redis.
// Call Close when done, to stop the fallback monitor.
package redlimit
