// Quickstart shows each of redlimit's five strategies deciding the same
// burst of requests. It runs with nothing installed but Go: it starts an
// embedded miniredis, unless -redis names a real Redis.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

func main() {
	addr := flag.String("redis", "", "address of a Redis to use instead of an embedded miniredis")
	flag.Parse()
	log.SetFlags(0)

	if *addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatalf("quickstart: %v", err)
		}
		defer m.Close()
		*addr = m.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  *addr,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		MaxRetries:            -1, // a retried script could count an event twice
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()

	// 5 per second; the buckets hold 3. A burst of 8 requests arrives at once.
	limit := redlimit.Limit{Rate: 5, Period: time.Second, Burst: 3}
	ctx := context.Background()
	fmt.Printf("limit %v, a burst of 8 requests for key \"user:42\":\n\n", limit)
	for _, s := range redlimit.Strategies() {
		lim, err := redlimit.New(rdb, s, limit, redlimit.WithPrefix("quickstart"))
		if err != nil {
			log.Fatalf("quickstart: %v", err)
		}
		if err := lim.Reset(ctx, "user:42"); err != nil { // start from a fresh key on a real Redis
			log.Fatalf("quickstart: %v", err)
		}
		var line []string
		for range 8 {
			res, err := lim.Allow(ctx, "user:42")
			if err != nil {
				log.Fatalf("quickstart: %v", err)
			}
			switch {
			case res.Allowed && res.Delay > 0:
				line = append(line, "wait "+res.Delay.Round(time.Millisecond).String())
			case res.Allowed:
				line = append(line, "ok")
			default:
				line = append(line, "no ("+res.RetryAfter.Round(time.Millisecond).String()+")")
			}
		}
		fmt.Printf("%-18s %s\n", s, strings.Join(line, ", "))
		lim.(io.Closer).Close() // every limiter of this package has Close
	}
	fmt.Println("\nok: allowed; wait d: allowed after a delay (leaky bucket); no (d): denied, retry after d")
}
