package redlimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evictwatch"
	"github.com/redlimit/redlimit/internal/nodewatch"
)

// plans gives each key the limit of its plan, by the key's prefix.
func plans(free, pro Limit) func(context.Context, string) (Limit, error) {
	return func(_ context.Context, key string) (Limit, error) {
		switch {
		case strings.HasPrefix(key, "pro:"):
			return pro, nil
		case strings.HasPrefix(key, "free:"):
			return free, nil
		case strings.HasPrefix(key, "broken:"):
			return Limit{}, errors.New("plan store unavailable")
		case strings.HasPrefix(key, "bad:"):
			return Limit{Rate: -1, Period: time.Second}, nil
		}
		return Limit{}, nil // the limiter's own
	}
}

func TestLimitFuncTwoPlans(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, PerMinute(1), WithLimitFunc(plans(PerMinute(2), PerMinute(5))))
			ctx := t.Context()
			for key, want := range map[string]int{"free:a": 2, "pro:b": 5, "other": 1} {
				assert.Equal(t, want, allowedOf(t, lim, key, 8), "key %s", key)
			}
			_, err := lim.AllowN(ctx, "free:a", 3)
			require.ErrorIs(t, err, ErrExceedsLimit, "n above the plan's capacity")
		})
	}
}

// A plan upgrade mid-window keeps what was used.
func TestLimitFuncUpgradeKeepsUsage(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			var plan atomic.Value
			plan.Store(PerMinute(3))
			lim := newLimiter(t, b.rdb, s, PerMinute(3), WithLimitFunc(func(context.Context, string) (Limit, error) {
				return plan.Load().(Limit), nil
			}))
			ctx := t.Context()
			res, err := lim.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			b.advance(time.Millisecond)
			plan.Store(PerMinute(10)) // upgraded: 7 more, not 10
			res, err = lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			assert.Equal(t, 7, res.Remaining, "after the upgrade")
			assert.Equal(t, PerMinute(10).Rate, res.Limit.Rate, "the result names the limit that decided")
			res, err = lim.AllowN(ctx, "k", 7)
			require.NoError(t, err)
			assert.True(t, res.Allowed)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed)
		})
	}
}

// An error from f is returned, wrapped, and nothing is decided or
// written; an invalid limit from f is ErrInvalidLimit, never a panic.
func TestLimitFuncErrors(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), WithLimitFunc(plans(PerSecond(2), PerSecond(5))),
		WithFallbackKeys(10))
	ctx := t.Context()
	_, err := lim.Allow(ctx, "broken:x")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "plan store unavailable")
	_, err = lim.Allow(ctx, "bad:x")
	require.ErrorIs(t, err, ErrInvalidLimit)
	require.Error(t, lim.Wait(ctx, "broken:x"))
	n, err := countKeys(b.rdb, "*")
	require.NoError(t, err)
	assert.Zero(t, n, "no key written for failed calls")
	_, err = NewTokenBucket(b.rdb, PerSecond(1), WithRulesFunc(func(context.Context, string) ([]Rule, error) { return nil, nil }))
	require.ErrorIs(t, err, ErrInvalidArgument, "WithRulesFunc is for policies")
}

// The deny cache and the fallback follow the limit of the latest call.
func TestLimitFuncDenyCacheAndFallback(t *testing.T) {
	b, m := miniBackend(t)
	var plan atomic.Value
	plan.Store(PerHour(1))
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(1), WithDenyCache(100), WithPingInterval(time.Hour),
		WithLimitFunc(func(context.Context, string) (Limit, error) { return plan.Load().(Limit), nil }))
	ctx := t.Context()
	for i, want := range []bool{true, false, false} {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, want, res.Allowed, "call %d", i)
	}
	plan.Store(PerHour(3))
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "the upgrade is not hidden by a cached denial: %+v", res)

	m.Close() // the fallback: its stand-in follows the plan too
	plan.Store(PerHour(2))
	for i, want := range []bool{true, true, false} {
		res, err := lim.Allow(ctx, "j")
		require.NoError(t, err)
		require.True(t, res.Degraded)
		assert.Equal(t, want, res.Allowed, "fallback call %d under PerHour(2)", i)
	}
	plan.Store(PerHour(5))
	assert.Equal(t, 3, allowedOf(t, lim, "j", 8), "the stand-in for PerHour(5) keeps the 2 used, as Redis's state would")
}

// A Policy's rules function: per-plan rules, and the policy's own for nil.
func TestRulesFunc(t *testing.T) {
	b, _ := miniBackend(t)
	own := []Rule{{Strategy: FixedWindow, Limit: PerMinute(2)}}
	p := newPolicy(t, b.rdb, own, WithRulesFunc(func(_ context.Context, key string) ([]Rule, error) {
		switch {
		case strings.HasPrefix(key, "pro:"):
			return []Rule{
				{Strategy: FixedWindow, Limit: PerMinute(5)},
				{Strategy: TokenBucket, Limit: PerSecond(3)},
			}, nil
		case strings.HasPrefix(key, "bad:"):
			return []Rule{{Strategy: FixedWindow, Limit: PerMinute(5)}, {Strategy: FixedWindow, Limit: PerMinute(6)}}, nil
		}
		return nil, nil
	}))
	ctx := t.Context()
	count := func(key string) int {
		n := 0
		for range 10 {
			res, err := p.Allow(ctx, key)
			require.NoError(t, err)
			n += btoi(res.Allowed)
		}
		return n
	}
	assert.Equal(t, 2, count("free:a"))
	assert.Equal(t, 3, count("pro:b"), "the bucket is the tighter at once")
	_, err := p.Allow(ctx, "bad:c")
	require.ErrorIs(t, err, ErrInvalidLimit, "two rules with one state")
}

// In the fallback, limits that alternate for one key (WithLimitFunc) keep
// what was used, as Redis's shared state does: 2 and 3 a minute in turn
// admit 3 of 100 calls, on Redis and off it (off it, each switch made a
// full stand-in: 100 of 100).
func TestFallbackLimitsAlternate(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, FixedWindow, LeakyBucket} {
		for _, down := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/down %v", s, down), func(t *testing.T) {
				b, m := miniBackend(t)
				var i atomic.Int64
				lim := newLimiter(t, b.rdb, s, PerMinute(2), WithPingInterval(time.Hour),
					WithLimitFunc(func(context.Context, string) (Limit, error) {
						if i.Add(1)%2 == 0 {
							return PerMinute(2), nil
						}
						return PerMinute(3), nil
					}))
				if down {
					m.Close()
				}
				assert.Equal(t, 3, allowedOf(t, lim, "k", 100))
			})
		}
	}
}

// A constructor that refuses an option only after the engine is set up
// (WithRulesFunc on a RateLimiter, WithLimitFunc on a Policy) leaves
// nothing behind: no node watch or eviction watch keeps the refused
// limiter, which would otherwise stay subscribed for the life of the
// process and be told of the client's outages.
func TestRefusedFuncLeavesNoWatch(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	watches := func() (nodes, evicts int) {
		return nodewatch.Watching(rdb), evictwatch.Watching(rdb)
	}
	rulesFunc := WithRulesFunc(func(context.Context, string) ([]Rule, error) { return nil, nil })
	_, err := NewTokenBucket(rdb, PerSecond(1), rulesFunc, WithEvictionCheck(time.Hour))
	require.ErrorIs(t, err, ErrInvalidArgument, "WithRulesFunc is for policies")
	limitFunc := WithLimitFunc(func(context.Context, string) (Limit, error) { return PerSecond(1), nil })
	_, err = NewPolicy(rdb, []Rule{{Strategy: FixedWindow, Limit: PerSecond(1)}}, limitFunc, WithEvictionCheck(time.Hour))
	require.ErrorIs(t, err, ErrInvalidArgument, "WithLimitFunc is for single-strategy limiters")
	nodes, evicts := watches()
	assert.Zero(t, nodes, "node watches left for the refused limiters")
	assert.Zero(t, evicts, "eviction watches left for the refused limiters")
}
