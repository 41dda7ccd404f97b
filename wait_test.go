package redlimit

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
					if err := lim.Wait(ctx, "k"); err != nil {
						t.Fatal(err)
					}
				}
				calls.Store(0)
				start := time.Now()
				if err := lim.Wait(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				waited := time.Since(start)
				want := map[Strategy]time.Duration{
					FixedWindow:    time.Second,             // the next window
					SlidingLog:     time.Second,             // the first event leaves
					SlidingCounter: 1500 * time.Millisecond, // half-way through the next window the 2 weigh 1
					TokenBucket:    500 * time.Millisecond,  // one token
					LeakyBucket:    500 * time.Millisecond,  // the second Wait slept until 500ms; the next slot is at 1s
				}[s]
				if waited != want {
					t.Errorf("Wait took %v, want %v", waited, want)
				}
				if got := calls.Load(); got > 2 {
					t.Errorf("Wait asked Redis %d times, want at most 2 (denied, then allowed)", got)
				}
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
				if err := lim.Wait(context.Background(), "k"); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				err := lim.Wait(ctx, "k")
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Wait = %v, want an error wrapping context.DeadlineExceeded", err)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("Wait returned after %v, want at once", waited)
				}
				cancelled, cancel2 := context.WithCancel(context.Background())
				cancel2()
				if err := lim.Wait(cancelled, "k"); !errors.Is(err, context.Canceled) {
					t.Errorf("Wait on a cancelled context = %v", err)
				}
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
		if _, err := lim.AllowN(ctx, "k", 2); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		defer cancel()
		err := lim.Wait(short, "k") // its slot would be at 200ms
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want DeadlineExceeded", err)
		}
		res, err := lim.AllowN(ctx, "k", 0)
		if err != nil || res.Remaining != 1 {
			t.Fatalf("after the refused Wait: %+v, %v; want the slot still free (1 remaining)", res, err)
		}
		start := time.Now()
		if err := lim.Wait(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 200*time.Millisecond {
			t.Errorf("Wait slept %v, want the slot's delay of 200ms", waited)
		}
	})
}
