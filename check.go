package redlimit

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/evictwatch"
)

// CheckRedis reads maxmemory and maxmemory-policy (CONFIG GET) on every
// master behind rdb (each master of a *redis.ClusterClient, each live
// shard of a *redis.Ring, the server of a *redis.Client or a failover
// client) and on each replica of a cluster, and returns an error wrapping
// [ErrEvictionPolicy], naming the server and its policy, for each one that
// may evict limiter keys: one with maxmemory above 0 and a policy other
// than noeviction. maxmemory 0 means no limit on a 64-bit server, which is
// safe. A replica does not evict while it is one (it takes its master's
// deletions), but it evicts by its own policy once promoted; the replicas
// of a *redis.Client's or a failover client's server are not known to the
// client: check each with a client of its own.
//
// A server that refuses CONFIG GET (managed services rename or deny it:
// an unknown-command or NOPERM reply) is skipped, so nil means that no
// server that answered may evict, not that every one was read. Any other
// failure (a server that cannot be reached) is returned wrapped. When
// several servers fail, the errors are joined, in the order of their
// addresses.
//
// A service calls it at start-up and decides what to do; limiters do not
// call it. A limiter notices evictions as they happen (see
// [WithEvictionCheck]).
func CheckRedis(ctx context.Context, rdb redis.UniversalClient) error {
	if isNilClient(rdb) {
		return errorf("check redis: nil Redis client: %w", ErrInvalidArgument)
	}
	if err := checkContext(ctx); err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		errs []error
	)
	check := func(ctx context.Context, c redis.Cmdable, addr string) {
		if err := checkServer(ctx, c, addr); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			check(ctx, n, n.Options().Addr)
			return nil
		})
	} else {
		err = evictwatch.ForEachMaster(ctx, rdb, check)
	}
	if err != nil {
		errs = append(errs, errorf("check redis: %w", err))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// checkServer is CheckRedis for one server, c at addr.
func checkServer(ctx context.Context, c redis.Cmdable, addr string) error {
	name := addr
	if name == "" {
		name = "(the client's server)"
	}
	cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
	switch {
	case refusedCommand(err):
		return nil
	case err != nil:
		return errorf("check redis %s: %w", name, err)
	}
	limit, policy := cfg["maxmemory"], cfg["maxmemory-policy"]
	if limit == "" || policy == "" {
		return nil // a server that does not have these settings
	}
	bytes, err := strconv.ParseInt(limit, 10, 64)
	if err != nil {
		return errorf("check redis %s: maxmemory %q is not a number", name, limit)
	}
	if !evictwatch.Evicts(bytes, policy) {
		return nil
	}
	return errorf("Redis %s has maxmemory %d and maxmemory-policy %s: once full it deletes keys, limiter keys among them, which come back with a full allowance (use noeviction, or a Redis of its own for limits): %w",
		name, bytes, policy, ErrEvictionPolicy)
}

// refusedCommand tells whether err is a server refusing a command
// outright: one it does not know (renamed or disabled) or that the user
// may not run.
func refusedCommand(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(msg, "unknown command") ||
		strings.Contains(msg, "unknown subcommand")
}
