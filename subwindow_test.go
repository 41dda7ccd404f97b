package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/subring"
)

func TestSubWindowCounterTable(t *testing.T) {
	b, _ := miniBackend(t)
	// 3 a minute in 6 sub-windows of 10 s: an event counts until 60 s
	// after its sub-window's end.
	lim := newLimiter(t, b.rdb, SubWindowCounter, Limit{Rate: 3, Period: time.Minute, SubWindows: 6})
	s, us := time.Second, time.Microsecond
	run(t, b, lim, "k", []step{
		{n: 2, allowed: true, remaining: 1, reset: 70 * s},
		{advance: 14 * s, n: 1, allowed: true, remaining: 0, reset: 66 * s},
		// Sub-window 0's 2 events stop counting at 70 s.
		{advance: 7 * s, n: 1, allowed: false, remaining: 0, retry: 49 * s, reset: 59 * s},
		// 3 need sub-window 1 gone too, at 80 s.
		{n: 3, allowed: false, remaining: 0, retry: 59 * s, reset: 59 * s},
		{advance: 49*s - us, n: 1, allowed: false, remaining: 0, retry: us, reset: 10*s + us},
		{advance: us, n: 2, allowed: true, remaining: 0, reset: 70 * s},
		{n: 0, allowed: true, remaining: 0, reset: 70 * s},
		// Two periods idle: nothing counts.
		{advance: 2 * time.Minute, n: 3, allowed: true, remaining: 0, reset: 70 * s},
	})
}

// Sub-windows of a Period that is not a whole number of them have their
// bounds rounded up to the µs: 1 s in 60 sub-windows are of 16,667 and
// 16,666 µs, and the sub-windows of the sub-window counter and of its
// model (subWindowOf) agree at every bound.
func TestSubWindowCounterRoundedBounds(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SubWindowCounter, PerSecond(1))
	us := time.Microsecond
	require.Equal(t, 60, lim.Limit().SubWindows, "SubWindows filled in")
	// t0 is a whole second: sub-window 0 of the second ends at 16,667 µs
	// (1e6/60 rounded up), so an event at 16,666 µs counts until
	// 1s + 16,667µs, and one at 16,667 µs until 1s + 33,334µs.
	run(t, b, lim, "a", []step{
		{advance: 16666 * us, n: 1, allowed: true, remaining: 0, reset: 1000001 * us},
		{advance: 1000000 * us, n: 1, allowed: false, remaining: 0, retry: us, reset: us},
		{advance: us, n: 1, allowed: true, remaining: 0, reset: 1016667 * us},
	})
	b.setClock(16667 * us)
	run(t, b, lim, "b", []step{
		{n: 1, allowed: true, remaining: 0, reset: 1016667 * us},
	})
}

func TestSubWindowCounterInvalid(t *testing.T) {
	b, _ := miniBackend(t)
	for _, l := range []Limit{
		{Rate: 1, Period: time.Second, SubWindows: -1},
		{Rate: 1, Period: time.Second, SubWindows: MaxSubWindows + 1},
		{Rate: 1, Period: 10 * time.Millisecond, SubWindows: 11}, // 909 µs each
		{Rate: 1, Period: 1500 * time.Microsecond, SubWindows: 2},
		{Rate: 1, Period: time.Hour, SubWindows: 60, Burst: -1},
	} {
		_, err := NewSubWindowCounter(b.rdb, l)
		mustErrorIs(t, err, ErrInvalidLimit)
	}
	for _, s := range Strategies() {
		if s == SubWindowCounter {
			continue
		}
		_, err := New(b.rdb, s, Limit{Rate: 1, Period: time.Second, SubWindows: 10})
		mustErrorIs(t, err, ErrInvalidLimit)
		_, err = NewPolicy(b.rdb, []Rule{
			{Strategy: SubWindowCounter, Limit: PerSecond(1)},
			{Strategy: s, Limit: Limit{Rate: 1, Period: time.Minute, SubWindows: 10}},
		})
		mustErrorIs(t, err, ErrInvalidLimit)
	}
	// The default: 60, or one per whole ms under 60 ms.
	for _, c := range []struct {
		period time.Duration
		want   int
	}{{time.Hour, 60}, {60 * time.Millisecond, 60}, {59 * time.Millisecond, 59}, {2500 * time.Microsecond, 2}, {time.Millisecond, 1}} {
		lim := newLimiter(t, b.rdb, SubWindowCounter, Limit{Rate: 5, Period: c.period})
		assert.Equal(t, c.want, lim.Limit().SubWindows, "Period %v", c.period)
	}
	lim := newLimiter(t, b.rdb, SubWindowCounter, Limit{Rate: 5, Period: time.Second, SubWindows: MaxSubWindows})
	assert.Equal(t, "5/1s sub-windows 1000", lim.Limit().String())
	st, err := ParseStrategy("sub-window-counter")
	require.NoError(t, err)
	assert.Equal(t, SubWindowCounter, st)
}

// swModel is the sub-window counter's promise as a Go model: the admitted
// events and the grid, in exact 128-bit arithmetic.
type swModel struct {
	rate   int
	period int64 // µs
	s      int64
	events []swEvent // admitted, in time order
}

type swEvent struct{ at, n int64 }

// decide returns what the model answers at now for n, and admits them if
// it allows.
func (m *swModel) decide(now, n int64) (ok bool, remaining, retry, reset int64) {
	cw := subring.Of(now, m.period, m.s)
	lo := cw - m.s
	var count int64
	newest := int64(-1)
	for _, e := range m.events {
		if b := subring.Of(e.at, m.period, m.s); b >= lo {
			count += e.n
			newest = b
		}
	}
	until := func(b int64) int64 { return subring.Start(b+m.s+1, m.period, m.s) - now }
	if count > 0 {
		reset = until(newest)
	}
	avail := int64(m.rate) - count
	if n > avail {
		need := count + n - int64(m.rate)
		for _, e := range m.events {
			b := subring.Of(e.at, m.period, m.s)
			if b < lo {
				continue
			}
			if need -= e.n; need <= 0 {
				// Every event of b goes at once: the retry is b's end.
				retry = until(b)
				break
			}
		}
		return false, max(avail, 0), retry, reset
	}
	if n > 0 {
		m.events = append(m.events, swEvent{now, n})
		reset = until(cw)
	}
	return true, avail - n, 0, reset
}

// inPeriod returns the most events the model admitted in an interval of
// length period that ends at an admission.
func (m *swModel) mostInPeriod() int64 {
	var most int64
	for i, e := range m.events {
		var c int64
		for _, f := range m.events[:i+1] {
			if f.at > e.at-m.period {
				c += f.n
			}
		}
		most = max(most, c)
	}
	return most
}

// admittedSince returns the events admitted at from or later.
func (m *swModel) admittedSince(from int64) int64 {
	var c int64
	for _, e := range m.events {
		if e.at >= from {
			c += e.n
		}
	}
	return c
}

// TestSubWindowCounterModel plays random calls (bursts, idle spells, steps
// to sub-window bounds ±1 µs; rates from 1 to 2^40, periods from 1 ms to
// MaxPeriod, sub-windows from 1 to MaxSubWindows) on miniredis with an
// exact clock, and requires of every decision:
//   - every field as the model (swModel) says, to the µs;
//   - no interval of length Period holds more than Rate admitted events;
//   - a denial only when at least Rate-n+1 events were admitted within
//     Period plus one sub-window before it;
//   - RetryAfter exact: often, the same call is made again a µs before it
//     (denied) and at it (admitted).
func TestSubWindowCounterModel(t *testing.T) {
	t.Parallel() // a simulated clock on its own miniredis: beside the lane's other parallel tests
	seed := uint64(envInt(t, "REDLIMIT_SUBWINDOW_SEED", 39))
	limiters := int(envInt(t, "REDLIMIT_SUBWINDOW_LIMITERS", 60))
	if testing.Short() {
		limiters = min(limiters, 20)
	}
	b, _ := miniBackend(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, seed))
	denials, retriesProbed := 0, 0
	for li := range limiters {
		period, s := randomSubWindowLimit(r)
		rate := 1 + r.IntN(12)
		switch r.IntN(6) {
		case 0:
			rate = 1 + r.IntN(1000)
		case 1:
			rate = MaxRate - r.IntN(3)
		}
		l := Limit{Rate: rate, Period: time.Duration(period) * time.Microsecond, SubWindows: int(s)}
		if r.IntN(4) == 0 && s == min(60, period/1000) {
			l.SubWindows = 0 // the default
		}
		lim := newLimiter(t, b.rdb, SubWindowCounter, l)
		m := &swModel{rate: rate, period: period, s: s}
		latest := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		// Start anywhere from 2030 to 60 years on, at any µs.
		now := t0.UnixMicro() + r.Int64N(60*365*24*3600*1_000_000)
		b.setClock(time.Duration(now-t0.UnixMicro()) * time.Microsecond)
		key := "m" + strconv.Itoa(li)
		where := func(i int) string {
			return fmt.Sprintf("seed %d limiter %d (%v) step %d at %d µs", seed, li, lim.Limit(), i, now)
		}
		call := func(i int, n int64) (Result, bool, int64, int64, int64) {
			res, err := lim.AllowN(ctx, key, int(n))
			require.NoError(t, err, where(i))
			ok, rem, retry, reset := m.decide(now, n)
			got := fmt.Sprintf("allowed=%v remaining=%d retry=%d reset=%d", res.Allowed, res.Remaining, res.RetryAfter.Microseconds(), res.ResetAfter.Microseconds())
			want := fmt.Sprintf("allowed=%v remaining=%d retry=%d reset=%d", ok, rem, retry, reset)
			require.Equal(t, want, got, "%s, n=%d", where(i), n)
			return res, ok, rem, retry, reset
		}
		move := func(d int64) {
			if now+d > latest {
				d = 1 // past 2100 (periods of up to 100 years, so within 2^53 µs)
			}
			now += d
			b.setClock(time.Duration(now-t0.UnixMicro()) * time.Microsecond)
		}
		steps := 120 + r.IntN(120)
		for i := range steps {
			switch k := r.IntN(20); {
			case k < 6: // a burst: the same µs
			case k < 10:
				move(1 + r.Int64N(max(period/s, 1)))
			case k < 13:
				move(1 + r.Int64N(period))
			case k == 13: // idle
				move(period + r.Int64N(2*period))
			case k < 17: // to a sub-window's bound, or a µs on either side
				cw := subring.Of(now, period, s)
				move(subring.Start(cw+1, period, s) - now + r.Int64N(3) - 1)
			default:
				move(1)
			}
			n := int64(1)
			switch k := r.IntN(8); {
			case k == 0:
				n = 0
			case k < 3:
				n = 1 + r.Int64N(int64(rate))
			}
			res, ok, _, retry, _ := call(i, n)
			if ok {
				continue
			}
			denials++
			// Justified: at least Rate-n+1 admitted within Period plus one
			// sub-window (the longest, ceil(Period/s)).
			sub := (period + s - 1) / s
			require.Greater(t, m.admittedSince(now-period-sub+1)+n, int64(rate), "%s: denied %d with too few admitted since Period plus one sub-window", where(i), n)
			require.Positive(t, retry, where(i))
			if r.IntN(3) == 0 && now+res.RetryAfter.Microseconds() <= latest {
				retriesProbed++
				at := now
				move(res.RetryAfter.Microseconds() - 1)
				_, ok, _, _, _ = call(i, n)
				require.False(t, ok, "%s: admitted a µs before RetryAfter", where(i))
				move(1)
				_, ok, _, _, _ = call(i, n)
				require.True(t, ok, "%s: denied at RetryAfter %v (from %d)", where(i), res.RetryAfter, at)
			}
		}
		require.LessOrEqual(t, m.mostInPeriod(), int64(rate), "seed %d limiter %d: an interval of Period held more than Rate", seed, li)
	}
	t.Logf("%d limiters, %d denials, %d retries probed a µs before and at", limiters, denials, retriesProbed)
	require.Positive(t, denials)
	require.Positive(t, retriesProbed)
}

// randomSubWindowLimit returns a random Period (µs) and sub-windows of at
// least 1 ms each: short, round and odd periods, and some of years, whose
// Period × SubWindows passes 2^53.
func randomSubWindowLimit(r *rand.Rand) (period, s int64) {
	switch r.IntN(6) {
	case 0:
		period = 1000 + r.Int64N(100_000)
	case 1:
		period = []int64{1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000}[r.IntN(4)]
	case 2:
		period = 1000 + r.Int64N(3_600_000_000)
	case 3:
		period = int64(MaxPeriod/time.Microsecond) - r.Int64N(1_000_000_000)
	default:
		period = 1000 + r.Int64N(10_000_000)
	}
	most := min(int64(MaxSubWindows), period/1000)
	switch r.IntN(4) {
	case 0:
		s = min(60, most)
	case 1:
		s = most
	default:
		s = 1 + r.Int64N(most)
	}
	return period, s
}

// longestSubWindow returns the longest sub-window of l, a sub-window
// counter's limit: Period/SubWindows rounded up to the µs (SubWindows 0
// meaning its default).
func longestSubWindow(l Limit) time.Duration {
	s, err := subWindows(subWindowCounter, l)
	if err != nil || s == 0 {
		panic(fmt.Sprintf("longestSubWindow(%v): %d, %v", l, s, err))
	}
	us := int64(l.Period / time.Microsecond)
	return time.Duration((us+int64(s)-1)/int64(s)) * time.Microsecond
}

// TestSubWindowCounterConcurrentRedis runs 32 goroutines on one key of a
// real Redis: never more than Rate in any Period (see
// checkSubWindowConcurrent).
func TestSubWindowCounterConcurrentRedis(t *testing.T) {
	rdb := realBackend(t).rdb
	l := Limit{Rate: 50, Period: 500 * time.Millisecond, SubWindows: 10}
	lim := newLimiter(t, rdb, SubWindowCounter, l, WithPrefix(prefixFor(t)))
	checkSubWindowConcurrent(t, lim, 32, 2*time.Second)
}

// TestSubWindowCounterCluster runs the same on a real Redis Cluster, and a
// policy of a sub-window counter and a token bucket there, reserved and
// settled (one slot per key: no CROSSSLOT).
func TestSubWindowCounterCluster(t *testing.T) {
	rdb := clusterClient(t, realCluster(t), time.Second)
	l := Limit{Rate: 50, Period: 500 * time.Millisecond, SubWindows: 10}
	lim := newLimiter(t, rdb, SubWindowCounter, l, WithPrefix(prefixFor(t)))
	checkSubWindowConcurrent(t, lim, 32, 2*time.Second)

	ctx := context.Background()
	p, err := NewPolicy(rdb, []Rule{
		{Name: "hour", Strategy: SubWindowCounter, Limit: PerHour(10)},
		{Name: "burst", Strategy: TokenBucket, Limit: PerSecond(100)},
	}, WithPrefix(prefixFor(t)+"p"))
	require.NoError(t, err)
	defer p.Close()
	for _, key := range []string{"a", "b", "{user:1}", "c"} {
		r, err := p.Reserve(ctx, key, 8)
		require.NoError(t, err, key)
		require.True(t, r.Result().Allowed, "%s: %+v", key, r.Result())
		res, err := r.Settle(ctx, 3)
		require.NoError(t, err, key)
		require.Equal(t, 7, res.Remaining, "%s: settled 3 of 8: %+v", key, res)
		res, err = p.AllowN(ctx, key, 8)
		require.NoError(t, err, key)
		require.False(t, res.Allowed, "%s: 3 + 8 > 10: %+v", key, res)
		assert.Equal(t, "hour", res.Rule, key)
		require.False(t, res.Degraded, key)
	}
}

// checkSubWindowConcurrent reserves one event at a time on one key from g
// goroutines for d, and requires: for every sub-window b, the events
// counted in b .. b+SubWindows (the reservations' tags: the sub-window
// each counted in) at most Rate, which is what the script keeps, so that
// no interval of Period holds more than Rate on the server's clock; the
// same on the client's clock (each admission stamped when its call
// returned, up to the longest call after Redis decided it); and at least
// 85% of Rate per Period plus one sub-window admitted.
func checkSubWindowConcurrent(t *testing.T, lim *RateLimiter, g int, d time.Duration) {
	t.Helper()
	l := lim.Limit()
	type admission struct {
		at  time.Duration
		tag int64
	}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		all      []admission
		maxCall  time.Duration
		firstErr error
		calls    atomic.Int64
	)
	start := time.Now()
	for range g {
		wg.Go(func() {
			for time.Since(start) < d {
				before := time.Now()
				r, err := lim.Reserve(context.Background(), "hot", 1)
				calls.Add(1)
				took := time.Since(before)
				mu.Lock()
				maxCall = max(maxCall, took)
				switch {
				case err != nil || r.Result().Degraded:
					if firstErr == nil {
						firstErr = fmt.Errorf("%+v, %v", r.Result(), err)
					}
				case r.Result().Allowed:
					all = append(all, admission{time.Since(start), r.tags[0]})
				}
				mu.Unlock()
				if firstErr != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, firstErr)
	require.NotEmpty(t, all)
	slices.SortFunc(all, func(a, b admission) int { return int(a.at - b.at) })
	// The server's clock: the counts of every S+1 consecutive sub-windows.
	per := map[int64]int{}
	lo, hi := all[0].tag, all[0].tag
	for _, a := range all {
		per[a.tag]++
		lo, hi = min(lo, a.tag), max(hi, a.tag)
	}
	s := int64(l.SubWindows)
	most := 0
	for b := lo - s; b <= hi; b++ {
		sum := 0
		for k := b; k <= b+s; k++ {
			sum += per[k]
		}
		most = max(most, sum)
	}
	require.LessOrEqual(t, most, l.Rate, "%d events counted in %d consecutive sub-windows", most, s+1)
	// The client's clock.
	for i := range all {
		for j := i; j < len(all) && all[j].at-all[i].at+maxCall < l.Period; j++ {
			require.LessOrEqual(t, j-i+1, l.Rate, "%d admitted within %v of client time (+%v longest call)", j-i+1, all[j].at-all[i].at, maxCall)
		}
	}
	span := all[len(all)-1].at - all[0].at
	ideal := float64(l.Rate) * float64(span) / float64(l.Period+longestSubWindow(l))
	t.Logf("%v: %d goroutines, %d calls, %d admitted in %v (%.0f%% of Rate per Period plus a sub-window), at most %d in %d sub-windows, longest call %v",
		l, g, calls.Load(), len(all), span.Round(time.Millisecond), 100*float64(len(all))/ideal, most, s+1, maxCall)
	require.GreaterOrEqual(t, float64(len(all)), 0.85*ideal)
}

// TestSubWindowCounterMemoryRedis measures MEMORY USAGE of a key whose
// every counted sub-window holds events (the most it keeps), on a real
// Redis, at 1,000 and 1,000,000 an hour: the same, whatever the rate; a
// compact listpack up to hash-max-listpack-entries - 3 sub-windows (509
// with the server's default of 512 fields), a hash table past it. Redis
// 6 names the compact form ziplist (hash-max-ziplist-entries).
func TestSubWindowCounterMemoryRedis(t *testing.T) {
	rdb, advance, opts := simulatedRedis(t)
	ctx := context.Background()
	compactName := "listpack"
	cfg, err := rdb.ConfigGet(ctx, "hash-max-listpack-entries").Result()
	require.NoError(t, err)
	if cfg["hash-max-listpack-entries"] == "" { // Redis 6
		compactName = "ziplist"
		cfg, err = rdb.ConfigGet(ctx, "hash-max-ziplist-entries").Result()
		require.NoError(t, err)
	}
	entries, err := strconv.Atoi(cfg["hash-max-"+compactName+"-entries"])
	require.NoError(t, err, "%v", cfg)
	compact := min(entries-3, MaxSubWindows) // c, o and t, and a field per older sub-window
	type memCase struct {
		rate, s int
		most    int64
	}
	cases := []memCase{{1_000_000, 60, 1024}, {1000, 60, 1024}, {1_000_000, compact, int64(16 * (compact + 3))}}
	if compact < MaxSubWindows {
		cases = append(cases, memCase{1_000_000, compact + 1, int64(81 * (compact + 4))}) // Redis 7.0: 72 B a field, Redis 6.0: 80.2
	}
	cases = append(cases, memCase{1_000_000, MaxSubWindows, 100_000})
	t.Logf("hash-max-%s-entries %d: %s up to %d sub-windows", compactName, entries, compactName, compact)
	for i, c := range cases {
		l := Limit{Rate: c.rate, Period: time.Hour, SubWindows: c.s}
		lim := newLimiter(t, rdb, SubWindowCounter, l, append(opts, WithPrefix(fmt.Sprint("mem", i)))...)
		each := c.rate / (c.s + 1)
		sub := longestSubWindow(l)
		for range c.s + 1 { // every sub-window that counts
			res, err := lim.AllowN(ctx, "k", each)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
			advance(sub)
		}
		advance(-sub)
		res, err := lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, c.rate-(c.s+1)*each, res.Remaining, "%+v", res)
		key := lim.stateKey("k")
		used, err := rdb.MemoryUsage(ctx, key, 0).Result()
		require.NoError(t, err)
		enc, err := rdb.ObjectEncoding(ctx, key).Result()
		require.NoError(t, err)
		fields, err := rdb.HLen(ctx, key).Result()
		require.NoError(t, err)
		t.Logf("%v: %d sub-windows with %d events each: %d fields, %s, MEMORY USAGE %d bytes", l, c.s+1, each, fields, enc, used)
		assert.Equal(t, int64(c.s+3), fields)
		want := compactName
		if c.s > compact {
			want = "hashtable"
		}
		assert.Equal(t, want, enc)
		assert.LessOrEqual(t, used, c.most)
	}
}

// While Redis is down, a sub-window counter's stand-in keeps the promise at
// the instance's share: every answer as the model at Rate × share (on the
// process's clock, a synctest bubble's here), so no interval of Period
// holds more, and RetryAfter exact; a reservation it took gives unused
// events back to their sub-window.
func TestSubWindowCounterFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := miniredis.NewMiniRedis()
		require.NoError(t, m.Start())
		var down atomic.Bool
		rdb := redis.NewClient(&redis.Options{
			Addr: "127.0.0.1:1",
			Dialer: func(context.Context, string, string) (net.Conn, error) {
				if down.Load() {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
				}
				return m.Dial()
			},
			MaxRetries: -1,
		})
		t.Cleanup(func() { rdb.Close() })
		l := Limit{Rate: 10, Period: time.Second, SubWindows: 7} // sub-windows of 142,858 and 142,857 µs
		lim := newLimiter(t, rdb, SubWindowCounter, l, WithFallbackShare(0.5), WithPingInterval(time.Hour))
		down.Store(true)
		m.Close()
		ctx := context.Background()
		model := &swModel{rate: 5, period: 1_000_000, s: 7}
		r := rand.New(rand.NewPCG(3, 9))
		denials := 0
		for i := range 400 {
			time.Sleep(time.Duration(r.Int64N(300_000)) * time.Microsecond * time.Duration(r.IntN(2)))
			n := 1 + r.IntN(3)
			res, err := lim.AllowN(ctx, "k", n)
			require.NoError(t, err)
			require.True(t, res.Degraded, "call %d: %+v", i, res)
			ok, rem, retry, reset := model.decide(time.Now().UnixMicro(), int64(n))
			got := fmt.Sprintf("allowed=%v remaining=%d retry=%d reset=%d", res.Allowed, res.Remaining, res.RetryAfter.Microseconds(), res.ResetAfter.Microseconds())
			want := fmt.Sprintf("allowed=%v remaining=%d retry=%d reset=%d", ok, rem, retry, reset)
			require.Equal(t, want, got, "call %d at %v, n=%d", i, time.Now().UnixMicro(), n)
			if !ok {
				denials++
			}
		}
		require.Positive(t, denials)
		require.LessOrEqual(t, model.mostInPeriod(), int64(5))

		// A reservation of 3, settled with 1: 2 back to their sub-window.
		time.Sleep(2 * time.Second)
		rv, err := lim.Reserve(ctx, "k", 3)
		require.NoError(t, err)
		taken := subring.Of(time.Now().UnixMicro(), 1_000_000, 7)
		require.True(t, rv.Result().Allowed && rv.Result().Degraded, "%+v", rv.Result())
		time.Sleep(500 * time.Millisecond)
		res, err := rv.Settle(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, 4, res.Remaining, "settled 1 of 3: %+v", res)
		// The one used counts until a Period after its sub-window ends.
		res, err = lim.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		require.False(t, res.Allowed, "%+v", res)
		require.Equal(t, subring.Start(taken+8, 1_000_000, 7)-time.Now().UnixMicro(), res.RetryAfter.Microseconds(), "%+v", res)
	})
}

// A settle below the reservation gives the events back to the sub-window
// they were taken from, while it counts (never more than it holds); one
// above charges the difference now, even past the limit.
func TestSubWindowCounterSettle(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := context.Background()
	// 10 a minute in 6 sub-windows of 10 s, from t0.
	lim := newLimiter(t, b.rdb, SubWindowCounter, Limit{Rate: 10, Period: time.Minute, SubWindows: 6})
	s := time.Second
	r, err := lim.Reserve(ctx, "k", 6) // sub-window 0
	require.NoError(t, err)
	require.True(t, r.Result().Allowed)
	b.advance(25 * s) // sub-window 2
	res, err := lim.AllowN(ctx, "k", 4)
	require.NoError(t, err)
	require.True(t, res.Allowed, "%+v", res)
	res, err = r.Settle(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 4, res.Remaining, "4 given back: %+v", res)
	// Sub-window 0 holds 2 now, sub-window 2 holds 4: 5 more are one over,
	// until sub-window 0 stops counting at 70 s.
	res, err = lim.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	require.False(t, res.Allowed, "%+v", res)
	assert.Equal(t, 45*s, res.RetryAfter, "%+v", res)

	// A refund to a sub-window that stopped counting gives nothing back.
	r, err = lim.Reserve(ctx, "k", 4) // sub-window 2, now 10 in all
	require.NoError(t, err)
	require.True(t, r.Result().Allowed, "%+v", r.Result())
	b.advance(60 * s) // 85 s: sub-window 8; sub-windows 2.. count until 90 s
	res, err = lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, 2, res.Remaining, "%+v", res)
	b.advance(5 * s) // 90 s: sub-window 2 has stopped counting
	res, err = r.Settle(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 10, res.Remaining, "nothing counts: %+v", res)

	// A charge past the limit counts now, in the current sub-window.
	r, err = lim.Reserve(ctx, "k", 10) // sub-window 9
	require.NoError(t, err)
	require.True(t, r.Result().Allowed)
	res, err = r.Settle(ctx, 15)
	require.NoError(t, err)
	require.Equal(t, 0, res.Remaining, "%+v", res)
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed, "%+v", res)
	assert.Equal(t, 70*s, res.RetryAfter, "until sub-window 9 stops counting, at 160 s: %+v", res)
}
