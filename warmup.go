package redlimit

import (
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
