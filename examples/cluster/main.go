// Cluster runs a redlimit token bucket on a Redis Cluster, through a
// go-redis ClusterClient set up with the options redlimit recommends, and
// prints for each key the Redis key its state lives in, that key's hash
// slot, the node that serves it and the decisions.
//
// Every Redis key redlimit writes for a key (its state, and its penalty
// block with WithBlock) has the key as hash tag, "redlimit:{<key>}:..."
// (a key longer than 256 bytes as its SHA-256), so each decision is one
// script on one slot, on one node.
//
// Run it against a real cluster by giving some of its nodes as seeds, or
// without -addrs:
//
//	go run ./examples/cluster -addrs 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
//	go run ./examples/cluster
//
// (A local test cluster: redis-server's utils/create-cluster script, or
// `redis-cli --cluster create` over 3 or more nodes with cluster-enabled
// yes.) Without -addrs it needs nothing installed: it points the same
// ClusterClient at an embedded miniredis, which answers CLUSTER SLOTS as a
// single node that owns every slot. Its CLUSTER KEYSLOT is a stub, so the
// slots it prints are not real ones; a real cluster is needed for those.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

func main() {
	addrs := flag.String("addrs", "", "comma-separated seed addresses of a Redis Cluster (host:port,...); empty starts an embedded miniredis")
	flag.Parse()
	log.SetFlags(0)

	seeds := strings.Split(*addrs, ",")
	embedded := *addrs == ""
	if embedded {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatalf("cluster: %v", err)
		}
		defer m.Close()
		seeds = []string{m.Addr()}
	}
	rdb := newClusterClient(seeds)
	defer rdb.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		return shard.Ping(ctx).Err()
	}); err != nil {
		log.Fatalf("cluster: %v", err)
	}
	if embedded {
		fmt.Println("no -addrs: using a ClusterClient on an embedded miniredis, a single node that owns all 16384")
		fmt.Println("slots and answers CLUSTER KEYSLOT with 163 for every key; a real cluster is needed for real slots.")
		fmt.Println()
	}

	limit := redlimit.PerSecond(3)
	lim, err := redlimit.NewTokenBucket(rdb, limit)
	if err != nil {
		log.Fatalf("cluster: %v", err)
	}
	defer lim.Close()

	fmt.Printf("token bucket %v, 4 requests per key:\n\n", limit)
	fmt.Printf("%-16s %-36s %5s  %-15s  %s\n", "key", "redis key", "slot", "node", "results")
	for _, key := range []string{"user:1", "user:2", "user:3", "ip:203.0.113.7"} {
		if err := lim.Reset(ctx, key); err != nil { // start from a fresh key on a real cluster
			log.Fatalf("cluster: %v", err)
		}
		printKey(ctx, rdb, lim, limit, key)
	}
}

// newClusterClient returns a client of the Redis Cluster at seeds, with
// the options for a limiter: short timeouts, no retries, and a quick
// reload of the cluster's layout.
func newClusterClient(seeds []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: seeds,
		// Fail fast: a decision that cannot be made in about 100ms is better
		// made by the fallback (see redlimit.FallbackPolicy).
		DialTimeout:  100 * time.Millisecond,
		ReadTimeout:  100 * time.Millisecond,
		WriteTimeout: 100 * time.Millisecond,
		PoolTimeout:  100 * time.Millisecond,
		// A retried script could count an event twice. (MOVED and ASK
		// redirects are still followed.)
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		// Notice failovers and resharding within a second, not the default
		// minute. (During an outage redlimit also asks for a reload.)
		ClusterStateReloadInterval: time.Second,
	})
}

// printKey prints the Redis key of key's state, its slot and the node that
// serves it, and the answers to 4 calls.
func printKey(ctx context.Context, rdb *redis.ClusterClient, lim *redlimit.RateLimiter, limit redlimit.Limit, key string) {
	// The state key of a TokenBucket with the default prefix: for keys
	// without '%', '{' or '}' (which redlimit would percent-encode).
	redisKey := fmt.Sprintf("redlimit:{%s}:tb%d", key, limit.Period.Microseconds())
	slot, err := rdb.ClusterKeySlot(ctx, redisKey).Result()
	if err != nil {
		log.Fatalf("cluster: %v", err)
	}
	node, err := rdb.MasterForKey(ctx, redisKey)
	if err != nil {
		log.Fatalf("cluster: %v", err)
	}
	var results []string
	for range 4 {
		res, err := lim.Allow(ctx, key)
		if err != nil {
			log.Fatalf("cluster: %v", err)
		}
		switch {
		case res.Degraded:
			results = append(results, "degraded")
		case res.Allowed:
			results = append(results, "ok")
		default:
			results = append(results, "no ("+res.RetryAfter.Round(time.Millisecond).String()+")")
		}
	}
	fmt.Printf("%-16s %-36s %5d  %-15s  %s\n", key, redisKey, slot, node.Options().Addr, strings.Join(results, ", "))
}
