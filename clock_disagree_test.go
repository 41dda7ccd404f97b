package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepRig is a server whose clock steps between the first readings of two
// client-clock instances (a failover to a host whose clock is off). The
// instances' own clocks agree (client, no monotonic readings); TIME is
// answered from server by a hook on each instance's client, so that the
// step is exact on a real redis-server too; miniredis's clock, which its
// TTLs follow, is kept at server's.
type stepRig struct {
	client, server *simClock
	opts           func() *redis.Options
	mini           *miniredis.Miniredis // nil on a real redis-server
}

// realStepRig is a stepRig on a real redis-server.
func realStepRig(t *testing.T) *stepRig {
	s := realServer(t)
	return &stepRig{client: simAt(t0), server: simAt(t0), opts: func() *redis.Options { return steadyOptions(s.Addr) }}
}

// miniStepRig is a stepRig on miniredis.
func miniStepRig(t *testing.T) *stepRig {
	r := &stepRig{client: simAt(t0), server: simAt(t0)}
	r.mini = miniredis.RunT(t)
	r.mini.ClockTTL(true)
	r.mini.SetTime(t0)
	r.opts = func() *redis.Options { return &redis.Options{Addr: r.mini.Addr()} }
	return r
}

// rdb returns a client of its own whose TIME reads the rig's server clock.
func (r *stepRig) rdb(t *testing.T) redis.UniversalClient {
	rdb := redis.NewClient(r.opts())
	rdb.AddHook(timeAnswer{answer: func(context.Context) (time.Time, error) { return r.server.now(), nil }})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// stepServer moves the server's clock alone by d.
func (r *stepRig) stepServer(d time.Duration) {
	r.server.add(d)
	if r.mini != nil {
		r.mini.SetTime(r.server.now())
	}
}

// advance moves every clock by d.
func (r *stepRig) advance(d time.Duration) {
	r.client.add(d)
	r.stepServer(d)
}

// pair makes two instances with newInstance, the first measuring the server's
// time before the server's clock steps by step, the second after.
func pair[L any](t *testing.T, r *stepRig, step time.Duration, newInstance func(rdb redis.UniversalClient) (L, *clientClock)) [2]L {
	t.Helper()
	var ls [2]L
	for i := range ls {
		if i == 1 {
			r.stepServer(step)
		}
		var c *clientClock
		ls[i], c = newInstance(r.rdb(t))
		_, err := c.NowMicros(t.Context())
		require.NoError(t, err, "instance %d measures", i)
	}
	return ls
}

// clockSteps are the steps the scenarios try: forward (the first instance
// is behind) and back (it is ahead).
func clockSteps(unit time.Duration) []time.Duration { return []time.Duration{5 * unit, -5 * unit} }

// Two instances whose first readings of TIME straddle a step of the
// server's clock, calling a bucket of 10 per unit, Burst 10, in turns
// every unit/100 for one unit: together they admit what one clock would,
// plus at most one Burst (the refill between the two clocks, given once).
// (They admitted 200 of at most 19: the instance ahead was refilled by
// the whole step on every turn.)
func TestClientClockStepBucket(t *testing.T) { testClientClockStepBucket(t, miniStepRig, time.Second) }

// On a real redis-server the keys live one unit on the server's real
// clock: 5 s, longer than the test; shorter than clockResyncInterval,
// whose measurement would freeze the instance ahead (its time never goes
// back).
func TestClientClockStepBucketRedis(t *testing.T) {
	testClientClockStepBucket(t, realStepRig, 5*time.Second)
}

func testClientClockStepBucket(t *testing.T, rig func(*testing.T) *stepRig, unit time.Duration) {
	limit := Limit{Rate: 10, Period: unit, Burst: 10}
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		// What one clock admits: both instances measure the same time.
		oneClock := 0
		for _, step := range append([]time.Duration{0}, clockSteps(unit)...) {
			t.Run(fmt.Sprintf("%v/step %v", s, step), func(t *testing.T) {
				r := rig(t)
				prefix := prefixFor(t)
				lims := pair(t, r, step, func(rdb redis.UniversalClient) (*RateLimiter, *clientClock) {
					lim := newLimiter(t, rdb, s, limit, WithPrefix(prefix), WithClientClock(), withClock(r.client.now))
					return lim, lim.clock
				})
				admitted := 0
				for range 100 {
					for _, lim := range lims {
						res, err := lim.Allow(t.Context(), "k")
						require.NoError(t, err)
						require.False(t, res.Degraded)
						admitted += btoi(res.Allowed)
					}
					r.advance(unit / 100)
				}
				if step == 0 {
					oneClock = admitted
					assert.Equal(t, 19, admitted, "one clock: 10, and 9.9 refilled")
					return
				}
				t.Logf("admitted %d; one clock admits %d", admitted, oneClock)
				assert.LessOrEqual(t, admitted, oneClock+limit.Burst, "two clocks 5 units apart admit what one would, plus one Burst")
			})
		}
	}
}

// The same step on a concurrency limit of 2, ttl one unit, the instances
// acquiring in turns every unit/100 for 1.5 units and never releasing:
// never more than 2 leases held at once (a lease is held from its grant
// for ttl). (4 were: the instance ahead pruned the other's live leases as
// expired.) On a real redis-server the key's time runs on its real clock,
// the instances' faster: no lease expires during the test.
func TestClientClockStepConcurrency(t *testing.T) {
	testClientClockStepConcurrency(t, miniStepRig, time.Second)
}

// (A minute: the lease set lives on the server's real clock.)
func TestClientClockStepConcurrencyRedis(t *testing.T) {
	testClientClockStepConcurrency(t, realStepRig, time.Minute)
}

func testClientClockStepConcurrency(t *testing.T, rig func(*testing.T) *stepRig, unit time.Duration) {
	for _, step := range clockSteps(unit) {
		t.Run(fmt.Sprintf("step %v", step), func(t *testing.T) {
			r := rig(t)
			prefix := prefixFor(t)
			cs := pair(t, r, step, func(rdb redis.UniversalClient) (*Concurrency, *clientClock) {
				c, err := NewConcurrency(rdb, 2, unit, WithPrefix(prefix), WithClientClock(), withClock(r.client.now))
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				return c, c.e.clock
			})
			var grants []time.Duration // since the first call, on the instances' clock
			most, at := 0, time.Duration(0)
			for range 150 {
				for _, c := range cs {
					l, res, err := c.TryAcquire(t.Context(), "k")
					require.NoError(t, err)
					require.False(t, res.Degraded)
					if l == nil {
						continue
					}
					grants = append(grants, at)
					held := 0
					for _, g := range grants {
						if g+unit > at {
							held++
						}
					}
					most = max(most, held)
				}
				r.advance(unit / 100)
				at += unit / 100
			}
			t.Logf("grants at %v", grants)
			assert.Equal(t, 2, most, "leases held at once, of at most 2")
		})
	}
}

// A token bucket at 1000/s, Burst 100, uses 100 tokens; a limiter of the
// same key at 10/s (a plan downgraded) looks at 0.999 s: 9 remaining. At
// 1.001 s it admits 10, what it refilled, not 100: its look kept the state
// alive for its own refill time. The same for a denial instead of a look.
// (The key expired with the fast limiter's TTL, one period: 100 admitted.)
func TestLoweredRateKeepsUsed(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, look := range []int{0, 100} { // a look, a denial
			t.Run(fmt.Sprintf("%v/n=%d", s, look), func(t *testing.T) {
				b, _ := miniBackend(t)
				fast, slow := loweredPair(t, b, s, time.Second)
				ctx := t.Context()
				res, err := fast.AllowN(ctx, "k", 100)
				require.NoError(t, err)
				require.True(t, res.Allowed)
				b.advance(999 * time.Millisecond)
				res, err = slow.AllowN(ctx, "k", look)
				require.NoError(t, err)
				require.Equal(t, look == 0, res.Allowed)
				require.Equal(t, 9, res.Remaining, "the slow limiter's look at 0.999 s")
				b.advance(2 * time.Millisecond)
				assert.Equal(t, 10, allowedOf(t, slow, "k", 100), "admitted at 1.001 s, of 100 asked one by one")
			})
		}
	}
}

// The same on a real redis-server, whose TTLs run on its real clock: the
// look at 0.5 s, the calls after 1.02 s (past the fast limiter's TTL); the
// counts are bracketed by the time the calls took, and may be one less:
// the state keeps its time to the ms, with D as of the ms's start at the
// writer's rate, up to a token of 1000/s.
func TestLoweredRateKeepsUsedRedis(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, look := range []int{0, 100} {
			t.Run(fmt.Sprintf("%v/n=%d", s, look), func(t *testing.T) {
				b := realBackend(t)
				fast, slow := loweredPair(t, b, s, time.Second)
				ctx := t.Context()
				// refilled is what 10/s refills between the first call's
				// start and now: bounds on what the slow limiter sees.
				start := time.Now()
				res, err := fast.AllowN(ctx, "k", 100)
				end := time.Now()
				require.NoError(t, err)
				require.True(t, res.Allowed)
				refilled := func(from time.Time) int { return int(time.Since(from) / (100 * time.Millisecond)) }
				time.Sleep(500*time.Millisecond - time.Since(start))
				lo := refilled(end) - 1
				res, err = slow.AllowN(ctx, "k", look)
				hi := refilled(start)
				require.NoError(t, err)
				require.Equal(t, look == 0, res.Allowed)
				require.True(t, lo <= res.Remaining && res.Remaining <= hi, "the look at 0.5 s: %d remaining, want %d to %d", res.Remaining, lo, hi)
				time.Sleep(1020*time.Millisecond - time.Since(start))
				lo = refilled(end) - 1
				got := allowedOf(t, slow, "k", 100)
				hi = refilled(start)
				assert.True(t, lo <= got && got <= hi, "admitted after 1.02 s: %d of 100 asked one by one, want %d to %d", got, lo, hi)
			})
		}
	}
}

// loweredPair returns two limiters of s on one key: 1000 and 10 per
// period, Burst 100.
func loweredPair(t *testing.T, b *backend, s Strategy, period time.Duration) (fast, slow *RateLimiter) {
	prefix := prefixFor(t)
	fast = newLimiter(t, b.rdb, s, Limit{Rate: 1000, Period: period, Burst: 100}, WithPrefix(prefix))
	slow = newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: period, Burst: 100}, WithPrefix(prefix))
	return fast, slow
}

// With a client clock, releasing the latest lease of a set whose other
// leases have expired (a crashed holder's) leaves no lease live: max 2,
// ttl 1 min, X taken at 0 and never released, Y at 10 s released at
// 65 s: at 66 s both slots are free. (The set's expiry was left at Y's,
// which put the key's time 10 s early: X counted again until 70 s, and 1
// of 2 was granted.)
func TestClientClockReleaseLatest(t *testing.T) {
	r := miniStepRig(t)
	rdb := r.rdb(t)
	c, err := NewConcurrency(rdb, 2, time.Minute, WithPrefix(prefixFor(t)), WithClientClock(), withClock(r.client.now))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	x, _, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.NotNil(t, x)
	r.advance(10 * time.Second)
	y, _, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.NotNil(t, y)
	r.advance(55 * time.Second)
	require.NoError(t, y.Release(ctx))
	r.advance(time.Second)
	granted := 0
	for range 2 {
		l, res, err := c.TryAcquire(ctx, "k")
		require.NoError(t, err)
		require.False(t, res.Degraded)
		if l != nil {
			granted++
		}
	}
	assert.Equal(t, 2, granted, "leases granted at 66 s, of 2 free slots")
}
