package redlimit

import (
	"testing"
	"time"
)

func TestLeakyBucketTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 3})
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 2, reset: 100 * ms},
		{n: 1, allowed: true, remaining: 1, reset: 200 * ms, delay: 100 * ms},
		{n: 1, allowed: true, remaining: 0, reset: 300 * ms, delay: 200 * ms},
		{n: 1, allowed: false, remaining: 0, retry: 100 * ms, reset: 300 * ms},
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: 300 * ms, delay: 200 * ms},
		{advance: 50 * ms, n: 0, allowed: true, remaining: 0, reset: 250 * ms, delay: 250 * ms},
		{advance: 50 * ms, n: 0, allowed: true, remaining: 1, reset: 200 * ms, delay: 200 * ms},
		// AllowN takes consecutive slots; Delay is the wait for the first.
		{advance: time.Second, n: 2, allowed: true, remaining: 1, reset: 200 * ms},
		{n: 2, allowed: false, remaining: 1, retry: 100 * ms, reset: 200 * ms},
		{n: 1, allowed: true, remaining: 0, reset: 300 * ms, delay: 200 * ms},
	})
}

func TestLeakyBucketStrictSpacing(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 1})
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 0, reset: 100 * ms},
		{n: 1, allowed: false, remaining: 0, retry: 100 * ms, reset: 100 * ms},
		{advance: 99 * ms, n: 1, allowed: false, remaining: 0, retry: ms, reset: ms},
		{advance: ms, n: 1, allowed: true, remaining: 0, reset: 100 * ms},
	})
}
