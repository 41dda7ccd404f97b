// Package redlimit limits how often something may happen per key (per
// user, per IP address, per API token), with the state kept in Redis so
// that every instance of a service shares one limit.
//
// Every limiter implements [Limiter]: Allow and AllowN decide now, Wait and
// WaitN wait their turn, Reset forgets a key, Close stops the limiter. A
// decision is one atomic Lua script, one round trip, on the Redis server's
// clock, and answers with a [Result]. A denial is not an error: err is
// non-nil only when no decision could be made. When a Redis node fails,
// its keys are decided in process ([FallbackPolicy]) until it answers again.
//
//	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10))
//	if err != nil { ... }
//	defer lim.Close()
//
//	res, err := lim.Allow(ctx, "user:42")
//	if err != nil { ... }   // no decision could be made
//	if !res.Allowed { ... } // 429, retry after res.RetryAfter
//
// rdb is a go-redis client: a *redis.Client, *redis.ClusterClient or
// *redis.Ring (see docs/client-options.md for the options to give it).
//
// # Strategies
//
//   - [NewFixedWindow]: a count per aligned window; calendar quotas ([Daily]).
//   - [NewSlidingLog]: exact in any interval, memory per event; small rates.
//   - [NewSlidingCounter]: a cheap estimate of the sliding window.
//   - [NewSubWindowCounter]: the sliding log's bound at any rate, in constant memory.
//   - [NewTokenBucket]: bursts of Burst, then Rate per Period; the choice for APIs.
//   - [NewLeakyBucket]: paces events Period/Rate apart, with a Delay to wait.
//
// [New] picks one at run time. [NewPolicy] decides several rules on one key,
// all or nothing, in one call; [NewConcurrency] limits how many hold a lease
// at once. A limiter is safe for concurrent use; limiters of the same
// strategy, Period and prefix share the limit through Redis.
//
// # Further reading
//
// The README compares the strategies; the how and why of each topic is
// in the repository's docs/ (https://github.com/redlimit/redlimit/tree/main/docs):
//
//   - docs/policies.md: several rules, limits per key ([WithLimitFunc], [WithRulesFunc])
//   - docs/reservations.md: costs known after the call ([RateLimiter.Reserve], [Reservation.Settle])
//   - docs/concurrency.md: leases ([Concurrency])
//   - docs/calendar.md, docs/subwindows.md, docs/warmup.md, docs/byte-rates.md: limits in depth
//   - docs/priorities.md: headroom for critical calls ([WithPriorityShares])
//   - docs/fallback.md: when Redis fails ([FallbackPolicy], [WithFallbackShare], [Transition])
//   - docs/clock.md: Redis TIME and [WithClientClock]
//   - docs/memory.md: eviction ([CheckRedis], [WithEvictionCheck]) and the fallback's memory
//   - docs/cluster.md: Redis Cluster, failover, lost writes
//   - docs/prefetch.md: hot keys decided in process ([WithPrefetch])
//   - docs/abuse.md: [WithBlock], [WithDenyCache], [WithShadow], [WithObserver]
//   - docs/performance.md: what a decision costs, pipelining, [WithRedisFunctions]
//   - docs/http.md, docs/metrics.md: middleware (httplimit, grpclimit) and metrics
//
// BENCHMARKS.md holds the measurements, with the commands that rerun them.
package redlimit
