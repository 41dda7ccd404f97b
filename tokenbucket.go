package redlimit

import "github.com/redis/go-redis/v9"

// tokenBucket is the token bucket: capacity is Burst.
var tokenBucket = &algorithm{strategy: TokenBucket, code: "tb", maxRate: MaxRate, bucket: true}

// NewTokenBucket returns a limiter with a bucket of limit.Burst tokens (Rate
// when Burst is 0), refilled continuously at Rate tokens per Period, and
// full when first used. Each event takes a token. It allows bursts of up to
// Burst events, then a steady Rate per Period.
//
// It keeps one Redis string per key, the tokens used in exact integers
// (see scripts/bucket.lua), that expires when the bucket is full again (at
// least one Period after the last write), and writes only when it admits.
// Any Limit the other strategies accept works, up to MaxRate per Period: at
// 1e9 bytes per second it is exact to the byte. Limiters that differ only in
// Rate or Burst share the state and keep the tokens used.
//
// With limit.WarmUp, a cold key starts at Rate/3 and reaches Rate after
// WarmUp of steady use, and the bucket never bursts (see Limit.WarmUp and
// docs/warmup.md).
func NewTokenBucket(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(TokenBucket, rdb, limit, opts)
}
