package redlimit

import "github.com/redis/go-redis/v9"

// MaxSlidingLogRate is the largest Rate a SlidingLog limiter accepts: it
// keeps one sorted-set member per admitted event (about 36 bytes of Redis
// memory each up to 128 events, about 120 past that: see the README), so
// a key at its limit holds Rate of them. A larger Rate is an error wrapping
// ErrInvalidLimit.
const MaxSlidingLogRate = 100_000

// NewSlidingLog returns a limiter that allows at most limit.Rate events in
// any interval of length limit.Period: exact, with no window edge. Burst is
// ignored, and Rate is at most [MaxSlidingLogRate].
//
// It keeps a Redis sorted set per key with one member per admitted event,
// so its memory grows with Rate; prefer SlidingCounter when Rate is large.
// Denials write nothing.
func NewSlidingLog(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(SlidingLog, rdb, limit, opts)
}
