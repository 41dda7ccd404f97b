package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

var checkCmd = &command{
	name:  "check",
	args:  "[flags]",
	short: "tell whether a Redis may evict limiter keys",
	long: `
Check reads maxmemory and maxmemory-policy (CONFIG GET) on the Redis
server at -redis, or on every master and replica of the cluster that -redis
belongs to with -cluster (a replica evicts once promoted), as
redlimit.CheckRedis does, and prints one line per server
that may evict limiter keys: one with maxmemory above 0 and a policy other
than noeviction. An evicted key comes back with a full allowance, so such a
server admits more than the limits once it is full.

The exit status is 0 when no server may evict (maxmemory 0, or
noeviction), 1 when one may, or when a server cannot be reached. A server
that refuses CONFIG GET (managed services rename or deny it) is skipped:
"ok" then means that no server that answered may evict.`,
	setup: setupCheck,
}

func setupCheck(fs *flag.FlagSet) runFunc {
	var addr string
	var cluster bool
	fs.StringVar(&addr, "redis", "", "`address` of the Redis server, host:port (required)")
	fs.BoolVar(&cluster, "cluster", false, "-redis is a node of a Redis Cluster: check every master and replica")
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		switch {
		case addr == "":
			return usagef("check", "-redis is required")
		case len(args) > 0:
			return usagef("check", "unexpected argument %q", args[0])
		}
		var rdb redis.UniversalClient
		if cluster {
			rdb = redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:        []string{addr},
				DialTimeout:  dialTimeout(time.Second),
				ReadTimeout:  time.Second,
				WriteTimeout: time.Second,
				MaxRetries:   -1,
			})
		} else {
			c := newClient(addr, 2, time.Second)
			if err := ping(ctx, c); err != nil {
				c.Close()
				return err
			}
			rdb = c
		}
		defer rdb.Close()
		return check(ctx, rdb, addr, stdout)
	}
}

// check prints CheckRedis's verdict on rdb: "ok" or one line per server
// that may evict, and returns an error when one may or the check failed.
func check(ctx context.Context, rdb redis.UniversalClient, addr string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := redlimit.CheckRedis(ctx, rdb)
	if err == nil {
		fmt.Fprintf(w, "ok: no server at %s may evict limiter keys (maxmemory 0 or maxmemory-policy noeviction; a server that refuses CONFIG GET is not read)\n", addr)
		return nil
	}
	if !errors.Is(err, redlimit.ErrEvictionPolicy) {
		return err
	}
	// Each line is one server's error; a line that ends with the sentinel's
	// text (without its "redlimit: ", as the library writes it when it
	// wraps it) is a server that may evict.
	evicting := 0
	policyText := ": " + strings.TrimPrefix(redlimit.ErrEvictionPolicy.Error(), "redlimit: ")
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if strings.HasSuffix(line, policyText) {
			evicting++
			fmt.Fprintf(w, "evicts: %s\n", strings.TrimSuffix(strings.ReplaceAll(line, "redlimit: ", ""), policyText))
			continue
		}
		fmt.Fprintf(w, "error: %s\n", strings.ReplaceAll(line, "redlimit: ", ""))
	}
	return fmt.Errorf("%d server(s) at %s may evict limiter keys, which then come back with a full allowance", evicting, addr)
}
