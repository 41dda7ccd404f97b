package redlimit_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// A service checks its Redis at start-up. miniredis has no CONFIG
// command, so the check skips it, as it skips a managed service that
// renames or denies CONFIG: nil then means that no server that answered
// may evict limiter keys. On a real Redis with maxmemory set and an
// evicting policy, the error names the server and its policy.
func ExampleCheckRedis() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	err := redlimit.CheckRedis(context.Background(), rdb)
	switch {
	case errors.Is(err, redlimit.ErrEvictionPolicy):
		fmt.Println("refusing to start:", err)
	case err != nil:
		fmt.Println("cannot check Redis:", err)
	default:
		fmt.Println("no server that answered may evict limiter keys")
	}
	// Output: no server that answered may evict limiter keys
}
