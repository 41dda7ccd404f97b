package redlimit

import "github.com/redis/go-redis/v9"

// NewTokenBucket returns a limiter with a bucket of limit.Burst tokens (Rate
// when Burst is 0), refilled continuously at Rate tokens per Period, and
// full when first used. Each event takes a token. It allows bursts of up to
// Burst events, then a steady Rate per Period.
//
// It keeps one Redis string per key (the time at which the bucket is full
// again, the GCRA form of a token bucket) that expires when the bucket is
// full, and writes only when it admits.
func NewTokenBucket(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(TokenBucket, rdb, limit, opts)
}
