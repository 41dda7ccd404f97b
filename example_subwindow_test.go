package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// A sub-window counter of 4 a minute over 4 sub-windows of 15 s: never
// more than 4 in any minute, and an event leaves the count with its whole
// sub-window.
func ExampleNewSubWindowCounter() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewSubWindowCounter(rdb, redlimit.Limit{Rate: 4, Period: time.Minute, SubWindows: 4})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()

	for _, at := range []time.Duration{0, 0, 20 * time.Second, 20 * time.Second, 30 * time.Second, 75 * time.Second} {
		m.SetTime(start.Add(at))
		res, err := lim.Allow(ctx, "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("at %v: allowed=%v remaining=%d retry-after=%v\n", at, res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// at 0s: allowed=true remaining=3 retry-after=0s
	// at 0s: allowed=true remaining=2 retry-after=0s
	// at 20s: allowed=true remaining=1 retry-after=0s
	// at 20s: allowed=true remaining=0 retry-after=0s
	// at 30s: allowed=false remaining=0 retry-after=45s
	// at 1m15s: allowed=true remaining=1 retry-after=0s
}

// A hook that logs the fallback's switches: switch on Transition.Kind,
// since an eviction notice has Down false too.
func ExampleWithOnTransition() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()

	kinds := make(chan redlimit.TransitionKind, 4)
	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10),
		redlimit.WithPingInterval(10*time.Millisecond),
		redlimit.WithOnTransition(func(t redlimit.Transition) {
			switch t.Kind {
			case redlimit.TransitionDown, redlimit.TransitionBack:
				kinds <- t.Kind // a real hook would log t.String()
			case redlimit.TransitionEvicted:
				// a notice: the server evicted keys (WithEvictionCheck)
			}
		}))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()

	m.Close() // Redis goes away
	res, err := lim.Allow(ctx, "user:42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%v, degraded=%v\n", <-kinds, res.Degraded)
	if err := m.Restart(); err != nil { // and comes back
		panic(err)
	}
	fmt.Println(<-kinds)
	// Output:
	// down, degraded=true
	// back
}
