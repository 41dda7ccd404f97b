package redlimit

import "github.com/redis/go-redis/v9"

// leakyBucket is the leaky bucket: capacity is Burst, and admitted events
// get a Delay.
var leakyBucket = &algorithm{strategy: LeakyBucket, code: "lb", maxRate: MaxRate, bucket: true, queue: true}

// NewLeakyBucket returns a limiter that works as a queue draining one event
// every T = limit.Period / limit.Rate. An admitted event gets the next free
// slot, and Result.Delay says how long the caller should wait before acting
// so that the output keeps the leak rate. The queue holds at most
// limit.Burst events (Rate when Burst is 0), counting the one being served:
// an instant burst gets Delays 0, T, ..., (Burst-1)×T and the next is denied
// with RetryAfter T. Burst 1 means strict spacing with no queue.
//
// AllowN(n) takes n consecutive slots; Delay is the wait for the first, and
// the last runs at Delay + (n-1)×T. Wait and WaitN sleep for Delay before
// they return, and never take a slot that they could not wait for before
// ctx's deadline.
//
// It keeps one Redis string per key, the queue's length in exact integers
// (the token bucket's state, see scripts/bucket.lua), and writes only when
// it admits.
//
// With limit.WarmUp, a cold key's queue drains at Rate/3 at first and at
// Rate after WarmUp of steady use (see Limit.WarmUp and docs/warmup.md).
func NewLeakyBucket(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(LeakyBucket, rdb, limit, opts)
}
