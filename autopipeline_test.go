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

// go-redis's AutoPipeliner batches concurrent commands into pipelines; a
// limiter given one works as with a plain client: scripts, NOSCRIPT
// recovery, and the fallback when Redis dies and comes back.
func TestAutoPipeliner(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // windows of an hour, on a real clock
	srv := redistest.Start(t)
	rdb := redis.NewClient(redistest.TunedOptions(srv.Addr))
	defer rdb.Close()
	ap, err := rdb.AutoPipeline()
	require.NoError(t, err)
	defer ap.Close()
	for _, s := range Strategies() {
		lim := newLimiter(t, ap, s, Limit{Rate: 5, Period: time.Hour, Burst: 5}, WithPingInterval(20*time.Millisecond))
		ctx := context.Background()
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		for i := range 6 {
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err, "%v call %d through the AutoPipeliner: %+v, %v", s, i, res, err)
			require.False(t, res.Degraded, "%v call %d through the AutoPipeliner: %+v, %v", s, i, res, err)
			require.Equal(t, i < 5, res.Allowed, "%v call %d through the AutoPipeliner: %+v, %v", s, i, res, err)
		}
	}
	// Under load, Redis dies and comes back.
	lim := newLimiter(t, ap, TokenBucket, PerSecond(100_000))
	ld := startLoad(lim, 32)
	time.Sleep(300 * time.Millisecond)
	killAt := ld.now()
	require.NoError(t, srv.Kill())
	time.Sleep(time.Second)
	require.NoError(t, srv.Restart())
	upAt := ld.now()
	time.Sleep(2 * time.Second)
	r := report(ld.finish(), killAt, upAt)
	t.Logf("AutoPipeliner, crash: %v", r)
	assert.Zero(t, r.errors, "%d errors returned to callers, first %v", r.errors, r.firstErr)
	assert.NotZero(t, r.degraded, "no fallback decision while Redis was down")
	assert.GreaterOrEqual(t, r.back, time.Duration(0), "back on Redis %v after the restart, want within 1.5s", r.back)
	assert.LessOrEqual(t, r.back, 1500*time.Millisecond, "back on Redis %v after the restart, want within 1.5s", r.back)
}
