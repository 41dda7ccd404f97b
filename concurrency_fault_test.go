package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Tests of Concurrency under faults (issue 26, items 2, 5 and 6): the
// fallback counts the leases an instance holds on Redis.

// liveLeases returns the members of a Concurrency key in Redis, read
// through rdb (a client that does not go through the test's fault).
func liveLeases(t *testing.T, rdb redis.UniversalClient, c *Concurrency, key string) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), c.e.stateKey(key, &c.e.own.rules[0])).Result()
	require.NoError(t, err)
	return n
}

// Four instances on their own clients, max 4 and a quarter share each,
// each holding one lease on Redis when Redis is SIGKILLed: the fallback
// counts those leases against the shares, so the fleet still holds at most
// 4 (it held 8: each in-process semaphore started empty). A Redis lease
// released during the outage frees its instance's slot.
func TestConcurrencyLimitFallbackCountsHeldRedis(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	const max, instances = 4, 4
	cs := make([]*Concurrency, instances)
	onRedis := make([]*Lease, instances)
	for i := range cs {
		cs[i] = newConc(t, tunedClient(t, s.Addr), max, time.Minute,
			WithFallbackShare(1.0/instances), WithPingInterval(time.Hour))
		var res Result
		onRedis[i], res = mustTry(t, cs[i], "k")
		require.False(t, res.Degraded, "instance %d", i)
	}
	require.NoError(t, s.Kill())

	held := instances // the Redis leases, live by their ttl
	for i, c := range cs {
		for range 3 {
			l, res, err := c.TryAcquire(ctx, "k")
			require.NoError(t, err, "instance %d", i)
			require.True(t, res.Degraded, "instance %d: %+v", i, res)
			if l != nil {
				held++
			} else {
				assert.InDelta(t, time.Minute, res.RetryAfter, float64(5*time.Second),
					"instance %d: RetryAfter is when its Redis lease expires: %+v", i, res)
			}
		}
	}
	t.Logf("held at once during the outage: %d (max %d)", held, max)
	require.LessOrEqual(t, held, max, "leases held at once by %d instances", instances)

	// Released during the outage, a Redis lease frees its slot here.
	require.NoError(t, onRedis[0].Release(ctx))
	l, res, err := cs[0].TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.NotNil(t, l, "the slot of the Redis lease released during the outage: %+v", res)
	require.True(t, res.Degraded)
	require.Zero(t, res.Remaining)
	l, res, err = cs[0].TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, l, "a second in-process lease on a share of 1: %+v", res)
}

// The same on miniredis, with the instance's clock stepped: a Redis lease
// counts against the share until its ttl ends (from the reply, or from the
// last Extend), then its slot frees.
func TestConcurrencyLimitFallbackHeldExpire(t *testing.T) {
	m := miniredis.RunT(t)
	ctx := context.Background()
	now := t0
	c := newConc(t, tunedClient(t, m.Addr()), 4, time.Minute, WithFallbackShare(0.5),
		WithPingInterval(time.Hour), withClock(func() time.Time { return now }))
	first, _ := mustTry(t, c, "k")
	now = now.Add(30 * time.Second)
	second, _ := mustTry(t, c, "k")
	mustTry(t, c, "other")
	now = now.Add(20 * time.Second)
	require.NoError(t, first.Extend(ctx)) // live until 1m50s
	m.Close()

	try := func(key string) (*Lease, Result) {
		t.Helper()
		l, res, err := c.TryAcquire(ctx, key)
		require.NoError(t, err)
		require.True(t, res.Degraded, "%+v", res)
		return l, res
	}
	l, res := try("k")
	require.Nil(t, l, "capacity 2, 2 Redis leases live: %+v", res)
	assert.Equal(t, 40*time.Second, res.RetryAfter, "until the second expires, at 1m30s")
	assert.Equal(t, time.Minute, res.ResetAfter, "until the first expires, at 1m50s")
	l, res = try("other")
	require.NotNil(t, l, "one Redis lease of 2 on another key: %+v", res)
	assert.Zero(t, res.Remaining)

	now = now.Add(40 * time.Second) // the second expired
	l, res = try("k")
	require.NotNil(t, l, "the expired Redis lease's slot: %+v", res)
	assert.Zero(t, res.Remaining)
	l, res = try("k")
	require.Nil(t, l, "%+v", res)
	assert.Equal(t, 20*time.Second, res.RetryAfter, "until the first expires, at 1m50s")
	require.NoError(t, second.Release(ctx), "an expired lease, released during the outage")

	now = now.Add(20 * time.Second) // the first expired too
	l, res = try("k")
	require.NotNil(t, l, "%+v", res)
	require.NoError(t, first.Release(ctx))
}
