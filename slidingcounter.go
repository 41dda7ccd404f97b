package redlimit

import "github.com/redis/go-redis/v9"

// slidingCounter is the sliding counter: two packed window counts.
var slidingCounter = &algorithm{strategy: SlidingCounter, code: "sc", maxRate: MaxRate}

// NewSlidingCounter returns a limiter that approximates the sliding log in
// constant memory: the estimate for the last Period is the previous aligned
// window's count, weighted by how much of that window still overlaps the
// interval, plus the current window's count; n events are admitted if the
// estimate plus n is at most limit.Rate. Burst is ignored.
//
// The estimate assumes the previous window's events were spread evenly, so
// it can admit a little more or less than the exact log when they were not;
// it never admits more than 2×Rate in any Period. It keeps one Redis
// string per key (the two counts packed in one integer) and writes only
// when it admits.
func NewSlidingCounter(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(SlidingCounter, rdb, limit, opts)
}
