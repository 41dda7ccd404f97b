package redlimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testlane"
)

func TestSlidingCounterTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingCounter, PerSecond(10))
	ms, us := time.Millisecond, time.Microsecond
	run(t, b, lim, "k", []step{
		{n: 6, allowed: true, remaining: 4, reset: 2 * time.Second},
		// Half-way through the next window, the 6 weigh 3.
		{advance: 1500 * ms, n: 0, allowed: true, remaining: 7, reset: 500 * ms},
		{n: 7, allowed: true, remaining: 0, reset: 1500 * ms},
		// Room for 1 when 6×(1s-e) <= 2s, that is at e = 666667µs.
		{n: 1, allowed: false, remaining: 0, retry: 166667 * us, reset: 1500 * ms},
		// 4 more do not fit this window (7+4 > 10): in the next one the 7
		// must weigh at most 6, at e = 142858µs.
		{n: 4, allowed: false, remaining: 0, retry: 642858 * us, reset: 1500 * ms},
		{advance: 166666 * us, n: 1, allowed: false, remaining: 0, retry: us, reset: 1333334 * us},
		{advance: us, n: 1, allowed: true, remaining: 0, reset: 1333333 * us},
		// Two windows later, nothing weighs.
		{advance: 3 * time.Second, n: 10, allowed: true, remaining: 0, reset: 1333333 * us},
	})
}

// Counts of 2^26 and more do not fit the packed integer: they are kept as
// text, with the same arithmetic.
func TestSlidingCounterLargeCounts(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingCounter, Limit{Rate: 1_000_000_000, Period: time.Second})
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 600_000_000, allowed: true, remaining: 400_000_000, reset: 2 * time.Second},
		{advance: 1500 * ms, n: 0, allowed: true, remaining: 700_000_000, reset: 500 * ms},
		{n: 700_000_000, allowed: true, remaining: 0, reset: 1500 * ms},
		{n: 1, allowed: false, remaining: 0, retry: time.Microsecond, reset: 1500 * ms},
	})
	v, err := b.rdb.Get(t.Context(), lim.stateKey("k")).Result()
	require.NoError(t, err, "stored %q, %v; want the counts as text", v, err)
	// c:p:w, w the window index (t0 + 1.5s, in whole seconds).
	require.Equal(t, fmt.Sprintf("700000000:600000000:%d", t0.Unix()+1), v, "stored %q; want the counts as text", v)
}

// Issue 10, item 9: the sliding counter under-admits at small rates. Its
// estimate rounds the previous window's weighted count up (never over the
// limit), so a steady caller gets about half of a Rate of 1, and 92% of a
// Rate of 10, in 10 periods. This table is in the README; small limits
// should use the sliding log, which is exact.
func TestSlidingCounterSmallRates(t *testing.T) {
	testlane.MarkHeavy(t)
	t.Parallel() // its own miniredis and clock: the heavy lane runs its tests on both cores
	cases := []struct {
		rate     int
		min, max int // admitted in 10 periods, one call every period/20
	}{
		{1, 5, 6},
		{10, 90, 95},
	}
	for _, c := range cases {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, SlidingCounter, PerSecond(c.rate))
		log := newLimiter(t, b.rdb, SlidingLog, PerSecond(c.rate), WithPrefix("log"))
		ctx := t.Context()
		admitted, exact := 0, 0
		step := time.Second / time.Duration(20*c.rate)
		for range 200 * c.rate {
			for range 2 { // offered at twice the rate
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				admitted += btoi(res.Allowed)
				res, err = log.Allow(ctx, "k")
				require.NoError(t, err)
				exact += btoi(res.Allowed)
			}
			b.advance(step)
		}
		t.Logf("rate %d/s over 10s: sliding counter %d, sliding log %d", c.rate, admitted, exact)
		assert.GreaterOrEqual(t, admitted, c.min, "rate %d", c.rate)
		assert.LessOrEqual(t, admitted, c.max, "rate %d", c.rate)
		assert.Equal(t, 10*c.rate, exact, "the sliding log is exact")
	}
}
