package redlimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 10, item 9: the deny cache answers only the n it was told about
// (a cached n=1 gave 100ms for n=10, where Redis says 1s).
func TestDenyCacheLargerN(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(10), WithDenyCache(100))
	ctx := t.Context()
	_, err := lim.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	assert.Equal(t, 100*time.Millisecond, res.RetryAfter)
	res, err = lim.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	assert.Equal(t, time.Second, res.RetryAfter, "Redis's answer for n=10, not the cached one for n=1")
}

// Issue 10, item 9: a denial in flight while Reset runs is not remembered
// (it used to deny for its whole RetryAfter after the Reset).
func TestDenyCacheResetInFlight(t *testing.T) {
	b, _ := miniBackend(t)
	var once sync.Once
	// The observer runs after the decision and before the next; Reset is
	// called from a hook between the script's reply and remember.
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(1), WithDenyCache(100))
	ctx := t.Context()
	_, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	b.rdb.AddHook(resetHook{after: func() { once.Do(func() { require.NoError(t, lim.Reset(context.Background(), "k")) }) }})
	res, err := lim.Allow(ctx, "k") // denied by Redis; Reset lands before the cache is written
	require.NoError(t, err)
	require.False(t, res.Allowed)
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "the stale denial outlived the Reset: %+v", res)
}

// A call sent while Reset runs, between its clearing this process's state
// and its DEL, is decided on the old state: its denial is not remembered
// past the Reset either (it denied the key for the rest of the hour).
func TestDenyCacheResetBeforeDel(t *testing.T) {
	b, _ := miniBackend(t)
	del := &holdDel{entered: make(chan struct{}), release: make(chan struct{})}
	b.rdb.AddHook(del)
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(1), WithDenyCache(100))
	ctx := t.Context()
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	done := make(chan error)
	go func() { done <- lim.Reset(ctx, "k") }()
	<-del.entered // Reset has cleared this process's state; its DEL waits
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed, "denied by Redis before the DEL: %+v", res)
	close(del.release)
	require.NoError(t, <-done)
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "after Reset returned, the deny cache denied: %+v", res)
}

// holdDel holds the first DEL until release is closed.
type holdDel struct {
	passHooks
	once             sync.Once
	entered, release chan struct{}
}

func (h *holdDel) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "del" {
			h.once.Do(func() {
				close(h.entered)
				<-h.release
			})
		}
		return next(ctx, cmd)
	}
}

// resetHook calls after once the first script reply has arrived.
type resetHook struct{ after func() }

func (h resetHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h resetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.after()
		}
		return err
	}
}

func (h resetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
