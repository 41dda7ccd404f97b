package redlimit

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/clientclock"
)

// epoch0 anchors the process's monotonic clock, monoNow.
var epoch0 = time.Now()

// monoNow reads the process's monotonic clock: ns since epoch0. Redis's
// answers, the stand-ins and the prefetches keep their times on it.
func monoNow() int64 { return int64(time.Since(epoch0)) }

// clientClock is the client clock of WithClientClock, corrected to the
// server's (see internal/clientclock).
type clientClock = clientclock.Clock

// newClientClock returns the client clock of a limiter on rdb whose clock
// reads now; after the limiter's Close, its errors wrap ErrClosed.
func newClientClock(rdb redis.UniversalClient, now func() time.Time) *clientClock {
	return clientclock.New(rdb, now, ErrClosed)
}
