package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// A token bucket of 10 per second with room for a burst of 3.
func ExampleNewTokenBucket() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 3})
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	for range 4 {
		res, err := lim.Allow(context.Background(), "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=100ms
}

// A leaky bucket smooths a burst into a steady flow: each admitted event
// is told how long to wait.
func ExampleNewLeakyBucket() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, _ := redlimit.NewLeakyBucket(rdb, redlimit.Limit{Rate: 5, Period: time.Second, Burst: 3})
	defer lim.Close()
	for range 4 {
		res, _ := lim.Allow(context.Background(), "jobs")
		fmt.Printf("allowed=%v delay=%v\n", res.Allowed, res.Delay)
	}
	// Output:
	// allowed=true delay=0s
	// allowed=true delay=200ms
	// allowed=true delay=400ms
	// allowed=false delay=0s
}

// New picks the strategy at run time, for example from configuration.
func ExampleNew() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	s, err := redlimit.ParseStrategy("sliding-log")
	if err != nil {
		panic(err)
	}
	lim, err := redlimit.New(rdb, s, redlimit.PerMinute(2))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		res, _ := lim.Allow(ctx, "10.0.0.1")
		fmt.Println(s, res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// sliding-log true 1 0s
	// sliding-log true 0 0s
	// sliding-log false 0 1m0s
}

// Shadow mode evaluates a new limit without enforcing it.
func ExampleWithShadow() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, _ := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(1), redlimit.WithShadow(),
		redlimit.WithObserver(func(d redlimit.Decision) {
			if d.Shadowed {
				fmt.Printf("would deny %s (by %s)\n", d.Key, d.DeniedBy)
			}
		}))
	defer lim.Close()
	for range 2 {
		res, _ := lim.Allow(context.Background(), "tenant-7")
		fmt.Println("allowed:", res.Allowed)
	}
	// Output:
	// allowed: true
	// would deny tenant-7 (by limit)
	// allowed: true
}

// A policy that Redis decides with a Redis Function where it has them
// (Redis 7.0 and later, Valkey): the library is loaded by the first call.
// miniredis, used here, has none, so the limiter runs its script, with the
// same decisions.
func ExampleWithRedisFunctions() {
	m, _ := miniredis.Run()
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 2}},
		{Name: "hourly", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
	}, redlimit.WithRedisFunctions())
	if err != nil {
		panic(err)
	}
	defer p.Close()

	for range 3 {
		res, err := p.Allow(context.Background(), "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d rule=%s\n", res.Allowed, res.Remaining, res.Rule)
	}
	// Output:
	// allowed=true remaining=1 rule=burst
	// allowed=true remaining=0 rule=burst
	// allowed=false remaining=0 rule=burst
}
