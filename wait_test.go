package redlimit

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bubbleClient returns a client of a miniredis that runs on the synctest
// bubble's fake clock (TIME, TTLs and the limiter's own timers alike).
func bubbleClient(t *testing.T) *redis.Client {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	t.Cleanup(m.Close)
	rdb := redis.NewClient(&redis.Options{
		Addr:   "127.0.0.1:1", // never dialled: a literal address needs no DNS lookup
		Dialer: func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// countCalls returns an observer option and the number of decisions it saw.
func countCalls() (Option, *atomic.Int64) {
	var n atomic.Int64
	return WithObserver(func(Decision) { n.Add(1) }), &n
}

func TestWaitAsksOncePerRetryAfter(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rdb := bubbleClient(t)
				observe, calls := countCalls()
				lim := newLimiter(t, rdb, s, Limit{Rate: 2, Period: time.Second, Burst: 2}, observe)
				ctx := context.Background()
				for range 2 {
					require.NoError(t, lim.Wait(ctx, "k"))
				}
				calls.Store(0)
				start := time.Now()
				require.NoError(t, lim.Wait(ctx, "k"))
				waited := time.Since(start)
				want := map[Strategy]time.Duration{
					FixedWindow:    time.Second,             // the next window
					SlidingLog:     time.Second,             // the first event leaves
					SlidingCounter: 1500 * time.Millisecond, // half-way through the next window the 2 weigh 1
					TokenBucket:    500 * time.Millisecond,  // one token
					LeakyBucket:    500 * time.Millisecond,  // the second Wait slept until 500ms; the next slot is at 1s
					// The first sub-window (of 60) ends at 16,667µs: its
					// events count until a second after.
					SubWindowCounter: time.Second + 16667*time.Microsecond,
				}[s]
				assert.Equal(t, want, waited, "Wait took %v, want %v", waited, want)
				got := calls.Load()
				assert.LessOrEqual(t, got, int64(2), "Wait asked Redis %d times, want at most 2 (denied, then allowed)", got)
			})
		})
	}
}

func TestWaitDeadline(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rdb := bubbleClient(t)
				lim := newLimiter(t, rdb, s, Limit{Rate: 1, Period: time.Second, Burst: 1})
				require.NoError(t, lim.Wait(context.Background(), "k"))
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				err := lim.Wait(ctx, "k")
				require.ErrorIs(t, err, context.DeadlineExceeded, "Wait = %v, want an error wrapping context.DeadlineExceeded", err)
				waited := time.Since(start)
				assert.Zero(t, waited, "Wait returned after %v, want at once", waited)
				cancelled, cancel2 := context.WithCancel(context.Background())
				cancel2()
				err = lim.Wait(cancelled, "k")
				assert.ErrorIs(t, err, context.Canceled, "Wait on a cancelled context = %v", err)
			})
		})
	}
}

// A leaky bucket waiter never takes a slot it cannot wait for.
func TestLeakyBucketWaitKeepsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rdb := bubbleClient(t)
		lim := newLimiter(t, rdb, LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 3})
		ctx := context.Background()
		// Take the slots at 0 and 100ms without waiting.
		_, err := lim.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		defer cancel()
		err = lim.Wait(short, "k") // its slot would be at 200ms
		require.ErrorIs(t, err, context.DeadlineExceeded, "Wait = %v, want DeadlineExceeded", err)
		res, err := lim.AllowN(ctx, "k", 0)
		require.NoError(t, err, "after the refused Wait: %+v, %v; want the slot still free (1 remaining)", res, err)
		require.Equal(t, 1, res.Remaining, "after the refused Wait: %+v, %v; want the slot still free (1 remaining)", res, err)
		start := time.Now()
		require.NoError(t, lim.Wait(ctx, "k"))
		waited := time.Since(start)
		assert.Equal(t, 200*time.Millisecond, waited, "Wait slept %v, want the slot's delay of 200ms", waited)
	})
}

// A leaky bucket's WaitN keeps twice its latest round trip before the
// deadline: a slot whose sleep, from the reply, would end after it is
// refused at once. With a 1 ms margin and a 4 ms round trip, WaitN took
// the slot, slept to the deadline and failed, the slot lost; with the
// margin capped at a quarter of the time left, a 10 ms round trip and 28
// ms left did the same.
func TestWaitLeakyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		oneWay   time.Duration
		limit    Limit
		queued   int // slots taken before the Wait, 1/Rate apart from now
		timeout  time.Duration
		mustFail bool // no slot fits: Wait must be refused at once
	}{
		{2 * time.Millisecond, Limit{Rate: 10, Period: time.Second, Burst: 3}, 1, 96 * time.Millisecond, false},
		{2 * time.Millisecond, Limit{Rate: 10, Period: time.Second, Burst: 3}, 1, 97 * time.Millisecond, false},
		{2 * time.Millisecond, Limit{Rate: 10, Period: time.Second, Burst: 3}, 1, 98 * time.Millisecond, false},
		{2 * time.Millisecond, Limit{Rate: 10, Period: time.Second, Burst: 3}, 1, 99 * time.Millisecond, false},
		{5 * time.Millisecond, Limit{Rate: 100, Period: time.Second, Burst: 5}, 3, 28 * time.Millisecond, true},
	} {
		t.Run(fmt.Sprintf("rtt %v/timeout %v", 2*tc.oneWay, tc.timeout), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rdb := bubbleClient(t)
				rdb.AddHook(&latencyHook{oneWay: tc.oneWay})
				lim := newLimiter(t, rdb, LeakyBucket, tc.limit)
				ctx := context.Background()
				require.NoError(t, lim.Wait(ctx, "other")) // the round trip, measured
				_, err := lim.AllowN(ctx, "k", tc.queued)
				require.NoError(t, err)
				short, cancel := context.WithTimeout(ctx, tc.timeout)
				defer cancel()
				start := time.Now()
				err = lim.Wait(short, "k")
				waited := time.Since(start)
				if tc.mustFail {
					require.Error(t, err)
				}
				if err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded)
					assert.LessOrEqual(t, waited, 2*tc.oneWay+2*time.Millisecond, "Wait failed after %v: it took a slot it could not use", waited)
				} else {
					assert.LessOrEqual(t, waited, tc.timeout, "Wait returned after its deadline")
				}
			})
		})
	}
}

// One slow round trip does not end later waits before they ask: the
// margin kept for it is at most a quarter of the time left (a 600 ms one
// made every WaitN with a 1 s deadline fail at once, for good).
func TestWaitAfterSlowRoundTrip(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rdb := bubbleClient(t)
				slow := &latencyHook{oneWay: 300 * time.Millisecond}
				rdb.AddHook(slow)
				lim := newLimiter(t, rdb, s, Limit{Rate: 10, Period: time.Second, Burst: 1})
				ctx := context.Background()
				require.NoError(t, lim.Wait(ctx, "k")) // 600 ms, measured
				slow.oneWay = 0
				for i := range 5 {
					short, cancel := context.WithTimeout(ctx, time.Second)
					err := lim.Wait(short, "k") // 100 ms per event
					cancel()
					require.NoError(t, err, "wait %d after the slow one", i)
				}
			})
		})
	}
}

// latencyHook delays every command by oneWay each way.
type latencyHook struct {
	passHooks
	oneWay time.Duration
}

func (h *latencyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(h.oneWay)
		err := next(ctx, cmd)
		time.Sleep(h.oneWay)
		return err
	}
}

// WaitN of 0 events returns at once, asking nothing of Redis: a leaky
// bucket whose next slot is 600 ms away (which AllowN(ctx, key, 0) reports
// as its Delay) does not make it sleep; a done ctx gives ctx's error.
func TestWaitZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		observe, calls := countCalls()
		lim := newLimiter(t, bubbleClient(t), LeakyBucket, Limit{Rate: 5, Period: time.Second, Burst: 3}, observe)
		ctx := t.Context()
		res, err := lim.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		peek, err := lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 600*time.Millisecond, peek.Delay, "the next slot, after the 3 taken")
		before := calls.Load()

		start := time.Now()
		require.NoError(t, lim.WaitN(ctx, "k", 0))
		assert.Zero(t, time.Since(start), "WaitN(0) slept")
		assert.Equal(t, before, calls.Load(), "WaitN(0) asked Redis")

		canceled, cancel := context.WithCancel(ctx)
		cancel()
		assert.ErrorIs(t, lim.WaitN(canceled, "k", 0), context.Canceled)
		assert.ErrorIs(t, lim.WaitN(ctx, "k", -1), ErrInvalidArgument, "n is still checked")

		after, err := lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, peek, after, "nothing taken")
	})
}
