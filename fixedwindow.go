package redlimit

import "github.com/redis/go-redis/v9"

// fixedWindow is the fixed window: a counter per aligned window.
var fixedWindow = &algorithm{strategy: FixedWindow, code: "fw", maxRate: MaxRate}

// NewFixedWindow returns a limiter that allows at most limit.Rate events in
// each window of limit.Period, windows aligned to multiples of Period since
// the Unix epoch on the Redis server's clock, or the windows of a calendar
// in a time zone for a calendar limit ([Daily], [Weekly], [Monthly]).
// RetryAfter and ResetAfter run until the window ends. Burst is ignored.
//
// It keeps one Redis string per key (a counter, expiring at the window's
// end) and writes only when it admits. Its weakness is the window edge: a
// client can get Rate events at the end of one window and Rate more at the
// start of the next, 2×Rate within a short time.
func NewFixedWindow(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(FixedWindow, rdb, limit, opts)
}
