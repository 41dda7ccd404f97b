package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// 10 calls a minute, of which Sheddable calls may use 5 and Normal calls
// 8: the last 2 stay for Critical calls, such as logins.
func ExampleWithPriorityShares() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10), redlimit.WithPriorityShares(0.5, 0.8))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background() // a call with no priority is Normal

	res, err := lim.AllowN(ctx, "tenant:7", 8)
	if err != nil {
		panic(err)
	}
	fmt.Printf("normal x8: allowed=%v remaining=%d\n", res.Allowed, res.Remaining)
	for _, p := range []redlimit.Priority{redlimit.Sheddable, redlimit.Normal, redlimit.Critical} {
		res, err := lim.Allow(redlimit.ContextWithPriority(ctx, p), "tenant:7")
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: allowed=%v by-priority=%v remaining=%d\n", p, res.Allowed, res.ByPriority, res.Remaining)
	}
	// Output:
	// normal x8: allowed=true remaining=0
	// sheddable: allowed=false by-priority=true remaining=0
	// normal: allowed=false by-priority=true remaining=0
	// critical: allowed=true by-priority=false remaining=1
}
