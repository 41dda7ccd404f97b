package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// 2 calls per calendar day in Tokyo: the count resets at midnight there
// (15:00 UTC), not at midnight UTC.
func ExampleDaily() {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		panic(err)
	}
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	now := time.Date(2030, 1, 1, 14, 59, 59, 0, time.UTC) // 23:59:59 in Tokyo
	m.SetTime(now)                                        // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	daily := redlimit.Daily(2, tokyo)
	lim, err := redlimit.NewFixedWindow(rdb, daily)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()

	start, end, _ := daily.Window(now)
	fmt.Println(daily, "window", start, "to", end)
	for range 3 {
		res, err := lim.Allow(ctx, "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
	}
	m.SetTime(now.Add(time.Second)) // midnight in Tokyo: a new day
	res, err := lim.Allow(ctx, "user:42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("next day: allowed=%v remaining=%d\n", res.Allowed, res.Remaining)
	// Output:
	// 2/day Asia/Tokyo window 2030-01-01 00:00:00 +0900 JST to 2030-01-02 00:00:00 +0900 JST
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=1s
	// next day: allowed=true remaining=1
}

// A monthly quota from the customer's billing day, the 31st: a month
// with fewer days starts on its last day.
func ExampleLimit_Window() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	monthly := redlimit.Monthly(10_000, ny, 31)
	for _, t := range []time.Time{
		time.Date(2030, 2, 10, 12, 0, 0, 0, time.UTC),
		time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC),
		time.Date(2030, 4, 30, 12, 0, 0, 0, time.UTC),
	} {
		start, end, _ := monthly.Window(t)
		fmt.Println(start.Format(time.DateTime+" MST"), "to", end.Format(time.DateTime+" MST"))
	}
	_, _, ok := redlimit.PerHour(100).Window(time.Now())
	fmt.Println("PerHour is a calendar limit:", ok)
	// Output:
	// 2030-01-31 00:00:00 EST to 2030-02-28 00:00:00 EST
	// 2030-02-28 00:00:00 EST to 2030-03-31 00:00:00 EDT
	// 2030-04-30 00:00:00 EDT to 2030-05-31 00:00:00 EDT
	// PerHour is a calendar limit: false
}
