package redlimit

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSlidingLogTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, PerSecond(3))
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 0, allowed: true, remaining: 3},
		{n: 1, allowed: true, remaining: 2, reset: time.Second},                    // event at 0
		{advance: 100 * ms, n: 1, allowed: true, remaining: 1, reset: time.Second}, // at 100ms
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 200ms
		// The event at 0 leaves at 1s.
		{advance: 100 * ms, n: 1, allowed: false, remaining: 0, retry: 700 * ms, reset: 900 * ms},
		// Two more need the events at 0 and 100ms gone: until 1.1s.
		{n: 2, allowed: false, remaining: 0, retry: 800 * ms, reset: 900 * ms},
		{advance: 700 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 1s
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 1.1s
		{n: 1, allowed: false, remaining: 0, retry: 100 * ms, reset: time.Second},
		// Long idle: everything left the window.
		{advance: 5 * time.Second, n: 3, allowed: true, remaining: 0, reset: time.Second},
	})
}

// Two events in the same microsecond are two events.
func TestSlidingLogSameMicrosecond(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, PerSecond(10))
	ctx := t.Context()
	for range 3 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "Allow: %+v, %v", res, err)
		require.True(t, res.Allowed, "Allow: %+v, %v", res, err)
	}
	res, err := lim.AllowN(ctx, "k", 4)
	require.NoError(t, err, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	require.True(t, res.Allowed, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	require.Equal(t, 3, res.Remaining, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	n, err := b.rdb.ZCard(ctx, lim.stateKey("k")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "ZCARD = %d, want 7 members for 7 events in one microsecond", n)
	// An AllowN larger than one ZADD chunk (500 events) works too.
	big := newLimiter(t, b.rdb, SlidingLog, PerSecond(2000))
	for range 2 {
		_, err := big.AllowN(ctx, "big", MaxSlidingLogN)
		require.NoError(t, err, "AllowN(%d)", MaxSlidingLogN)
	}
	n, _ = b.rdb.ZCard(ctx, big.stateKey("big")).Result()
	require.Equal(t, int64(2*MaxSlidingLogN), n, "ZCARD = %d, want %d", n, 2*MaxSlidingLogN)
	// More than MaxSlidingLogN in one call is refused, and writes nothing.
	_, err = big.AllowN(ctx, "other", MaxSlidingLogN+1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	n, _ = b.rdb.Exists(ctx, big.stateKey("other")).Result()
	require.Zero(t, n, "a refused AllowN wrote its key")
}

// After a lowered limit the log holds more events than the new rate: a
// denial's RetryAfter is when enough of them have left for n more (the
// (count+n-rate)-th oldest), exactly, on miniredis's clock.
func TestSlidingLogLoweredLimit(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	high := newLimiter(t, b.rdb, SlidingLog, PerMinute(1000), WithPrefix("lowered"))
	for range 100 { // events at 0, 1ms, ..., 99ms
		res, err := high.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
		b.advance(time.Millisecond)
	}
	// Now 100ms; the same log under a rate of 10 holds 100 events.
	low := newLimiter(t, b.rdb, SlidingLog, PerMinute(10), WithPrefix("lowered"))
	for _, n := range []int{1, 3, 10} {
		// count + n - rate = 90 + n: the event of (89 + n) ms must leave,
		// at (89 + n) ms + 1 min.
		want := time.Minute + time.Duration(89+n)*time.Millisecond - 100*time.Millisecond
		res, err := low.AllowN(ctx, "k", n)
		require.NoError(t, err)
		assert.False(t, res.Allowed, "n=%d: %+v", n, res)
		assert.Equal(t, want, res.RetryAfter, "n=%d: %+v", n, res)
	}
	b.advance(time.Minute + 89*time.Millisecond + time.Millisecond - 100*time.Millisecond - time.Microsecond)
	res, err := low.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "1 µs before RetryAfter: %+v", res)
	b.advance(time.Microsecond)
	res, err = low.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "at RetryAfter: %+v", res)
}

// A denial's cost in Redis does not grow with how far the log is over a
// lowered limit: it finds the event that must leave by rank, not by
// walking past the events before it. (It walked them: with 100,000 events
// over the limit each denial held Redis for about 0.6 ms.) Real Redis: its
// sorted sets are skiplists past 128 members, miniredis's are not.
func TestSlidingLogLoweredLimitCostRedis(t *testing.T) {
	b := realBackend(t)
	rdb := b.rdb.(*redis.Client)
	ctx := t.Context()
	high := newLimiter(t, rdb, SlidingLog, PerHour(MaxSlidingLogRate), WithPrefix(prefixFor(t)))
	low := newLimiter(t, rdb, SlidingLog, PerHour(10), WithPrefix(prefixFor(t)))
	for range MaxSlidingLogRate / MaxSlidingLogN {
		_, err := high.AllowN(ctx, "big", MaxSlidingLogN)
		require.NoError(t, err)
	}
	for range 10 {
		_, err := high.Allow(ctx, "small")
		require.NoError(t, err)
	}
	_, err := low.AllowN(ctx, "warm", 0) // loads its script
	require.NoError(t, err)
	// Redis's own µs per denial (INFO commandstats, scripts or functions),
	// on a log 10 over the limit and on one 99,990 over it: the least of
	// five blocks of 20, taken in turn, so that a moment when the machine
	// preempts Redis does not decide.
	perCall := func(key string) float64 {
		require.NoError(t, rdb.ConfigResetStat(ctx).Err())
		for range 20 {
			res, err := low.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, res.Allowed, "%s: %+v", key, res)
		}
		usec, calls := scriptStats(t, rdb)
		require.Equal(t, 20, calls, "script calls")
		return float64(usec) / float64(calls)
	}
	small, big := math.Inf(1), math.Inf(1)
	for range 5 {
		small = min(small, perCall("small"))
		big = min(big, perCall("big"))
	}
	t.Logf("Redis µs per denial: %.1f with 10 events in the log, %.1f with 100,000", small, big)
	assert.Less(t, big, 3*small+20, "a denial on a log far over the limit costs Redis %.1f µs, against %.1f", big, small)
}

// A policy writes n members in each of its sliding logs: n times their
// number is at most MaxSlidingLogN, for AllowN (a larger n is refused) and
// for what Settle adds (a larger charge is cut to it).
func TestPolicySlidingLogsBoundN(t *testing.T) {
	b, m := miniBackend(t)
	ctx := t.Context()
	rules := make([]Rule, 4)
	for i := range rules {
		rules[i] = Rule{Strategy: SlidingLog, Limit: Limit{Rate: 10_000, Period: time.Duration(i+1) * time.Minute}}
	}
	p := newPolicy(t, b.rdb, rules, WithPrefix("logs"))
	each := MaxSlidingLogN / len(rules)
	_, err := p.AllowN(ctx, "k", each+1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Empty(t, m.Keys(), "a refused call wrote")
	res, err := p.AllowN(ctx, "k", each)
	require.NoError(t, err)
	require.True(t, res.Allowed, "%+v", res)
	rv, err := p.Reserve(ctx, "k", 1)
	require.NoError(t, err)
	// Settle writes min(used-n, Rate) entries in each log, at most each:
	// from the reservation of 1, a used of each+2 writes each, not each+1.
	_, err = rv.Settle(ctx, each+2)
	require.NoError(t, err)
	for i := range rules {
		got, err := b.rdb.ZCard(ctx, p.stateKey("k", &p.own.rules[i])).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(2*each+1), got, "log %d: the call's %d, the reservation's 1 and the charge's %d", i, each, each)
	}
	// A policy with one sliding log among other rules keeps the whole bound.
	one := newPolicy(t, b.rdb, []Rule{
		{Strategy: SlidingLog, Limit: Limit{Rate: 10_000, Period: time.Minute}},
		{Strategy: SlidingCounter, Limit: Limit{Rate: 10_000, Period: time.Minute}},
	}, WithPrefix("one"))
	_, err = one.AllowN(ctx, "k", MaxSlidingLogN)
	require.NoError(t, err)
}

// Settles that charge past the limit again and again leave the log at no
// more than rate entries, and decide as before: the key is denied until
// the newest charge leaves the window. (Each used to add up to rate more:
// 1,000 settles of 1,000 on 1,000 an hour left a million entries.)
func TestSlidingLogChargesKeepRateEntries(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	const rate = 100
	lim := newLimiter(t, b.rdb, SlidingLog, PerHour(rate), WithPrefix("charges"))
	var rvs []*Reservation
	for range rate {
		rv, err := lim.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, rv.Result().Allowed)
		rvs = append(rvs, rv)
		b.advance(time.Millisecond)
	}
	for _, rv := range rvs {
		_, err := rv.Settle(ctx, rate)
		require.NoError(t, err)
		b.advance(time.Millisecond)
	}
	n, err := b.rdb.ZCard(ctx, lim.stateKey("k")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, n, int64(rate), "entries after %d settles charging %d each", rate, rate-1)
	// The window's newest 100 entries: the last settle's 99, 1 ms ago,
	// and one of the settle before, 2 ms ago, which must leave first.
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "%+v", res)
	assert.Equal(t, time.Hour-2*time.Millisecond, res.RetryAfter, "%+v", res)
}

// A charge settled at a lower Rate keeps the entries that a larger Rate on
// the same state still counts (after a plan upgrade): trimmed to the
// reservation's 10, the 100-a-minute plan lost 90 and admitted 90 more in
// the same minute.
func TestSlidingLogChargeKeepsLargerRate(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	var rate atomic.Int64
	rate.Store(10)
	lim := newLimiter(t, b.rdb, SlidingLog, PerMinute(10), WithLimitFunc(func(context.Context, string) (Limit, error) {
		return PerMinute(int(rate.Load())), nil
	}))
	rv, err := lim.Reserve(ctx, "k", 5) // the free plan: 10 a minute
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	rate.Store(100) // upgraded
	b.advance(time.Second)
	res, err := lim.AllowN(ctx, "k", 95)
	require.NoError(t, err)
	require.True(t, res.Allowed, "%+v", res)
	b.advance(time.Second)
	_, err = rv.Settle(ctx, 6) // one more than reserved: 101 used
	require.NoError(t, err)
	b.advance(time.Second)
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "101 used in 3 s under 100 a minute: %+v", res)
	n, err := b.rdb.ZCount(ctx, lim.stateKey("k"), "-inf", "+inf").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(100), "the log kept what the window held before the charge (the charge's 1 may go)")
}

// Events that leave the window together go at most 2n + 64 an admission,
// not all in one call; a steady log keeps fewer than 64 expired beyond
// the eighth of a period that a cell leaves.
func TestSlidingLogTrimBounded(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	lim := newLimiter(t, b.rdb, SlidingLog, PerMinute(MaxSlidingLogRate), WithPrefix("trim"))
	key := lim.stateKey("k")
	for range 20 {
		_, err := lim.AllowN(ctx, "k", MaxSlidingLogN)
		require.NoError(t, err)
	}
	// One more 30 s on keeps the key alive (its expiry is its newest
	// event's) when the 20,000 leave the window together, at 1 min.
	b.advance(30 * time.Second)
	_, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	b.advance(30*time.Second + time.Millisecond)
	card := func() int64 {
		n, err := b.rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		return n
	}
	want := int64(20*MaxSlidingLogN + 1)
	for range 5 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
		want += 1 - 66 // one added, 2n + 64 removed
		assert.Equal(t, want, card(), "entries after an admission")
	}

	// Steady: 100 a second for 3 s on a limit of 100 a second.
	steady := newLimiter(t, b.rdb, SlidingLog, PerSecond(100), WithPrefix("steady"))
	skey := steady.stateKey("k")
	most := int64(0)
	for range 300 {
		_, err := steady.Allow(ctx, "k")
		require.NoError(t, err)
		n, err := b.rdb.ZCard(ctx, skey).Result()
		require.NoError(t, err)
		most = max(most, n)
		b.advance(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, most, int64(100+13+64), "most entries of a steady log")
}

// The same on a real Redis, in Redis's time: the admission after 99,000
// events left the window together costs about what one on a small log
// does (it took 24.8 ms when the trim removed them all).
func TestSlidingLogTrimCostRedis(t *testing.T) {
	b := realBackend(t)
	rdb := b.rdb.(*redis.Client)
	ctx := t.Context()
	lim := newLimiter(t, rdb, SlidingLog, Limit{Rate: MaxSlidingLogRate, Period: 4 * time.Second}, WithPrefix(prefixFor(t)))
	for range MaxSlidingLogRate/MaxSlidingLogN - 1 { // room for one more
		res, err := lim.AllowN(ctx, "big", MaxSlidingLogN)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	_, err := lim.Allow(ctx, "small")
	require.NoError(t, err)
	// The big log's events leave its window together, and its key lives
	// on (its expiry is its newest event's) for 2 s: one more admission
	// 2 s on.
	time.Sleep(2 * time.Second)
	res, err := lim.Allow(ctx, "big")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	time.Sleep(2*time.Second + 100*time.Millisecond)
	// Redis's µs for each of the next 20 admissions on the big log (each
	// alone after a CONFIG RESETSTAT), and on the small one.
	costs := func(key string) (most float64) {
		for range 20 {
			require.NoError(t, rdb.ConfigResetStat(ctx).Err())
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%s: %+v", key, res)
			usec, calls := scriptStats(t, rdb)
			require.Equal(t, 1, calls)
			most = max(most, float64(usec))
		}
		return most
	}
	big := costs("big")
	small := costs("small")
	left, err := rdb.ZCard(ctx, lim.stateKey("big")).Result()
	require.NoError(t, err)
	t.Logf("Redis µs of the costliest of 20 admissions: %.0f on a small log, %.0f on one trimming 99,000 expired events (%d entries left)", small, big, left)
	// A one-off spike is what this looks for, so no least of several
	// blocks: 5 ms leaves room for a loaded machine; the trim of them all
	// took 20 ms or more.
	assert.Less(t, big, 5000.0, "an admission on a log with 99,000 expired events cost Redis %.0f µs (one on a small log %.0f)", big, small)
	assert.Greater(t, left, int64(90_000), "the expired events went at once")
}

// scriptStats returns the µs Redis spent in scripts and functions, and
// their calls, since the last CONFIG RESETSTAT (INFO commandstats).
func scriptStats(t *testing.T, rdb *redis.Client) (usec, calls int) {
	t.Helper()
	for _, cmd := range []string{"evalsha", "eval", "fcall"} {
		st := commandStats(t, rdb, cmd)
		usec += st["usec"]
		calls += st["calls"]
	}
	return usec, calls
}

// A sliding log's expiry covers every event of the millisecond that set it:
// an event admitted later in that millisecond skips PEXPIRE (the expiry
// is "the same, to the ms"), so the key must live until that millisecond's
// end plus Period, also where a key expires at exactly its write time plus
// PX, as miniredis does (Redis expires it at the end of that ms). A key
// that expired at its first write's time plus Period lost the events
// admitted after it in the same ms while they still counted: 11 admitted
// in 100 ms at 10/100ms (TestProperty seed 613).
func TestPropertyFoundSlidingLogExpiryCoversItsMs(t *testing.T) {
	for _, policy := range []bool{false, true} {
		b, _ := miniBackend(t)
		l := Limit{Rate: 10, Period: 100 * time.Millisecond}
		var lim Limiter = newLimiter(t, b.rdb, SlidingLog, l)
		if policy { // the rules passed as arguments: another path to the PX
			p, err := NewPolicy(b.rdb, []Rule{{Strategy: SlidingLog, Limit: l}, {Strategy: FixedWindow, Limit: PerHour(1000)}}, WithPrefix("p"))
			require.NoError(t, err)
			t.Cleanup(func() { p.Close() })
			lim = p
		}
		ctx := context.Background()
		res, err := lim.AllowN(ctx, "k", 8)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		b.advance(999 * time.Microsecond) // the same ms
		res, err = lim.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		// At 100 ms the 8 events of t=0 have left; the one of t=999µs
		// counts until 100.999 ms.
		b.advance(l.Period - 999*time.Microsecond)
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 9, res.Remaining, "policy %v: Remaining at 100 ms, with the event of 999 µs in the window", policy)
		b.advance(999 * time.Microsecond)
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 10, res.Remaining, "policy %v: Remaining at 100.999 ms", policy)
	}
}

// The same where an overspend's entries set the expiry (settle.lua).
func TestPropertyFoundSlidingLogSettleExpiryCoversItsMs(t *testing.T) {
	b, _ := miniBackend(t)
	l := Limit{Rate: 10, Period: 100 * time.Millisecond}
	lim := newLimiter(t, b.rdb, SlidingLog, l)
	ctx := context.Background()
	rv, err := lim.Reserve(ctx, "k", 1) // t=0: the key expires at 100 ms
	require.NoError(t, err)
	b.advance(50*time.Millisecond + 500*time.Microsecond)
	_, err = rv.Settle(ctx, 3) // 2 more entries, at 50.5 ms, and the key's expiry moved to 150.5 ms
	require.NoError(t, err)
	b.advance(499 * time.Microsecond) // the same ms: the expiry stays
	res, err := lim.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	b.advance(l.Period - 499*time.Microsecond) // 150.5 ms: the entries of 50.5 ms have left
	res, err = lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, 9, res.Remaining, "Remaining at 150.5 ms, with the event of 50.999 ms in the window")
}
