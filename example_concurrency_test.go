package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// At most 2 exports per tenant run at once, across every instance. A lease
// that is neither released nor extended within 30 seconds expires, so a
// crashed worker's slot comes back.
func ExampleNewConcurrency() {
	m, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // a fixed clock, for this example's output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	exports, err := redlimit.NewConcurrency(rdb, 2, 30*time.Second)
	if err != nil {
		panic(err)
	}
	defer exports.Close()
	ctx := context.Background()

	var leases []*redlimit.Lease
	for range 3 {
		lease, res, err := exports.TryAcquire(ctx, "tenant:7")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
		if lease != nil {
			leases = append(leases, lease)
		}
	}

	// Long work renews its lease before the 30 seconds are up.
	if err := leases[0].Extend(ctx); err != nil {
		panic(err)
	}
	// Done: give the slot back. Acquire waits for a free slot.
	if err := leases[1].Release(ctx); err != nil {
		panic(err)
	}
	lease, err := exports.Acquire(ctx, "tenant:7")
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired after a release")
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=30s
	// acquired after a release
}
