// Command scaling measures how redlimit's decisions per second grow with the
// number of Redis Cluster masters: the same load generator runs, in
// interleaved rounds, against a cluster of 1 master and a cluster of 3
// masters (real redis-server processes on free loopback ports, started and
// stopped here), and the median ratio is printed.
//
//	go run ./cmd/scaling [-rounds 5] [-duration 2s] [-conc 64] [-keys 10000]
//
// On a machine with few cores the client and every redis-server share them,
// so the ratio shows the cores, not Redis Cluster; see BENCHMARKS.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 2*time.Second, "length of one run")
	conc := flag.Int("conc", 64, "goroutines deciding")
	numKeys := flag.Int("keys", 10000, "distinct limited keys")
	flag.Parse()
	log.SetFlags(0)

	one, err := redistest.StartCluster(1, 0)
	if err != nil {
		log.Fatalf("scaling: %v", err)
	}
	defer one.Close()
	three, err := redistest.StartCluster(3, 0)
	if err != nil {
		log.Fatalf("scaling: %v", err)
	}
	defer three.Close()

	keys := make([]string, *numKeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	var r1, r3 []float64
	for r := range *rounds {
		a, err := run(one, keys, *conc, *duration)
		if err != nil {
			log.Fatalf("scaling: 1 master: %v", err)
		}
		b, err := run(three, keys, *conc, *duration)
		if err != nil {
			log.Fatalf("scaling: 3 masters: %v", err)
		}
		r1, r3 = append(r1, a), append(r3, b)
		fmt.Printf("round %d: 1 master %.0f/s, 3 masters %.0f/s, ratio %.2f\n", r+1, a, b, b/a)
	}
	m1, m3 := median(r1), median(r3)
	fmt.Printf("\ntoken bucket, %d goroutines, %d keys, %v runs, GOMAXPROCS %d, %d rounds (median):\n",
		*conc, *numKeys, *duration, runtime.GOMAXPROCS(0), *rounds)
	fmt.Printf("| masters | decisions/s |\n|---:|---:|\n| 1 | %.0f |\n| 3 | %.0f |\n\n3 masters / 1 master: %.2f\n", m1, m3, m3/m1)
}

// run decides for d from conc goroutines through a cluster client of c and
// returns decisions per second.
func run(c *redistest.Cluster, keys []string, conc int, d time.Duration) (float64, error) {
	rdb := redis.NewClusterClient(redistest.TunedClusterOptions(c.Addrs()))
	defer rdb.Close()
	lim, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 1_000_000_000, Period: 10_000 * time.Second},
		redlimit.WithFallback(redlimit.FallbackError))
	if err != nil {
		return 0, err
	}
	defer func() { _ = lim.Close() }() // no prefetch, no reservation: nothing to report
	ctx := context.Background()
	for _, k := range keys[:min(len(keys), 100)] { // connect to every node, load the script
		if _, err := lim.Allow(ctx, k); err != nil {
			return 0, err
		}
	}
	var ops atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for g := range conc {
		wg.Go(func() {
			for i := g; time.Since(start) < d; i += conc {
				if _, err := lim.Allow(ctx, keys[i%len(keys)]); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return 0, err
	}
	return float64(ops.Load()) / time.Since(start).Seconds(), nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
