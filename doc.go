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
//	                even at byte rates               must live over 83 minutes)
//	LeakyBucket     exact spacing of Period/Rate;    as TokenBucket                   1 (allowed only)
//	                callers wait Result.Delay
//	SubWindowCounter
//	                exact bound: Rate in any         a hash: 120 bytes with events    1, 2 in a new sub-window
//	                Period; denies at most one       in one sub-window, 840 in all    (allowed only); a sub-window
//	                sub-window early                 60 (the default), at any Rate    that left goes at any call
//
// Pick TokenBucket for APIs (clients may burst, then keep a steady rate);
// SlidingLog when a limit must hold in any interval exactly and Rate is
// small (login attempts); SubWindowCounter for the same bound at any Rate
// in constant memory, at the price of at most one sub-window of delay
// ("10,000 an hour, sliding"); SlidingCounter for a cheaper estimate;
// FixedWindow for quotas tied to clock periods ("1000 per hour");
// LeakyBucket to pace work (a worker calling an upstream API at a fixed
// rate) rather than reject it.
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
// # Limits per key
//
// Limits per key, such as a customer's plan: [WithLimitFunc] gives a
// single-strategy limiter the limit of each call's key, [WithRulesFunc] a
// policy the rules. The limit travels with the call (no extra round trip),
// and limits that differ only in Rate or Burst share the key's state, so a
// plan change keeps what was used (a bucket keeps its used tokens, a
// window its count); a different Period is separate state, as for two
// limiters. The deny cache and the in-process fallback follow the limit of
// the latest call for a key. The function is called on every call (Allow,
// AllowN, Wait, WaitN and Reserve, and Reset, which forgets the state of
// the limit it gives): keep it fast, for example a lookup in memory.
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
// [WithClientClock] sends the time with each call instead. No script uses
// a command newer than Redis 6.0 (PXAT and PEXPIRETIME are not used).
//
// Client clocks disagree across a fleet, so the limiter does not send its
// own clock as it is: it reads the server's time with the plain TIME
// command (allowed where the in-script one is not) and sends that time
// plus the time elapsed since on its monotonic clock, so that setting the
// machine's clock (an NTP step) does not move the time it sends. It reads
// TIME twice in a row and keeps the reading with the shorter round trip,
// taken to be from its middle (Cristian's method): the first round trip
// may include dialing and the connection's handshake. It reads again every
// 10 s (the clocks drift apart), after Redis comes back from an outage,
// and when its wall and monotonic clocks disagree (the clock was set, or
// the machine slept). Calls that need a reading share the one under way,
// each waiting no longer than its context allows; a reading that is only
// due is waited for by the one call that takes it. If TIME keeps failing,
// the last reading serves for 20 s; after that, calls fail with TIME's
// error (an outage's goes to the fallback) until a reading succeeds. Time
// sent by one limiter never goes backwards.
//
// Accuracy: with the server's clock (the default), every decision uses the
// one clock, exact to the µs. With WithClientClock, each instance sends
// the server's time to within half the shorter round trip plus the drift
// since its last reading, so instances may disagree by up to about one
// round trip (typically under a millisecond), even when their clocks are
// off by seconds: a window's edge moves by that much, and a bucket refills
// as of the latest time an instance wrote it (a call from a clock behind
// that gets no refill until its clock gets there), so the refill between
// two clocks is given once. Clusters: TIME is asked of the node the
// command goes to; the nodes' clocks should agree (NTP) as they do for key
// expiry.
//
// A step of the server's clock between two instances' readings (a
// failover to a host whose clock is off) makes them disagree by the step
// until they measure again. A bucket then admits at most one Burst more
// than one clock would, once per disagreement (its state's time never goes
// back; the clock behind gets no refill meanwhile), and a concurrency
// limit never holds more than max (a lease set decides on its own time,
// its latest expiry less its PTTL, when a call's disagrees by more than
// 100 ms). A call whose time a script finds behind its key's, or off a
// lease set's, by more than 100 ms makes the limiter measure again, in the
// background, at most once a second.
//
// # Redis Functions
//
// A decision is one EVALSHA of a script with the limiter's rules written
// in. Where Redis has functions (7.0 and later, Valkey),
// [WithRedisFunctions] loads the same code as a library once and decides
// with FCALL: Redis then makes the script's Lua functions once, when it
// loads the library, instead of on every call, and executes 10 to 16%
// fewer instructions per decision (see BENCHMARKS.md). It applies to the
// limiter's own rules, with the same decisions; limits from WithLimitFunc
// or WithRulesFunc, limiters made after a process has made its most
// scripts with rules written in (128), and settling a reservation stay
// scripts.
//
// The library is loaded on the first call that finds it missing, on the
// node that serves the key (FUNCTION LOAD), and again after a FUNCTION
// FLUSH, a failover to a node without it, or a new cluster node. (Through
// an AutoPipeliner over a cluster or ring, FUNCTION LOAD has no key to be
// routed by: the library reaches every node after a few tries, the calls
// in between running the script.) Where functions are missing (Redis 6,
// miniredis, a proxy without FCALL), or the user may not call or load
// them, the limiter uses the script, as without the option, and stops
// trying.
//
// Unlike a script, a library stays in Redis: it is saved with the data,
// replicated, and never evicted, which is why it is opt-in. There is one
// per set of rules (its name, "redlimit_" and 16 hex digits, is a hash of
// its code), so a program that changes its limits on every deploy leaves
// one behind each time; they take 46 KB (one rule, a token bucket) to
// 118 KB (four rules of four strategies) each, measured on Redis 7.0, and
// FUNCTION DELETE removes one (a limiter that still uses it loads it
// again).
//
// Past maxmemory, with too few replicas for min-replicas-to-write, or
// after a failed save, Redis refuses every call of a function that may
// write, where it refuses a script only when it writes: such a call runs
// the script, so that a denial is still answered, as without the option.
//
// # Outages
//
// While a Redis node is marked unavailable, the monitor probes it every
// ping interval ([WithPingInterval], 100ms by default); two probes in a
// row must succeed before calls go back to it. While the node cannot be
// reached at all (connections refused, dials failing or timing out, no
// shard or sentinel left), the interval doubles after each failed probe,
// up to three times the ping interval (300ms by default), and is back to
// the ping interval after any probe that reaches the node. This keeps
// go-redis's "failed to dial" log lines to about three a second during a
// long outage, from ten (to silence them, set a logger with
// redis.SetLogger); a node that answers, even with an error, or hangs is
// probed at the ping interval, so that it is used again soon after it
// recovers. go-redis adds its own wait: once PoolSize dials in a row have
// failed, its pool dials again only once a second, so a restarted node can
// take up to about 1.4s to be used again.
//
// [WithFallbackShare] scales the in-process limits to an instance's share.
// A capacity that the share makes fractional (5 × 1/20 = 0.25) is kept on
// average: each instance's stand-in starts one event short with the
// probability of the fraction left out, so that 20 instances admit about 5
// between them. The trade-off: with 1/N, keys whose traffic reaches only
// some instances (sticky sessions, one client's connection) get less than
// the global limit while Redis is down. For login attempts, password
// resets and other security limits, prefer a share of 1/N (or
// FallbackDeny): over-admission there is the risk; for API quotas, 1 keeps
// users unaffected.
//
// The stand-ins ([WithFallbackKeys]) not used lately are dropped by the
// CLOCK approximation of least recently used; they are split over 16
// shards, each of which holds at least one key whatever its rules. A
// Concurrency's semaphore that holds a lease is never dropped: when every
// one a shard keeps holds one, a new key is denied at once (it looks at 32
// of them at most; RetryAfter the ping interval) until one is free. A
// semaphore costs about 215 bytes, and the outage's go once Redis answers
// again: the idle ones at once, the others with their last lease. The
// default of 100,000 stand-ins costs
// about 210 bytes a key plus 145 a rule (keys of about 25 bytes), so at
// most about 36 MB, reached by single-rule keys (3 rules: 20 MB; 16 rules:
// 16 MB), plus the length of longer keys. Redis's last answers, which the
// stand-ins start from, are kept while Redis is healthy, as many as the
// keys (and rules) Redis answered, at most WithFallbackKeys: 50 to 100
// bytes each (3.3 KB for a limiter that saw 10 keys, 6.3 MB at 100,000).
//
// # Eviction
//
// A Redis server that evicts keys when full may evict a limiter's state,
// which then starts over. [WithEvictionCheck] notices it: evicted_keys
// rising between two samples of INFO on a server whose maxmemory-policy
// can evict. The first rise is reported once, as a [Transition] of Kind
// TransitionEvicted with Evicted set (to the hook of [WithOnTransition];
// its Down is false: a hook should switch on Kind, or log the Transition's
// String, which says what it is) and as one line of the standard
// library's log package (go-redis does not export its own logger); a
// server is reported again only after a sample found it not evicting and
// at least 10 minutes passed since its last rise. evicted_keys counts
// every key the server evicted, not only the limiter's: it is the evidence
// that the server deletes keys when full, which on an allkeys-* policy may
// be limiter keys, and on a volatile-* policy are most likely them (every
// limiter key has a TTL).
//
// Sampling is shared by the limiters of one client with the same
// interval, and lazy: the baseline is read when the first of them starts,
// the first sample compared with it is taken one interval after their
// first decision, and later ones by a decision that Redis answered once
// the interval has passed since the last (each one goroutine, bounded by a
// second; Close does not wait for it). A decision costs one atomic load,
// and idle limiters run nothing. A server that refuses INFO memory is not
// sampled again.
//
// # Prefetch
//
// [WithPrefetch] lets a hot key be decided in this process, from events
// taken from Redis in advance: a prefetch. It is for TokenBucket and
// FixedWindow limiters, and for a Policy whose rules are all token
// buckets, none of them PerCall; the other strategies reject it: a sliding
// log's entries carry the time of each event, a sliding counter weighs a
// window by the time into the next, and a leaky bucket gives each event
// its own Delay, so none of them can hand out an event later than Redis
// counted it.
//
// How it works. A key's first calls go to Redis one by one, as without
// prefetches. When this process has seen at least 4 events for the key in
// the last maxAge, a call takes a prefetch instead: one script call that
// takes k events in Redis, as [RateLimiter.Reserve] does, with
//
//	k = min(size, the key's events here in the last maxAge,
//	        a quarter of the Remaining Redis last reported for the key)
//
// (a FixedWindow prefetch also ends with its window, and holds no more
// than the key's rate here over that time). The call takes its n events
// from the prefetch; later calls for the key take theirs from it without a
// round trip, under a mutex per key, until it is used up, maxAge after it
// was taken, or the window ends; then what is left is given back to Redis
// (settled, one script call) and the next call takes a new prefetch. Reset
// gives the key's prefetch back at once, Close every prefetch (see Close
// below). Calls that find a prefetch being taken wait for it (or for their
// context). A prefetch is taken apart from the call that asked for it
// (with its context's values, not its end, for at most a second or until
// the call's deadline if later): a call whose context ends first returns
// its context's error, and the prefetch still comes to the key, so that it
// loses no more than a call without prefetches would.
//
// What it guarantees. No over-admission: every event served here was taken
// in Redis first, so the instances together never admit more than the
// limit; a prefetch that Redis denies is never served from, the call is
// then decided by Redis alone, with its own n (and its own RetryAfter,
// penalty block and deny-cache entry). A prefetch asks for at most a
// quarter of what Redis reported left, and a key with fewer than 16 left
// is decided one call at a time, so that a key near its limit is not held
// idle by instances that do not need it. The cost is capacity held idle:
// events prefetched by one instance and not yet served cannot be admitted
// by another. Per key and instance that is at most size (a prefetch given
// back but not yet settled counts against the next), and it comes back
// within about 1.25×maxAge, or as soon as the prefetch is used up (see
// [RateLimiter.PrefetchStats]); an instance that crashes strands its
// prefetches until the bucket refills or the window ends. A limiter holds
// at most 1024 prefetches at once; more hot keys are decided one call at a
// time. A token bucket's event may be served up to maxAge after Redis
// counted it, so from any start the fleet admits at most Burst + Rate·t,
// but a short interval may see up to Rate·maxAge more than
// Burst + Rate·d (admitted earlier in Redis); a fixed window's prefetch
// never outlives its window.
//
// What a call served from a prefetch reports: Allowed true, Degraded
// false, Limit and Rule of the prefetch, RetryAfter and Delay 0,
// ResetAfter the prefetch's ResetAfter less the time since, and Remaining
// the events left in this instance's prefetch: what this instance is sure
// to admit without asking Redis. It is never more than what Redis reported
// left when the prefetch was taken (the prefetch included) less what was
// served from it since; Redis may have more. The observer (see
// [WithObserver]) sees every call, also those served from a prefetch:
// NotDenied, not Degraded, a Latency of about a microsecond (a call that
// took the prefetch, or waited for it, also counts the round trip).
// Denials always come from Redis or the deny cache.
//
// Not prefetched: Reserve (a reservation is settled in Redis), AllowN with
// n = 0 (it reports Redis's state, without the prefetches that instances
// hold), dynamic rules (WithLimitFunc, WithRulesFunc) that are not
// prefetchable, and every call while Redis is marked down (the fallback
// decides; a prefetch still held is served from until it ends). With
// WithBlock, a block that another instance sets reaches this one's callers
// when its prefetch ends. Reset gives back this process's prefetch on the
// key; other processes keep serving theirs until they end.
//
// What it costs. A limiter with prefetches runs one goroutine only while
// it holds a prefetch (or one waits to be given back): it wakes every
// maxAge/4, at least 1 ms apart, for about 4 µs of CPU (0.02% of a core at
// maxAge 100 ms), and it ends when the last prefetch is given back. An
// idle limiter costs no goroutine and no CPU.
//
// Close gives back every prefetch, 16 at a time, all within 100 ms, and
// waits for the Redis calls of prefetches under way (a give-back, or a
// prefetch being taken), which the client's ReadTimeout bounds: with the
// recommended 100 ms it ends within about 100 ms even while Redis hangs.
// What it could not give back it reports in an error wrapping
// [ErrUnavailable] that names the events and prefetches (and in
// PrefetchStats.Lost): those events count as used until their state
// expires, as a crashed instance's do.
//
// Longer prefetches (a larger maxAge) save round trips on keys whose rate
// is steady, but hold more capacity idle when a key cools down.
//
// # Concurrency
//
// A limiter is safe for concurrent use by many goroutines; many instances
// with the same strategy, Period and prefix share the limit through Redis.
// Call Close when done, to stop the fallback monitor.
package redlimit
