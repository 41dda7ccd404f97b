package redlimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evictwatch"
	"github.com/redlimit/redlimit/internal/redistest"
)

// Limiters on one client share the watch of its node: during a 3 s outage
// the client dials no more with 10 limiters (rate limiters, policies and
// concurrency limits) than with 1, and each limiter's hook is told once
// that the node went down and once that it came back. ("No more" allows
// one dial: on a loaded machine a probe late by over 150 ms crosses the
// window's edge; 10 watches instead of one would dial about 10 times as
// often.)
func TestNodeWatchSharedRedis(t *testing.T) {
	verifyNoLeak(t)
	srv := redistest.Start(t)
	one := outageDials(t, srv.Addr, 1, nil)
	ten := outageDials(t, srv.Addr, 10, nil)
	t.Logf("dials during a 3 s outage: %d with 1 limiter, %d with 10 on the same client", one, ten)
	assert.LessOrEqual(t, ten, one+1, "dials with 10 limiters")
}

// Limiters on one client share the watch of its node whatever their
// prefixes and ping intervals: 10 limiters with 10 prefixes, some probing
// twice as often as asked by the others, dial no more than 1 alone (give
// or take the one dial of TestNodeWatchSharedRedis).
func TestNodeWatchPrefixesRedis(t *testing.T) {
	verifyNoLeak(t)
	srv := redistest.Start(t)
	one := outageDials(t, srv.Addr, 1, nil)
	ten := outageDials(t, srv.Addr, 10, func(i int) []Option {
		every := defaultConfig().pingInterval
		if i%2 == 1 {
			every *= 2
		}
		return []Option{WithPrefix(fmt.Sprintf("tenant%d", i)), WithPingInterval(every)}
	})
	t.Logf("dials during a 3 s outage: %d with 1 limiter, %d with 10 prefixes on the same client", one, ten)
	assert.LessOrEqual(t, ten, one+1, "dials with 10 prefixes")
}

// outageDials runs n limiters on one client through a proxy, under load,
// cuts the proxy for 3 s once every limiter is on its fallback, and returns
// how many connections the client dialled meanwhile. It checks that no
// call failed and that each hook saw one Down and one switch back. opts,
// if not nil, gives limiter i its options.
func outageDials(t *testing.T, addr string, n int, opts func(i int) []Option) int64 {
	t.Helper()
	proxy := redistest.NewProxy(t, addr)
	var dials dialCounter
	o := redistest.TunedOptions(proxy.Addr)
	o.Dialer = dials.dial
	// No dial breaker: past PoolSize failed dials go-redis dials once a
	// second whatever is asked, which would hide the dials asked for.
	o.PoolSize = 10_000
	rdb := redis.NewClient(o)
	defer rdb.Close()

	trs := make([]*transitions, n)
	calls := make([]func(context.Context) error, n)
	var closers []func() error
	for i := range n {
		tr := &transitions{}
		trs[i] = tr
		hook := []Option{WithOnTransition(tr.record)}
		if opts != nil {
			hook = append(hook, opts(i)...)
		}
		switch i % 3 {
		case 0:
			lim, err := NewTokenBucket(rdb, PerSecond(100_000), hook...)
			require.NoError(t, err)
			closers = append(closers, lim.Close)
			calls[i] = func(ctx context.Context) error { _, err := lim.Allow(ctx, "k"); return err }
		case 1:
			p, err := NewPolicy(rdb, []Rule{
				{Strategy: FixedWindow, Limit: PerSecond(100_000)},
				{Strategy: SlidingCounter, Limit: PerMinute(1_000_000)},
			}, hook...)
			require.NoError(t, err)
			closers = append(closers, p.Close)
			calls[i] = func(ctx context.Context) error { _, err := p.Allow(ctx, "k"); return err }
		case 2:
			c, err := NewConcurrency(rdb, 100, time.Second, hook...)
			require.NoError(t, err)
			closers = append(closers, c.Close)
			calls[i] = func(ctx context.Context) error {
				l, _, err := c.TryAcquire(ctx, "k")
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}
		}
	}

	var (
		stop   atomic.Bool
		wg     sync.WaitGroup
		errs   atomic.Int64
		first  atomic.Value
		ctx    = context.Background()
		allGot = func(k int) bool {
			for _, tr := range trs {
				if len(tr.list()) < k {
					return false
				}
			}
			return true
		}
	)
	for _, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := call(ctx); err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	proxy.Cut()
	require.Eventually(t, func() bool { return allGot(1) }, 3*time.Second, 5*time.Millisecond, "every limiter told the node is down")
	// Probes of a node that refuses connections go 100, 300, 600, 900...
	// ms after it is marked down: a window from 450 ms to 3.45 s has its
	// edges 150 ms from any probe, and holds 10.
	time.Sleep(450 * time.Millisecond)
	before := dials.n.Load()
	time.Sleep(3 * time.Second)
	during := dials.n.Load() - before
	proxy.Restore()
	require.Eventually(t, func() bool { return allGot(2) }, 5*time.Second, 5*time.Millisecond, "every limiter told the node is back")
	stop.Store(true)
	wg.Wait()
	for _, c := range closers {
		require.NoError(t, c())
	}
	assert.Zero(t, errs.Load(), "errors returned to callers, first %v", first.Load())
	for i, tr := range trs {
		got := tr.list()
		require.Len(t, got, 2, "limiter %d's transitions: %+v", i, got)
		assert.True(t, got[0].Down, "limiter %d: first transition %+v", i, got[0])
		assert.False(t, got[1].Down, "limiter %d: second transition %+v", i, got[1])
		assert.Equal(t, "", got[0].Node)
		assert.Positive(t, got[1].Outage)
	}
	t.Logf("%d limiters: %d transitions each (Down, back after %v), %d dials in 3 s of outage",
		n, len(trs[0].list()), trs[0].list()[1].Outage.Round(time.Millisecond), during)
	return during
}

// Limiters on one client share the down-state of its node: one marks it
// down for all; one made meanwhile is told at once; closing one leaves
// the monitor to the others, and the last Close stops it.
func TestNodeWatchRefCounted(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	every := WithPingInterval(10 * time.Millisecond)
	var trA, trB, trC transitions
	a, err := NewTokenBucket(rdb, PerSecond(100), every, WithOnTransition(trA.record))
	require.NoError(t, err)
	b, err := NewPolicy(rdb, []Rule{{Strategy: FixedWindow, Limit: PerSecond(100)}}, every, WithOnTransition(trB.record))
	require.NoError(t, err)
	other, err := NewTokenBucket(rdb, PerSecond(100), WithPingInterval(5*time.Millisecond), WithPrefix("other"))
	require.NoError(t, err)
	clientClock, err := NewTokenBucket(rdb, PerSecond(100), every, WithClientClock())
	require.NoError(t, err)
	defer clientClock.Close()
	require.Same(t, a.rescue.w, b.rescue.w, "one watch for the same client")
	require.Same(t, a.rescue.w, other.rescue.w, "one watch whatever the ping interval and prefix")
	require.NotSame(t, a.rescue.w, clientClock.rescue.w, "another clock, another watch")
	assert.Equal(t, 5*time.Millisecond, a.rescue.w.Interval(), "the shortest ping interval")
	require.NoError(t, other.Close())
	assert.Equal(t, 10*time.Millisecond, a.rescue.w.Interval(), "the shortest ping interval of those left")

	m.SetError("LOADING Redis is loading the dataset in memory")
	res, err := a.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Degraded)
	require.True(t, b.rescue.anyDown(), "down for the policy too")
	res, err = b.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Degraded)
	assert.Len(t, trB.list(), 1, "the policy's hook told")
	c, err := NewConcurrency(rdb, 5, time.Second, every, WithOnTransition(trC.record))
	require.NoError(t, err)
	require.Len(t, trC.list(), 1, "told from its constructor")
	assert.True(t, trC.list()[0].Down)
	assert.Equal(t, Strategy(0), trC.list()[0].Strategy)
	require.NoError(t, a.Close())

	m.SetError("")
	require.Eventually(t, func() bool { return len(trB.list()) == 2 && len(trC.list()) == 2 }, 5*time.Second, 5*time.Millisecond,
		"back, for the limiters left, after the first closed")
	assert.Len(t, trA.list(), 1, "a closed limiter is not told")
	assert.False(t, trB.list()[1].Down)
	require.NoError(t, b.Close())
	w := c.e.rescue.w
	require.NoError(t, c.Close())
	assert.True(t, w.Stopped(), "the last Close stops the watch")
}

// A Transition says what it reports in Kind and in its String, so that a
// hook that logs it cannot take an eviction notice for a switch back.
func TestTransitionKindAndString(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	var tr transitions
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(100), WithPingInterval(10*time.Millisecond), WithOnTransition(tr.record))
	m.SetError("LOADING Redis is loading the dataset in memory")
	_, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err)
	m.SetError("")
	got := waitTransitions(t, &tr, 2, 5*time.Second)
	require.Len(t, got, 2)
	assert.Equal(t, TransitionDown, got[0].Kind)
	assert.Equal(t, "redlimit: Redis unavailable, the fallback decides: LOADING Redis is loading the dataset in memory", got[0].String())
	assert.Equal(t, TransitionBack, got[1].Kind)
	assert.Regexp(t, `^redlimit: Redis back after \S+ unavailable$`, got[1].String())

	notice := transition(&lim.engine, evictwatch.Report{Addr: "10.0.0.1:6379", Rise: 5035, MaxMemory: 1 << 20, Policy: "allkeys-lru"})
	assert.Equal(t, TransitionEvicted, notice.Kind)
	assert.False(t, notice.Down)
	assert.Equal(t, "evicted", notice.Kind.String())
	assert.True(t, strings.HasPrefix(notice.String(), "redlimit: token-bucket: Redis 10.0.0.1:6379 evicted 5035 keys since the last sample"), notice.String())
	assert.Equal(t, "redlimit: Redis node 10.0.0.2:6379 evicted 7 keys", Transition{Kind: TransitionEvicted, Node: "10.0.0.2:6379", Evicted: 7}.String())
	assert.Equal(t, "TransitionKind(0)", TransitionKind(0).String())
}
