package redlimit

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"
)

// This file holds every option of the limiters, grouped by concern, and
// the config they fill in, with its defaults and checks. Longer
// explanations are in the package documentation (doc.go).

// Option configures a limiter. Options are applied in order, so a later one
// wins.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds every option, with its default set in defaultConfig.
type config struct {
	prefix       string
	fallback     FallbackPolicy
	pingInterval time.Duration
	share        float64
	localKeys    int
	onTransition func(Transition)
	block        time.Duration
	denyCache    int
	shadow       bool
	observer     func(Decision)
	clientClock  bool
	now          func() time.Time // the client clock (tests set it with withClock)
	limitFunc    func(ctx context.Context, key string) (Limit, error)
	rulesFunc    func(ctx context.Context, key string) ([]Rule, error)
	reserveTTL   time.Duration
	prefetch     prefetchConfig // WithPrefetch (prefetch.go)
	functions    bool           // WithRedisFunctions (functions.go)
	evictEvery   time.Duration  // WithEvictionCheck (evict.go)
	priority     priorityShares // WithPriorityShares (priority.go)
	regions      *Regions       // WithRegions (regions.go)

	// Derived by validate, as script arguments.
	argBlock      any
	argReserveTTL any
}

func defaultConfig() config {
	return config{
		prefix:       "redlimit",
		fallback:     FallbackLocal,
		pingInterval: 100 * time.Millisecond,
		share:        1,
		localKeys:    100_000,
		denyCache:    0,
		now:          time.Now,
		reserveTTL:   time.Hour,
		functions:    functionsByDefault,
		evictEvery:   defaultEvictEvery,
	}
}

func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalidArgument)
	}
	switch {
	case c.prefix == "":
		return bad("empty prefix")
	case strings.ContainsAny(c.prefix, "{}"):
		return bad("prefix %q must not contain '{' or '}' (they would move keys to another cluster slot)", c.prefix)
	case c.fallback < FallbackLocal || c.fallback > FallbackError:
		return bad("unknown fallback policy %d", c.fallback)
	case c.pingInterval <= 0:
		return bad("ping interval %v must be positive", c.pingInterval)
	case !(c.share > 0 && c.share <= 1):
		return bad("fallback share %v must be in (0, 1]", c.share)
	case c.localKeys < 1:
		return bad("WithFallbackKeys %d (stand-ins: one per rule of each key) must be at least 1", c.localKeys)
	case c.block < 0 || (c.block > 0 && c.block < time.Millisecond):
		return bad("block %v must be 0 or at least 1ms", c.block)
	case c.block > MaxPeriod:
		return bad("block %v must be at most %v", c.block, MaxPeriod)
	case c.denyCache < 0:
		return bad("deny cache size %d must not be negative", c.denyCache)
	case c.evictEvery < 0:
		return bad("eviction check interval %v must not be negative", c.evictEvery)
	case c.now == nil:
		return bad("nil clock")
	case c.reserveTTL < time.Second || c.reserveTTL > MaxPeriod:
		return bad("reservation lifetime %v must be between 1s and %v", c.reserveTTL, MaxPeriod)
	case c.priority.on && !(0 < c.priority.sheddable && c.priority.sheddable <= c.priority.normal && c.priority.normal <= 1):
		return bad("priority shares %v (sheddable) and %v (normal) must be 0 < sheddable <= normal <= 1",
			c.priority.sheddable, c.priority.normal)
	}
	if c.priority.on {
		c.priority.ppm[Sheddable] = sharePPM(c.priority.sheddable)
		c.priority.ppm[Normal] = sharePPM(c.priority.normal)
	}
	c.argBlock = int64(c.block / time.Microsecond)
	c.argReserveTTL = int64(c.reserveTTL / time.Millisecond)
	return nil
}

// Keys.

// WithPrefix sets the prefix of every Redis key the limiter writes. The
// default is "redlimit". It must not be empty or contain '{' or '}'.
// Keys look like "<prefix>:{<key>}:<strategy><period in µs>", with '%', '{'
// and '}' in key percent-encoded, or, for a key longer than MaxKeyLen,
// "%h" and its SHA-256 in hex in its place; beside it, with WithBlock, the
// penalty block (":b" after the first rule's key) and, with reservations
// or prefetches, each rule's pending reservations (":r" after its key).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) { c.prefix = prefix })
}

// Limits per call.

// WithLimitFunc makes every decision of a single-strategy limiter use the
// limit f returns for the call's context and key: a user's plan, a
// per-customer override from a database. A zero Limit means the limiter's
// own. An error from f is returned, wrapped, and no decision is made; an
// invalid Limit from f is an error wrapping ErrInvalidLimit, never a panic.
// f is called on every call (Reset and Reservation.Settle included); keep it fast, for example a
// lookup in memory. How such limits share state, and cost no round trip:
// see "Limits per key" in the package documentation. For a [Policy], use
// [WithRulesFunc]. For a [Concurrency], the Limit's Rate is the key's max
// (a plan's cap; see [Concurrency.TryAcquire]).
func WithLimitFunc(f func(ctx context.Context, key string) (Limit, error)) Option {
	return optionFunc(func(c *config) { c.limitFunc = f })
}

// WithRulesFunc is the Policy form of [WithLimitFunc]: every decision uses
// the rules f returns for the call's context and key (nil or empty: the
// policy's own). The rules are checked as NewPolicy checks them; rules of
// the same Strategy and Period share state with the policy's own, whatever
// their names. f is called on every call; keep it fast.
func WithRulesFunc(f func(ctx context.Context, key string) ([]Rule, error)) Option {
	return optionFunc(func(c *config) { c.rulesFunc = f })
}

// Decisions: penalties, shadow mode, the deny cache and observation.

// WithBlock sets a penalty: once a key is denied by the limit, every call
// for it is denied for d, each with RetryAfter the block's time left, or
// the time until the limit would allow that call's n if that is longer
// (so that a client that waits RetryAfter is not denied again by the
// limit), and ResetAfter the later of the block's end and the limit's
// reset; AllowN with n = 0 reports Remaining 0 and that ResetAfter. The
// block lives in Redis, in the same cluster slot as the key's state, set
// by the same script that denies; Reset lifts it. The default is 0, no
// block.
func WithBlock(d time.Duration) Option {
	return optionFunc(func(c *config) { c.block = d })
}

// WithShadow turns on shadow mode, for rolling out a new limit safely: the
// limiter decides and records everything as usual (in Redis, blocks
// included), but allows what the limit or a block denied: such a result
// has Allowed true and Shadowed true, and the observer sees the would-be
// denial. A leaky bucket still shapes: an allowed call keeps its Delay
// (which WaitN and the middleware wait), and a call whose wait would pass
// the caller's deadline or the middleware's max delay is still refused
// (DeniedByDeadline: it could not have waited anyway). To dry-run a leaky
// bucket, do not wait Result.Delay.
func WithShadow() Option {
	return optionFunc(func(c *config) { c.shadow = true })
}

// WithDenyCache keeps, in this process, up to maxKeys keys (at least 16:
// one in each of its shards) that Redis denied, each until the RetryAfter
// Redis gave, for calls asking the same number of events: calls for them
// are denied without a round trip (DeniedByDenyCache), with Redis's denial
// counted down (its deciding rule, Limit and Remaining; RetryAfter and
// ResetAfter less the time since). Since no call can succeed for a denied
// key before RetryAfter (unless Reset), this never allows what Redis would
// deny; it denies for at most about one round trip longer. Reset clears
// this process's entry, but not other processes': after a Reset, they deny
// until their entry expires. 0 turns it off, which is the default.
func WithDenyCache(maxKeys int) Option {
	return optionFunc(func(c *config) { c.denyCache = maxKeys })
}

// WithObserver sets a function called after every decision, from the
// calling goroutine: use it to export metrics (see examples/prometheus). It
// is also called for a call of more events than a rule can ever hold,
// which fails with ErrExceedsLimit (Decision.Err; no decision is made, and
// the rule named is the one of the smallest capacity): the caller's error,
// as a 4xx is. It must be quick and safe for concurrent use. The default is
// none.
func WithObserver(f func(Decision)) Option {
	return optionFunc(func(c *config) { c.observer = f })
}

// WithPriorityShares sets the share of each limit that calls of the lower
// priorities may use (see [Priority] and [ContextWithPriority]): a
// Sheddable call is admitted only while the key's usage after it stays
// within sheddable × capacity, a Normal call within normal × capacity;
// Critical calls may use all of it. 0 < sheddable <= normal <= 1. A
// rule's capacity is its Rate (Burst for the buckets, max for a
// Concurrency) and a call's share of it floor(share × capacity), with the
// share taken to a millionth; a bucket with a warm-up takes no share. A
// call that only its share denies has Result.ByPriority set. Without this option every priority may use all.
// See docs/priorities.md.
func WithPriorityShares(sheddable, normal float64) Option {
	return optionFunc(func(c *config) {
		c.priority = priorityShares{on: true, sheddable: sheddable, normal: normal}
	})
}

// Outages: the fallback and its monitor.

// WithFallback sets what the limiter answers while Redis is unavailable.
// The default is FallbackLocal.
func WithFallback(p FallbackPolicy) Option {
	return optionFunc(func(c *config) { c.fallback = p })
}

// WithPingInterval sets how often the monitor probes a Redis node while it
// is marked unavailable. The default is 100ms. Two probes in a row must
// succeed before calls go back to the node. While the node cannot be
// reached at all, the interval doubles after each failed probe, up to
// three times the ping interval; see "Outages" in the package
// documentation. Limiters on one client share one monitor per node,
// which probes at the shortest of their ping intervals (see
// [FallbackPolicy]).
func WithPingInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pingInterval = d })
}

// WithFallbackShare scales the in-process fallback limits to this
// instance's share of the global limit, in (0, 1]. With N instances behind
// one Redis, 1/N makes the fleet admit about the global limit during an
// outage, instead of N times it. The default is 1. For login attempts and
// other security limits, prefer 1/N (or FallbackDeny); for API quotas, 1
// keeps users unaffected. Fractional capacities and the trade-off: see
// "Outages" in the package documentation.
func WithFallbackShare(share float64) Option {
	return optionFunc(func(c *config) { c.share = share })
}

// WithFallbackKeys bounds the in-process stand-ins the fallback keeps:
// one per rule of each key (so a limiter keeps n keys, a Policy of 3
// rules n/3), or one semaphore per key for a Concurrency. Beyond it,
// keys not used lately are dropped (and start again from Redis's last
// answer, or full, if they come back). It also bounds Redis's last
// answers that stand-ins start from (one per rule of each key answered,
// 50–100 bytes each, as many as the keys seen).
// The default is 100,000 stand-ins, at most about 36 MB. How they are
// dropped, and what they cost: see "Outages" in the package documentation.
func WithFallbackKeys(n int) Option {
	return optionFunc(func(c *config) { c.localKeys = n })
}

// WithOnTransition sets a function called when the limiter switches a Redis
// node to its fallback and when it switches it back. It is called once per
// switch (never per call), one call at a time, in the order of the
// switches, from one of the limiter's goroutines (usually the one that
// noticed; a switch made while an earlier one is being reported is
// reported right after it, from the goroutine reporting). It must not
// block; it may call the limiter, Close included. A panic in it is
// recovered and dropped. Use it to log or count outages. It also gets the
// eviction notices of [WithEvictionCheck], which are not switches: tell
// them apart by Transition.Kind (their Down is false). Limiters that
// share a node's monitor (see [FallbackPolicy]) each get every switch
// through their own hook; a limiter made while a node is marked down is
// told so from its constructor.
func WithOnTransition(f func(Transition)) Option {
	return optionFunc(func(c *config) { c.onTransition = f })
}

// The Redis server: its clock, functions and eviction.

// WithClientClock makes the limiter pass the time to its scripts instead of
// reading the Redis server's TIME inside them. Use it only for servers that
// refuse TIME in a script ("This Redis command is not allowed from script":
// AWS ElastiCache Serverless, and some proxies); everywhere else the
// default, the server's clock, is exact and needs nothing. The limiter
// sends the server's time, read with the plain TIME command and carried on
// its monotonic clock, so instances agree to within about one round trip.
// How it measures, and its accuracy: see "Clock" in the package
// documentation.
func WithClientClock() Option {
	return optionFunc(func(c *config) { c.clientClock = true })
}

// WithRedisFunctions makes the limiter decide with a Redis Function
// (FCALL) instead of a script (EVALSHA), where the server has them (Redis
// 7.0 and later, Valkey): Redis executes 10 to 16% fewer instructions per
// decision. Where functions are missing or refused, the limiter uses the
// script, as without this option. A library stays in Redis (saved,
// replicated, never evicted), one per set of rules, which is why it is
// opt-in. When it applies, how it is loaded and what it costs: see "Redis
// Functions" in the package documentation.
func WithRedisFunctions() Option {
	return optionFunc(func(c *config) { c.functions = true })
}

// WithEvictionCheck sets how often, at most, the limiters of a Redis
// client sample INFO on its masters (as [CheckRedis] finds them) to
// notice that they evict keys. The first rise of evicted_keys is reported
// once, as a [Transition] of Kind TransitionEvicted (to the hook of
// [WithOnTransition]) and as one line of the standard library's log
// package. Sampling is lazy and shared by a client's limiters: the first
// of them to start reads the baseline, a decision costs one atomic load,
// and idle limiters run nothing after that. The default is
// 10s; 0 turns sampling off. See "Eviction" in the package documentation.
func WithEvictionCheck(every time.Duration) Option {
	return optionFunc(func(c *config) { c.evictEvery = every })
}

// Reservations and prefetches.

// WithReservationTTL sets how long a reservation can be settled. After it
// the reservation stands as taken and Settle returns ErrSettled. Redis keeps
// one sorted-set member per reservation and rule that is neither settled
// nor lapsed, in a set beside the rule's state, in the key's slot. Per
// rule (a Policy pays it for each): the first pending on a key costs the
// set, about 120 bytes with its key's name; each further one about 26
// bytes while the key has at most 128 pending, about 104 past that (10 MB
// for 100,000; measured on Redis 7.0). The default is one hour; it must
// be between 1s and MaxPeriod.
func WithReservationTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.reserveTTL = d })
}

// WithPrefetch lets a hot key be decided in this process, from events taken
// from Redis in advance (a prefetch of at most size events, held at most
// maxAge), saving round trips without admitting more than the limit. It is
// for TokenBucket and FixedWindow limiters, and for a Policy whose rules
// are all token buckets, none of them PerCall; the other strategies reject
// it (an error wrapping ErrInvalidArgument). size 0 turns prefetches off,
// which is the default; else size must be at least 4, and maxAge between
// 1ms and 1 minute, and at most half the reservation lifetime (see
// [WithReservationTTL]). How it works, what it guarantees, reports and
// costs: see "Prefetch" in the package documentation.
func WithPrefetch(size int, maxAge time.Duration) Option {
	return optionFunc(func(c *config) { c.prefetch = prefetchConfig{size: size, maxAge: maxAge} })
}

// Regions.

// WithRegions makes the limit one across regions, each deciding on its own
// Redis: every decision is made on this limiter's client, as without it,
// and what the region admits for a key reaches the peers' Redis in the
// background, every r.Sync, charged there once however many instances run
// (see [Regions] and docs/regions.md for the bound on what the regions
// admit together, and partitions). A peer not reached for 4 intervals is
// taken to spend its share of the limit (1 / regions) until it is reached
// again; decisions meanwhile report Result.Stale. The sliding log, whose
// timestamps do not add up across regions, is refused (ErrInvalidLimit),
// as is a Concurrency; an empty Name, no peers, a peer named as this
// region or a nil peer client is an error wrapping ErrInvalidArgument.
func WithRegions(r Regions) Option {
	r.Peers = maps.Clone(r.Peers)
	return optionFunc(func(c *config) { c.regions = &r })
}
