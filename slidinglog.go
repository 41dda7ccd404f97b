package redlimit

import "github.com/redis/go-redis/v9"

// slidingLog is the sliding log: one sorted-set member per admitted
// event, so Rate is bounded.
var slidingLog = &algorithm{strategy: SlidingLog, code: "sl", maxRate: MaxSlidingLogRate}

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

// MaxSlidingLogN is the most events one SlidingLog call may ask for: each
// event is a sorted-set member written by the script, so n bounds the time
// one call holds Redis (1,000 members take about 1.5 ms; 100,000 took 142
// ms, past the 100 ms timeouts recommended for a limiter's client). Larger
// n is an error wrapping ErrInvalidArgument; weigh calls with a
// SlidingCounter or a bucket instead. A Policy with several sliding-log
// rules writes n members in each, so there the bound is on n times their
// number (a 16-rule policy wrote 16,000 members, 29 ms, in one call). A
// settle charges a log at most as many (see [Reservation.Settle]).
const MaxSlidingLogN = 1000
