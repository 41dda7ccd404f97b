// Worker paces jobs sent to an upstream API with a redlimit leaky bucket:
// 3 worker goroutines share one limit of 5 jobs per second, so the 12 jobs
// go out evenly, one every 200ms, however many workers there are (and
// however many processes run them, since the pace is kept in Redis). It
// runs with nothing installed but Go: it starts an embedded miniredis,
// unless -redis names a real Redis.
//
//	go run ./examples/worker
//	go run ./examples/worker -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

const (
	jobs    = 12
	workers = 3
	key     = "upstream-api" // one key: every worker, in every process, shares the pace
)

func main() {
	addr := flag.String("redis", "", "address of a Redis to use instead of an embedded miniredis")
	flag.Parse()
	log.SetFlags(0)

	if *addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatalf("worker: %v", err)
		}
		defer m.Close()
		*addr = m.Addr()
	}
	rdb := newClient(*addr)
	defer rdb.Close()

	// 5 per second with Burst 1: strict spacing of 200ms, no queue. A worker
	// that comes early is denied and Wait sleeps until the next free slot.
	// (With Burst > 1 a worker would instead get a queued slot and Wait would
	// sleep its Delay, with no extra round trips.)
	limit := redlimit.Limit{Rate: 5, Period: time.Second, Burst: 1}
	lim, err := redlimit.NewLeakyBucket(rdb, limit, redlimit.WithPrefix("worker"))
	if err != nil {
		log.Fatalf("worker: %v", err)
	}
	defer lim.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lim.Reset(ctx, key); err != nil { // start from a fresh key on a real Redis
		log.Fatalf("worker: %v", err)
	}

	fmt.Printf("%d jobs, %d workers, limit %v on key %q:\n\n", jobs, workers, limit, key)
	runJobs(ctx, lim, limit)
}

// newClient returns a client of the Redis at addr, with short timeouts and
// no retries.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		MaxRetries:            -1, // a retried script could count an event twice
		ContextTimeoutEnabled: true,
	})
}

// runJobs has the workers send the jobs, each once lim lets it, and prints
// when each went out.
func runJobs(ctx context.Context, lim *redlimit.RateLimiter, limit redlimit.Limit) {
	queue := make(chan int, jobs)
	for j := 1; j <= jobs; j++ {
		queue <- j
	}
	close(queue)

	var (
		mu         sync.Mutex
		start      = time.Now()
		last       time.Duration
		minGap     = time.Hour
		maxGap     time.Duration
		wg         sync.WaitGroup
		done, seen int
	)
	for w := 1; w <= workers; w++ {
		wg.Go(func() {
			// Workers take jobs in order, but whichever waiter Redis admits
			// first sends its job: the numbers may come out of order.
			for job := range queue {
				if err := lim.Wait(ctx, key); err != nil {
					log.Fatalf("worker %d: job %d: %v", w, job, err)
				}
				// A real worker would call the upstream API here.
				mu.Lock()
				at := time.Since(start)
				gap := at - last
				if seen > 0 {
					minGap, maxGap = min(minGap, gap), max(maxGap, gap)
				}
				last, seen, done = at, seen+1, done+1
				fmt.Printf("job %2d  worker %d  at %7v  (+%v)\n", job, w,
					at.Round(time.Millisecond), gap.Round(time.Millisecond))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("\n%d jobs in %v; gaps between jobs %v to %v (limit interval %v)\n",
		done, last.Round(time.Millisecond), minGap.Round(time.Millisecond),
		maxGap.Round(time.Millisecond), limit.Period/time.Duration(limit.Rate))
}
