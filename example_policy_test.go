package redlimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// 3 at once, refilled at 1 per second, AND 4 per minute: every call is
// decided by both rules at once, and the result names the rule that
// decided.
func ExampleNewPolicy() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 1, Period: time.Second, Burst: 3}},
		{Name: "minute", Strategy: redlimit.FixedWindow, Limit: redlimit.PerMinute(4)},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()

	for i, at := range []time.Duration{0, 0, 0, 0, 2 * time.Second, 3 * time.Second} {
		m.SetTime(start.Add(at))
		res, err := p.Allow(ctx, "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("call %d at %v: allowed=%v rule=%s remaining=%d retry-after=%v\n",
			i+1, at, res.Allowed, res.Rule, res.Remaining, res.RetryAfter)
	}
	// Output:
	// call 1 at 0s: allowed=true rule=burst remaining=2 retry-after=0s
	// call 2 at 0s: allowed=true rule=burst remaining=1 retry-after=0s
	// call 3 at 0s: allowed=true rule=burst remaining=0 retry-after=0s
	// call 4 at 0s: allowed=false rule=burst remaining=0 retry-after=1s
	// call 5 at 2s: allowed=true rule=minute remaining=0 retry-after=0s
	// call 6 at 3s: allowed=false rule=minute remaining=0 retry-after=57s
}

// Each key gets the limit of its plan; a zero Limit means the limiter's
// own. The limit travels with the call: no extra round trip.
func ExampleWithLimitFunc() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	plan := func(_ context.Context, key string) (redlimit.Limit, error) {
		if strings.HasPrefix(key, "pro:") {
			return redlimit.PerMinute(5), nil
		}
		return redlimit.Limit{}, nil // the limiter's own: 2 per minute
	}
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(2), redlimit.WithLimitFunc(plan))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()

	for _, key := range []string{"free:ann", "pro:bea"} {
		admitted := 0
		for range 8 {
			res, err := lim.Allow(ctx, key)
			if err != nil {
				panic(err)
			}
			if res.Allowed {
				admitted++
			}
		}
		fmt.Printf("%s: %d of 8 allowed\n", key, admitted)
	}
	// Output:
	// free:ann: 2 of 8 allowed
	// pro:bea: 5 of 8 allowed
}

// Plans for a Policy: each key gets its plan's rules, nil means the
// policy's own.
func ExampleWithRulesFunc() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	free := []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(2)},
		{Name: "hour", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(20)},
	}
	paid := []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
		{Name: "hour", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(1000)},
	}
	p, err := redlimit.NewPolicy(rdb, free, redlimit.WithRulesFunc(func(_ context.Context, key string) ([]redlimit.Rule, error) {
		if strings.HasPrefix(key, "paid:") {
			return paid, nil
		}
		return nil, nil
	}))
	if err != nil {
		panic(err)
	}
	defer p.Close()

	for _, key := range []string{"free:ann", "paid:bea"} {
		for range 3 {
			res, err := p.Allow(context.Background(), key)
			if err != nil {
				panic(err)
			}
			fmt.Printf("%s: allowed=%v rule=%s limit=%v remaining=%d\n", key, res.Allowed, res.Rule, res.Limit, res.Remaining)
		}
	}
	// Output:
	// free:ann: allowed=true rule=second limit=2/1s remaining=1
	// free:ann: allowed=true rule=second limit=2/1s remaining=0
	// free:ann: allowed=false rule=second limit=2/1s remaining=0
	// paid:bea: allowed=true rule=second limit=10/1s remaining=9
	// paid:bea: allowed=true rule=second limit=10/1s remaining=8
	// paid:bea: allowed=true rule=second limit=10/1s remaining=7
}

// Reserve what a call may use at most, then settle with what it used:
// the difference comes back. A reservation settles once.
func ExampleRateLimiter_Reserve() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	tokens, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10_000))
	if err != nil {
		panic(err)
	}
	defer tokens.Close()
	ctx := context.Background()

	rv, err := tokens.Reserve(ctx, "api-key:7", 4000) // a request's max_tokens
	if err != nil {
		panic(err)
	}
	if !rv.Result().Allowed {
		fmt.Println("denied, retry after", rv.Result().RetryAfter)
		return
	}
	fmt.Println("reserved, remaining:", rv.Result().Remaining)

	used := 1500 // what the work really used
	res, err := rv.Settle(ctx, used)
	if err != nil {
		panic(err)
	}
	fmt.Println("settled, remaining:", res.Remaining)

	_, err = rv.Settle(ctx, used) // a retry changes nothing
	fmt.Println("again:", errors.Is(err, redlimit.ErrSettled))
	// Output:
	// reserved, remaining: 6000
	// settled, remaining: 8500
	// again: true
}

// With WithClientClock the limiter sends the time to its scripts, for
// servers that refuse TIME inside one. It reads the server's TIME to learn
// its offset from this process's clock, so it decides on the server's time
// as a limiter on the server's clock does: here the two share a key's
// window, with the server's clock years away from this process's.
func ExampleWithClientClock() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	client, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(2), redlimit.WithClientClock())
	if err != nil {
		panic(err)
	}
	defer client.Close()
	server, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(2)) // TIME in the script
	if err != nil {
		panic(err)
	}
	defer server.Close()

	ctx := context.Background()
	for _, lim := range []*redlimit.RateLimiter{client, client, server} {
		res, err := lim.Allow(ctx, "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Println("allowed:", res.Allowed)
	}
	// Output:
	// allowed: true
	// allowed: true
	// allowed: false
}

// A Policy's result names the deciding rule, and RuleResetAfter is that
// rule's own reset, where ResetAfter is the longest of all rules: a
// per-second rule that denies beside an hourly one is full again in a
// second (httplimit's RateLimit field says t=1).
func ExampleResult_ruleResetAfter() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "rps", Strategy: redlimit.FixedWindow, Limit: redlimit.PerSecond(2)},
		{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(100)},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	for range 3 {
		res, err := p.Allow(context.Background(), "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v rule=%s reset-after=%v rule-reset-after=%v\n", res.Allowed, res.Rule, res.ResetAfter, res.RuleResetAfter)
	}
	// Output:
	// allowed=true rule=rps reset-after=1h0m0s rule-reset-after=1s
	// allowed=true rule=rps reset-after=1h0m0s rule-reset-after=1s
	// allowed=false rule=rps reset-after=1h0m0s rule-reset-after=1s
}
