package redlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithClientClock makes the limiter pass the time to its scripts instead of
// reading the Redis server's TIME inside them. Use it only for servers that
// refuse TIME in a script ("This Redis command is not allowed from script":
// AWS ElastiCache Serverless, and some proxies); everywhere else the
// default, the server's clock, is exact and needs nothing.
//
// Client clocks disagree across a fleet, so the limiter does not send its
// own clock as it is: it measures the offset of its clock to the server's
// with the plain TIME command (allowed where the in-script one is not),
// Cristian's method, before its first decision, again every
// [ClockResyncInterval], and after Redis comes back from an outage. Every
// instance then sends the server's time to within half a round trip plus
// the drift since the last measurement, so instances whose clocks are off
// by seconds still share one limit. Time sent by one limiter never goes
// backwards.
//
// Accuracy: with the server's clock (the default), every decision uses the
// one clock, exact to the µs. With WithClientClock, instances may disagree
// by up to about one round trip (typically under a millisecond): a bucket
// may admit up to Rate × that much more or less, a window's edge moves by
// that much. Clusters: TIME is asked of the node the command goes to; the
// nodes' clocks should agree (NTP) as they do for key expiry.
func WithClientClock() Option {
	return optionFunc(func(c *config) { c.clientClock = true })
}

// ClockResyncInterval is how often a limiter with [WithClientClock]
// measures its clock's offset to the Redis server's again.
const ClockResyncInterval = 10 * time.Second

// withClock sets the clock a client-clock limiter reads (tests).
func withClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}

// clientClock is the client clock of WithClientClock, corrected to the
// server's.
type clientClock struct {
	rdb redis.UniversalClient
	now func() time.Time

	offset   atomic.Int64 // server minus client, µs
	measured atomic.Int64 // when it was measured, on now (unix µs); 0: never
	last     atomic.Int64 // the last time sent, µs
	mu       sync.Mutex   // one measurement at a time
}

func newClientClock(rdb redis.UniversalClient, now func() time.Time) *clientClock {
	return &clientClock{rdb: rdb, now: now}
}

// stale makes the next call measure the offset again (after an outage: the
// server may have restarted on another machine).
func (c *clientClock) stale() { c.measured.Store(0) }

// nowMicros returns the server's time in µs, estimated from the client's
// clock and the measured offset, never less than what it returned before.
func (c *clientClock) nowMicros(ctx context.Context) (int64, error) {
	local := c.now().UnixMicro()
	at := c.measured.Load()
	if at == 0 || local-at > int64(ClockResyncInterval/time.Microsecond) || local < at {
		if err := c.measure(ctx, at == 0); err != nil {
			return 0, err
		}
		local = c.now().UnixMicro()
	}
	t := local + c.offset.Load()
	for {
		last := c.last.Load()
		if t <= last {
			return last, nil
		}
		if c.last.CompareAndSwap(last, t) {
			return t, nil
		}
	}
}

// measure reads the server's TIME and sets the offset (Cristian's method:
// the server's answer is taken to be from the middle of the round trip).
// Without a measurement yet (must), the caller waits for one; else one
// caller measures while the others go on with the old offset.
func (c *clientClock) measure(ctx context.Context, must bool) error {
	if must {
		c.mu.Lock()
	} else if !c.mu.TryLock() {
		return nil
	}
	defer c.mu.Unlock()
	if must && c.measured.Load() != 0 {
		return nil // measured by another caller meanwhile
	}
	before := c.now()
	srv, err := c.rdb.Time(ctx).Result()
	if err != nil {
		if must {
			return fmt.Errorf("redlimit: client clock: TIME: %w", err)
		}
		return nil // keep the old offset; the next call tries again
	}
	after := c.now()
	mid := before.UnixMicro() + after.Sub(before).Microseconds()/2
	c.offset.Store(srv.UnixMicro() - mid)
	c.measured.Store(after.UnixMicro())
	return nil
}
