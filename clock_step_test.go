package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// timeAnswer answers TIME with answer's time or error, without a server;
// other commands go on (and fail: nothing listens).
type timeAnswer struct {
	passHooks
	answer func(ctx context.Context) (time.Time, error)
}

func (h timeAnswer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		tc, ok := cmd.(*redis.TimeCmd)
		if !ok {
			return next(ctx, cmd)
		}
		v, err := h.answer(ctx)
		if err != nil {
			tc.SetErr(err)
			return err
		}
		tc.SetVal(v)
		return nil
	}
}

// timeClient returns a client whose TIME answer gives.
func timeClient(t *testing.T, answer func(ctx context.Context) (time.Time, error)) redis.UniversalClient {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	rdb.AddHook(timeAnswer{answer: answer})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// simAt returns a simulated clock (no monotonic readings) set to at.
func simAt(at time.Time) *simClock {
	c := &simClock{}
	c.us.Store(at.UnixMicro())
	return c
}

func (c *simClock) add(d time.Duration) { c.us.Add(d.Microseconds()) }

// Close ends a measurement under way, whose call has gone (its deadline
// passed) while TIME hangs: no goroutine outlives the limiter. (The
// measurement ran on for its own timeout, or longer without
// ContextTimeoutEnabled.)
func TestClientClockCloseEndsMeasurement(t *testing.T) {
	before := goleak.IgnoreCurrent()
	rdb := timeClient(t, func(ctx context.Context) (time.Time, error) {
		<-ctx.Done()
		return time.Time{}, ctx.Err()
	})
	lim, err := NewTokenBucket(rdb, PerSecond(10), WithClientClock())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = lim.Allow(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, lim.Close())
	// (The client, closed at the test's end, keeps its own.)
	require.NoError(t, goleak.Find(before,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop")),
		"a goroutine outlived Close")
	_, err = lim.clock.NowMicros(t.Context())
	require.ErrorIs(t, err, ErrClosed, "a measurement after Close")
}
