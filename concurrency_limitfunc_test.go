package redlimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// planMax is a limit function of per-plan caps: "free:" keys 1, "pro:"
// keys 3, anything else the Concurrency's own max.
func planMax(_ context.Context, key string) (Limit, error) {
	switch {
	case strings.HasPrefix(key, "free:"):
		return Limit{Rate: 1}, nil
	case strings.HasPrefix(key, "pro:"):
		return Limit{Rate: 3}, nil
	case strings.HasPrefix(key, "bad:"):
		return Limit{Rate: MaxConcurrency + 1}, nil
	case strings.HasPrefix(key, "fail:"):
		return Limit{}, errors.New("plan store down")
	}
	return Limit{}, nil
}

// testPerKeyMax takes leases until the first denial on keys of each plan,
// on one Concurrency of max 2: the script counts each key against its own
// max.
func testPerKeyMax(t *testing.T, rdb redis.UniversalClient) {
	c := newConc(t, rdb, 2, time.Minute, WithPrefix("perkey-"+t.Name()), WithLimitFunc(planMax))
	ctx := context.Background()
	for _, tt := range []struct {
		key  string
		want int
	}{{"free:a", 1}, {"pro:b", 3}, {"other", 2}} {
		granted := 0
		for range 10 {
			l, res, err := c.TryAcquire(ctx, tt.key)
			require.NoError(t, err)
			require.Equal(t, tt.want, res.Limit.Rate, "%s: Result.Limit.Rate", tt.key)
			require.Equal(t, tt.want, res.Limit.Burst, "%s: Result.Limit.Burst", tt.key)
			require.Equal(t, time.Minute, res.Limit.Period, "%s: Result.Limit.Period", tt.key)
			if l == nil {
				require.False(t, res.Allowed)
				require.Positive(t, res.RetryAfter)
				break
			}
			granted++
			require.Equal(t, tt.want-granted, res.Remaining, "%s: Remaining after %d", tt.key, granted)
			t.Cleanup(func() { _ = l.Release(context.Background()) })
		}
		require.Equal(t, tt.want, granted, "leases granted on %s", tt.key)
		n, err := rdb.ZCard(ctx, c.e.stateKey(tt.key, &c.e.own.rules[0])).Result()
		require.NoError(t, err)
		require.Equal(t, int64(tt.want), n, "leases in Redis on %s", tt.key)
	}
	_, _, err := c.TryAcquire(ctx, "bad:x")
	require.ErrorIs(t, err, ErrInvalidLimit, "a max above MaxConcurrency")
	require.True(t, strings.HasPrefix(err.Error(), "redlimit: "), "error %q lacks the package prefix", err)
	_, _, err = c.TryAcquire(ctx, "fail:x")
	require.ErrorContains(t, err, "plan store down")
}

func TestConcurrencyPerKeyMax(t *testing.T) {
	m := miniredis.RunT(t)
	testPerKeyMax(t, tunedClient(t, m.Addr()))
}

func TestConcurrencyPerKeyMaxRedis(t *testing.T) {
	rdb := redis.NewClient(redistest.TunedOptions(realServer(t).Addr))
	t.Cleanup(func() { rdb.Close() })
	testPerKeyMax(t, rdb)
}

// A limit function's Limit is checked: Period is the ttl or 0, Burst the
// Rate or 0.
func TestConcurrencyPerKeyMaxChecked(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	for _, l := range []Limit{{Rate: 0, Period: time.Second}, {Rate: 2, Period: time.Hour}, {Rate: 2, Burst: 3}, {Rate: -1}} {
		c := newConc(t, rdb, 2, time.Second, WithLimitFunc(func(context.Context, string) (Limit, error) { return l, nil }))
		_, _, err := c.TryAcquire(context.Background(), "k")
		require.ErrorIs(t, err, ErrInvalidLimit, "limit %+v", l)
	}
	c := newConc(t, rdb, 2, time.Second, WithLimitFunc(func(context.Context, string) (Limit, error) {
		return Limit{Rate: 5, Period: time.Second, Burst: 5}, nil
	}))
	_, res, err := c.TryAcquire(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, 4, res.Remaining, "max 5 with its Period and Burst spelled out")
}

// While Redis is down, FallbackLocal's semaphore of a key has floor(max ×
// share) slots of the key's own max.
func TestConcurrencyPerKeyMaxFallback(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	c := newConc(t, rdb, 2, time.Minute, WithLimitFunc(planMax), WithFallbackShare(0.5), WithPingInterval(time.Hour))
	m.Close()
	for _, tt := range []struct {
		key  string
		want int
	}{{"free:a", 1}, {"pro:b", 1}, {"other", 1}, {"big", 4}} {
		if tt.key == "big" {
			c2 := newConc(t, rdb, 2, time.Minute, WithPingInterval(time.Hour), WithFallbackShare(0.5),
				WithLimitFunc(func(context.Context, string) (Limit, error) { return Limit{Rate: 8}, nil }))
			c = c2
		}
		granted := 0
		for range 10 {
			l, res, err := c.TryAcquire(context.Background(), tt.key)
			require.NoError(t, err)
			if l == nil {
				break
			}
			require.True(t, res.Degraded, "%s: answered in process", tt.key)
			granted++
		}
		require.Equal(t, tt.want, granted, "in-process leases of %s", tt.key)
	}
}
