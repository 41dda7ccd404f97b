package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// Two regions share one limit of 10 an hour: what one admits, the other
// counts within an exchange interval.
func ExampleWithRegions() {
	eu, us := miniredis.NewMiniRedis(), miniredis.NewMiniRedis() // embedded Redis; one per region in production
	_ = eu.Start()
	_ = us.Start()
	defer eu.Close()
	defer us.Close()
	euRDB := redis.NewClient(&redis.Options{Addr: eu.Addr()})
	usRDB := redis.NewClient(&redis.Options{Addr: us.Addr()})
	defer euRDB.Close()
	defer usRDB.Close()

	limit := redlimit.PerHour(10)
	inEU, err := redlimit.NewFixedWindow(euRDB, limit, redlimit.WithRegions(redlimit.Regions{
		Name: "eu", Peers: map[string]redis.UniversalClient{"us": usRDB}, Sync: 20 * time.Millisecond,
	}))
	if err != nil {
		panic(err)
	}
	defer inEU.Close()
	inUS, err := redlimit.NewFixedWindow(usRDB, limit, redlimit.WithRegions(redlimit.Regions{
		Name: "us", Peers: map[string]redis.UniversalClient{"eu": euRDB}, Sync: 20 * time.Millisecond,
	}))
	if err != nil {
		panic(err)
	}
	defer inUS.Close()

	ctx := context.Background()
	res, _ := inEU.AllowN(ctx, "customer:42", 4)
	fmt.Println("eu allowed:", res.Allowed, "remaining:", res.Remaining)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if res, _ = inUS.AllowN(ctx, "customer:42", 0); res.Remaining < 10 {
			break
		}
	}
	fmt.Println("us remaining:", res.Remaining)
	// Output:
	// eu allowed: true remaining: 6
	// us remaining: 6
}
