package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// 10 calls per second after a warm-up of 2 seconds: a cold key starts at
// a third of the rate, and each call's wait for the next grows shorter
// until it reaches the stable 100ms.
func ExampleLimit_warmUp() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(now) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, WarmUp: 2 * time.Second})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()

	for i := range 12 {
		res, err := lim.Allow(ctx, "cache-fill")
		if err != nil {
			panic(err)
		}
		next, err := lim.Allow(ctx, "cache-fill") // denied: it says when the next call is free
		if err != nil {
			panic(err)
		}
		fmt.Printf("call %2d: allowed=%v, the next is free in %v\n", i+1, res.Allowed, next.RetryAfter)
		now = now.Add(next.RetryAfter)
		m.SetTime(now)
	}
	// Output:
	// call  1: allowed=true, the next is free in 290ms
	// call  2: allowed=true, the next is free in 270ms
	// call  3: allowed=true, the next is free in 250ms
	// call  4: allowed=true, the next is free in 230ms
	// call  5: allowed=true, the next is free in 210ms
	// call  6: allowed=true, the next is free in 190ms
	// call  7: allowed=true, the next is free in 170ms
	// call  8: allowed=true, the next is free in 150ms
	// call  9: allowed=true, the next is free in 130ms
	// call 10: allowed=true, the next is free in 110ms
	// call 11: allowed=true, the next is free in 100ms
	// call 12: allowed=true, the next is free in 100ms
}
