package redlimit

import (
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A limit with a WarmUp (Limit.WarmUp) is a token or leaky bucket that
// starts slowly when cold, Guava's SmoothWarmingUp with cold factor 3:
// scripts/warmup.lua decides it, on the engine every strategy shares, with
// its own state key and strategy code ("wt" or "wl", followed in the
// script's arguments by the warm-up in µs).

// warmFile is the strategy file of the warming buckets.
const warmFile = "warmup.lua"

// warmTokenBucket and warmLeakyBucket are the token and leaky buckets with
// a warm-up.
var (
	warmTokenBucket = &algorithm{strategy: TokenBucket, code: "wt", maxRate: MaxRate, bucket: true, warm: true}
	warmLeakyBucket = &algorithm{strategy: LeakyBucket, code: "wl", maxRate: MaxRate, bucket: true, queue: true, warm: true}
)

// Bounds that keep a warming bucket's state (scripts/warmup.lua) exact in
// a Lua double: its stored permits reach 2·WarmUp(µs)·Rate, its debt
// 8·Burst·Period(µs).
const (
	maxWarmUpRate    = 1 << 51 // WarmUp in µs × Rate
	maxWarmUpCapTime = 1 << 49 // Burst × Period in µs
)

// warmAlgorithm returns the warming algorithm of alg for limit l (its
// WarmUp not 0), or an error wrapping ErrInvalidLimit.
func warmAlgorithm(alg *algorithm, l Limit) (*algorithm, error) {
	bad := func(format string, args ...any) (*algorithm, error) {
		return nil, errorf("%v %v: "+format+": %w", append(append([]any{alg.strategy, l}, args...), ErrInvalidLimit)...)
	}
	us := l.WarmUp / time.Microsecond
	burst := l.Burst
	if burst == 0 {
		burst = l.Rate
	}
	switch {
	case alg.strategy != TokenBucket && alg.strategy != LeakyBucket:
		return bad("WarmUp is for token-bucket and leaky-bucket limits only")
	case l.WarmUp < 0:
		return bad("WarmUp must not be negative")
	case l.WarmUp%time.Microsecond != 0:
		return bad("WarmUp must be a whole number of microseconds")
	case l.WarmUp > MaxPeriod:
		return bad("WarmUp must be at most %v", MaxPeriod)
	case alg.strategy == TokenBucket && burst != l.Rate:
		return bad("a warming token bucket never bursts: Burst must be 0")
	case float64(us)*float64(l.Rate) > maxWarmUpRate:
		return bad("WarmUp (in µs) × Rate must be at most 2^51: the stored permits must stay exact")
	case float64(burst)*float64(l.Period/time.Microsecond) > maxWarmUpCapTime:
		return bad("Burst × Period (in µs) must be at most 2^49 with a WarmUp")
	}
	if alg.strategy == TokenBucket {
		return warmTokenBucket, nil
	}
	return warmLeakyBucket, nil
}

// warmScripts holds warmScript's script, made on first use.
var warmScripts struct {
	once   sync.Once
	script *redis.Script
}

// warmScript returns the script that decides rules passed as arguments of
// every strategy, warming buckets too: rules with a warm-up that are not
// written in (WithLimitFunc, WithRulesFunc) run it, so that the other
// strategies' scripts do not carry warmup.lua.
func warmScript() *redis.Script {
	warmScripts.once.Do(func() {
		warmScripts.script = decisionScript(everyFile, "", argumentChecks(everyFile))
	})
	return warmScripts.script
}

// warmCurve is the in-process stand-in's warm-up (fallback.go): Guava's
// SmoothWarmingUp in float64 seconds, at the stand-in's rate (the fleet's
// share of Rate), the same curve as scripts/warmup.lua's.
type warmCurve struct {
	stable    float64   // seconds per permit at the stable rate
	threshold float64   // permits: 0.5·W/stable
	max       float64   // permits: 2·threshold
	stored    float64   // permits stored
	next      time.Time // when the next call is free
}

// newWarmCurve returns a cold curve of every events per second and a
// warm-up of w, at now.
func newWarmCurve(every float64, w time.Duration, now time.Time) *warmCurve {
	c := &warmCurve{stable: 1 / every, next: now}
	c.threshold = 0.5 * w.Seconds() / c.stable
	c.max = c.threshold + 2*w.Seconds()/(c.stable+3*c.stable)
	c.stored = c.max
	return c
}

// sync brings the stored permits to now: one comes back per stable
// interval after the next free time.
func (c *warmCurve) sync(now time.Time) {
	if now.After(c.next) {
		c.stored = math.Min(c.max, c.stored+now.Sub(c.next).Seconds()/c.stable)
		c.next = now
	}
}

// cost is the time that taking n permits costs: stored ones above the
// threshold along the line from stable to 3·stable, the others stable.
func (c *warmCurve) cost(n float64) float64 { return c.costFrom(c.stored, n) }

// costFrom is the cost of taking n permits from stored ones.
func (c *warmCurve) costFrom(stored, n float64) float64 {
	spend := math.Min(n, stored)
	t := (n - spend) * c.stable
	if above := stored - c.threshold; above > 0 {
		take := math.Min(above, spend)
		slope := 2 * c.stable / (c.max - c.threshold)
		t += take * (2*c.stable + (2*above-take)*slope) / 2
		spend -= take
	}
	return t + spend*c.stable
}

// wait returns how long a call must wait at now for the next free time.
func (c *warmCurve) wait(now time.Time) time.Duration {
	c.sync(now)
	return max(c.next.Sub(now), 0)
}

// take takes n permits at now and returns the wait before them (Guava's
// reserve).
func (c *warmCurve) take(n int, now time.Time) time.Duration {
	w := c.wait(now)
	c.next = c.next.Add(seconds(c.cost(float64(n))))
	c.stored = math.Max(c.stored-float64(n), 0)
	return w
}

// giveBack undoes a take of n permits at now, as settle.lua's adjust_warm
// does (a refund): the permits come back, and what they cost at what is
// stored now comes back as time owed until end (the reservation's own
// time: none passed, none that later calls owe), the rest as the permits
// an idle key would have stored meanwhile.
func (c *warmCurve) giveBack(n float64, end, now time.Time) {
	c.sync(now)
	cost := c.costFrom(math.Min(c.stored+n, c.max), n)
	back := min(cost, max(end.Sub(now).Seconds(), 0), c.next.Sub(now).Seconds())
	c.next = c.next.Add(-seconds(back))
	c.stored = math.Min(c.stored+n+(cost-back)/c.stable, c.max)
}

// untilCold is how long, with no more calls, until the curve is cold again.
func (c *warmCurve) untilCold(now time.Time) time.Duration {
	c.sync(now)
	return c.next.Sub(now) + seconds((c.max-c.stored)*c.stable)
}
