package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// A settle that Redis did not get (a black hole) or whose reply was lost (a
// reply later than the read timeout) is queued, and made once Redis is
// back; Redis shows the settled charge once.
func TestSettleQueuedRedis(t *testing.T) {
	verifyNoLeak(t)
	srv := redistest.Start(t)
	direct := tunedClient(t, srv.Addr) // reads the state, around the proxy
	for _, tc := range []struct {
		name    string
		fault   func(*redistest.Proxy)
		applied bool // by the first try
	}{
		{"request lost", func(p *redistest.Proxy) { p.Blackhole(true) }, false},
		{"reply lost", func(p *redistest.Proxy) { p.SetDelay(time.Second) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			proxy := redistest.NewProxy(t, srv.Addr)
			rdb := redis.NewClient(redistest.TunedOptions(proxy.Addr))
			defer rdb.Close()
			tr := &transitions{}
			// 100 an hour: the refill in the test is below a token, and the
			// state's rounding (bucket.lua) is paid back within µs.
			limit := Limit{Rate: 100, Period: time.Hour, Burst: 100}
			lim, err := NewTokenBucket(rdb, limit, WithOnTransition(tr.record))
			require.NoError(t, err)
			defer lim.Close()
			check, err := NewTokenBucket(direct, limit)
			require.NoError(t, err)
			defer check.Close()
			key := t.Name()

			rv, err := lim.Reserve(ctx, key, 10)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			require.False(t, rv.Result().Degraded)
			require.Equal(t, 90, remaining(t, check, key))

			tc.fault(proxy)
			_, err = rv.Settle(ctx, 30)
			require.ErrorIs(t, err, ErrUnavailable)
			assert.Contains(t, err.Error(), "(queued: made again once Redis is back)")
			t.Logf("Settle: %v", err)
			_, err = rv.Settle(ctx, 30)
			require.ErrorIs(t, err, ErrSettled, "settled by the queue")
			require.Equal(t, 1, lim.settles.Len())
			want := 90
			if tc.applied {
				want = 70
			}
			assert.Equal(t, want, remaining(t, check, key), "during the outage")
			require.Eventually(t, func() bool { return len(tr.list()) >= 1 }, 3*time.Second, 5*time.Millisecond, "marked down")

			proxy.Restore()
			require.Eventually(t, func() bool { return len(tr.list()) >= 2 }, 5*time.Second, 5*time.Millisecond, "back on Redis")
			require.Eventually(t, func() bool { return lim.settles.Len() == 0 }, 3*time.Second, 5*time.Millisecond, "queue emptied")
			assert.Equal(t, 70, remaining(t, check, key), "the settle charged 30 once")
			// Later passes change nothing.
			time.Sleep(3 * lim.cfg.pingInterval)
			assert.Equal(t, 70, remaining(t, check, key), "the settle charged 30 once")
			require.NoError(t, lim.Close())
		})
	}
}

// The queue of settles is bounded: past it a settle is not queued and its
// reservation stays unsettled. Close cannot make the settles of a node
// marked down: it drops them, says how many, and leaves no goroutine.
func TestSettleQueueBounded(t *testing.T) {
	verifyNoLeak(t)
	defer func(n int) { maxPendingSettles = n }(maxPendingSettles)
	maxPendingSettles = 2
	ctx := context.Background()
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour, Burst: 100}, WithPingInterval(time.Hour))
	var rvs []*Reservation
	for range 3 {
		rv, err := lim.Reserve(ctx, "k", 10)
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	m.SetError("LOADING Redis is loading the dataset in memory")
	for _, rv := range rvs[:2] {
		_, err := rv.Settle(ctx, 0)
		require.ErrorIs(t, err, ErrUnavailable)
		assert.Contains(t, err.Error(), "queued")
	}
	for range 2 {
		_, err := rvs[2].Settle(ctx, 0)
		require.ErrorIs(t, err, ErrUnavailable, "still unsettled")
		assert.Contains(t, err.Error(), "not queued: 2 settles wait already")
	}
	err := lim.Close()
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "2 settles could not be made")
	m.SetError("")
	check := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour, Burst: 100})
	assert.Equal(t, 70, remaining(t, check, "k"), "nothing given back")
}

// A settle whose ctx ended during the call is made again in the
// background; Close makes what is still queued.
func TestSettleCancelledThenClose(t *testing.T) {
	verifyNoLeak(t)
	b, _ := miniBackend(t)
	limit := Limit{Rate: 1, Period: time.Hour, Burst: 100}
	lim := newLimiter(t, b.rdb, TokenBucket, limit)
	rv, err := lim.Reserve(context.Background(), "k", 10)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = rv.Settle(ctx, 0)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "made again in the background")
	require.NoError(t, lim.Close())
	check := newLimiter(t, b.rdb, TokenBucket, limit)
	assert.Equal(t, 100, remaining(t, check, "k"), "given back by Close at the latest")
}

// Close makes each queued settle once, also of a node still marked down:
// Redis answers again (the hang is over) before the monitor's probes have
// brought the node back, and no settle may be dropped untried.
func TestCloseTriesQueuedSettlesRedis(t *testing.T) {
	verifyNoLeak(t)
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := redis.NewClient(redistest.TunedOptions(srv.Addr))
	defer rdb.Close()
	tr := &transitions{}
	limit := Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	// An hour between probes: the node stays marked down until Close.
	lim, err := NewTokenBucket(rdb, limit, WithPingInterval(time.Hour), WithOnTransition(tr.record))
	require.NoError(t, err)
	const n = 20
	rvs := make([]*Reservation, n)
	for i := range rvs {
		rvs[i], err = lim.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, rvs[i].Result().Allowed)
	}
	require.NoError(t, srv.Pause())
	resumed := false
	defer func() {
		if !resumed {
			assert.NoError(t, srv.Resume())
		}
	}()
	for i, rv := range rvs {
		_, err := rv.Settle(ctx, 3) // 2 more than reserved
		require.ErrorIs(t, err, ErrUnavailable, "settle %d", i)
		if i == 0 {
			require.Eventually(t, func() bool { return lim.rescue.anyDown() }, 5*time.Second, 5*time.Millisecond, "marked down")
		}
	}
	require.Equal(t, n, lim.settles.Len(), "queued")
	require.NoError(t, srv.Resume())
	resumed = true
	direct := tunedClient(t, srv.Addr)
	require.NoError(t, direct.Ping(ctx).Err(), "Redis answers again")
	require.True(t, lim.rescue.anyDown(), "still marked down")
	err = lim.Close()
	check, cerr := NewTokenBucket(direct, limit)
	require.NoError(t, cerr)
	defer check.Close()
	left := remaining(t, check, "k")
	t.Logf("Close: %v; Remaining %d (1000 - %d reserved - %d settled over)", err, left, n, 2*n)
	require.NoError(t, err, "every queued settle made")
	assert.Equal(t, 1000-3*n, left, "every settle charged once")
}
