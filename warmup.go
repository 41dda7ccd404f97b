package redlimit

import (
	"math"
	"strconv"
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

// singleWarmSource returns the script specialised for the single warming
// bucket r (see singleSource): its numbers as Lua constants, the products
// warmup.lua's check_wt computes on every call (the threshold W·Rate, W the
// warm-up in µs, and the others) and what a call of 1 on a cold bucket
// writes (coldWrite) computed here, then single_args.lua and
// single_warmup.lua. W is read from the rule's code, as the general script
// reads it; "" if it is not there. A warming bucket takes no share (its
// capacity is time): the script of every share is the same, with a
// capacity of 0 that it does not read, so that bakeShares makes it once.
func singleWarmSource(r *rule, share int64) string {
	code, _ := r.args[0].(string)
	if len(code) < 3 {
		return ""
	}
	w, err := strconv.ParseInt(code[2:], 10, 64)
	if err != nil {
		return ""
	}
	rate, period, burst := r.args[1].(int64), r.args[2].(int64), r.args[3].(int64)
	tx := w * rate
	num := func(v int64) string { return strconv.FormatInt(v, 10) }
	cold := "false"
	if x, f, life, ok := coldWrite(tx, 2*period, 2*rate); ok {
		cold = "'" + num(x) + ":" + num(f) + ":%d:" + num(rate) + "', '" + num(max((life+999)/1000, 1)) + "', " + num(life)
	}
	return "-- The rule, written in by redlimit (see singleWarmSource in warmup.go).\n" +
		"local rate, period, burst, leaky = " + num(rate) + ", " + num(period) + ", " + num(burst) + ", " +
		strconv.FormatBool(r.alg.strategy == LeakyBucket) + "\n" +
		"local tx, mx, p2, r2, cap2 = " + num(tx) + ", " + num(2*tx) + ", " + num(2*period) + ", " + num(2*rate) + ", " +
		num(2*burst*period) + "\n" +
		"local mpat, wfmt, zfmt = '^(%d+):(%d+):(%d+):" + num(rate) + "$', '%d:%d:%d:" + num(rate) + "', '0:%d:%d:" + num(rate) + "'\n" +
		"local cfmt, cpx, clife = " + cold + "\n" +
		mustRead("single_args.lua") + sharedLine(min(share, 0)) + mustRead("single_warmup.lua")
}

// coldWrite returns what a call of 1 on a cold warming bucket (threshold
// tx, p2 and r2 twice its period and rate) writes, as warmup.lua's
// check_wt computes it: X and F stored, and the key's life in µs; ok false
// where they are not integers below 2^53 (the script then computes them
// on every call). The cost of the permit is computed with the script's
// double operations, in its order (warm_cost): the same roundings.
func coldWrite(tx, p2, r2 int64) (x, f, life int64, ok bool) {
	const exact = 1 << 53
	mx := 2 * tx
	if tx < 1 || 2*mx > exact || mx+p2 >= exact {
		return 0, 0, 0, false
	}
	lo := max(mx-min(p2, mx), tx)
	a := mx - lo
	prod := float64(a) * float64(mx+lo-tx) // (assigned: rounded as Lua rounds it)
	v := prod / float64(tx)
	neg := -v
	sum := float64(p2-a) + v
	cost := sum + (neg - math.Floor(neg)) // cost - a + v + (-v) % 1
	if cost != math.Trunc(cost) || cost < 0 || cost >= exact {
		return 0, 0, 0, false
	}
	f = int64(cost)
	x = max(mx-p2, 0)
	if f+mx >= exact {
		return 0, 0, 0, false
	}
	return x, f, (f + mx - x + r2 - 1) / r2, true
}
