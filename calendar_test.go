package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/calendar"
)

// calendarZones are the zones the calendar tests cross: daylight saving in
// both hemispheres, a 30-minute shift (Lord Howe), none (Tokyo), a
// half-hour offset (Kolkata), and an offset of 13 hours (Auckland's
// summer), where a local midnight is near noon UTC.
var calendarZones = []string{"America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Tokyo", "Asia/Kolkata", "Pacific/Auckland", "UTC"}

func loadZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err, "zone %s: %v", name, err)
	return loc
}

// expectedStarts returns the starts of the windows of l from the first one
// at or after from, for two years, by the time package's own arithmetic:
// time.Date of each local date at 00:00 (it normalises a day past the
// month's end and a skipped midnight).
func expectedStarts(l Limit, from time.Time) []time.Time {
	loc := l.cal.Loc
	y, m, d := from.In(loc).Date()
	var out []time.Time
	switch l.cal.Kind {
	case calendar.Day:
		for k := 0; k <= 2*366; k++ {
			out = append(out, time.Date(y, m, d+k, 0, 0, 0, 0, loc))
		}
	case calendar.Week:
		for time.Date(y, m, d, 12, 0, 0, 0, loc).Weekday() != time.Weekday(l.cal.Day) {
			d++
		}
		for k := 0; k <= 2*53; k++ {
			out = append(out, time.Date(y, m, d+7*k, 0, 0, 0, 0, loc))
		}
	case calendar.Month:
		for k := 0; k <= 24; k++ {
			// The month's last day, from the first of the next month.
			last := time.Date(y, m+time.Month(k)+1, 1, 12, 0, 0, 0, loc).AddDate(0, 0, -1).Day()
			out = append(out, time.Date(y, m+time.Month(k), min(l.cal.Day, last), 0, 0, 0, 0, loc))
		}
	}
	return out
}

// Every window over two years of boundaries, in six zones, for days,
// weeks from three weekdays and months from days 1, 15, 28, 29, 30 and 31:
// the window of the first and last µs of each, and of a point inside, is
// the one time.Date gives, and the index grows by one per window.
func TestCalendarWindowsMatchTimePackage(t *testing.T) {
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC) // 2028 is a leap year
	for _, zone := range calendarZones {
		loc := loadZone(t, zone)
		limits := []Limit{Daily(1, loc), Weekly(1, loc, time.Monday), Weekly(1, loc, time.Sunday), Weekly(1, loc, time.Saturday)}
		for _, day := range []int{1, 15, 28, 29, 30, 31} {
			limits = append(limits, Monthly(1, loc, day))
		}
		for _, l := range limits {
			starts := expectedStarts(l, from)
			var prev int64
			for k := 0; k+1 < len(starts); k++ {
				s, e := starts[k], starts[k+1]
				for _, at := range []time.Time{s, e.Add(-time.Microsecond), s.Add(e.Sub(s) / 2)} {
					gs, ge, idx := l.cal.Window(at)
					if !gs.Equal(s) || !ge.Equal(e) {
						t.Fatalf("%v: window(%v) = [%v, %v), want [%v, %v)", l, at.In(loc), gs, ge, s, e)
					}
					if k > 0 && idx != prev+1 {
						t.Fatalf("%v: window(%v) index %d, want %d", l, at.In(loc), idx, prev+1)
					}
				}
				_, _, prev = l.cal.Window(s)
			}
		}
	}
}

// The daylight-saving days: 23, 25, 23.5 and 24.5 hours; and the time to
// the next boundary at 01:00 on the day New York springs forward is 22 h.
func TestCalendarDaylightSavingDays(t *testing.T) {
	ny, lh := loadZone(t, "America/New_York"), loadZone(t, "Australia/Lord_Howe")
	for _, c := range []struct {
		loc  *time.Location
		day  time.Time
		want time.Duration
	}{
		{ny, time.Date(2026, 3, 8, 12, 0, 0, 0, ny), 23 * time.Hour},
		{ny, time.Date(2026, 11, 1, 12, 0, 0, 0, ny), 25 * time.Hour},
		{lh, time.Date(2026, 10, 4, 12, 0, 0, 0, lh), 23*time.Hour + 30*time.Minute},
		{lh, time.Date(2026, 4, 5, 12, 0, 0, 0, lh), 24*time.Hour + 30*time.Minute},
	} {
		s, e, _ := Daily(1, c.loc).cal.Window(c.day)
		assert.Equal(t, c.want, e.Sub(s), "the day of %v", c.day)
	}
	at := time.Date(2026, 3, 8, 1, 0, 0, 0, ny)
	_, e, _ := Daily(1, ny).cal.Window(at)
	assert.Equal(t, 22*time.Hour, e.Sub(at))
}

func TestCalendarLimitValidation(t *testing.T) {
	b, _ := miniBackend(t)
	tokyo := loadZone(t, "Asia/Tokyo")
	for _, c := range []struct {
		s     Strategy
		limit Limit
	}{
		{TokenBucket, Daily(10, tokyo)},
		{LeakyBucket, Weekly(10, nil, time.Monday)},
		{SlidingLog, Monthly(10, nil, 1)},
		{SlidingCounter, Daily(10, nil)},
		{FixedWindow, Monthly(10, tokyo, 0)},
		{FixedWindow, Monthly(10, tokyo, 32)},
		{FixedWindow, Weekly(10, tokyo, 7)},
		{FixedWindow, Daily(0, tokyo)},
		{FixedWindow, Daily(MaxRate+1, tokyo)},
	} {
		_, err := New(b.rdb, c.s, c.limit)
		require.ErrorIs(t, err, ErrInvalidLimit, "%v %v", c.s, c.limit)
		_, err = NewPolicy(b.rdb, []Rule{{Strategy: c.s, Limit: c.limit}})
		require.ErrorIs(t, err, ErrInvalidLimit, "policy rule %v %v", c.s, c.limit)
	}
	for _, l := range []Limit{Daily(1, tokyo), Daily(MaxRate, nil), Weekly(5, nil, time.Saturday), Monthly(5, tokyo, 1), Monthly(5, tokyo, 31)} {
		lim, err := NewFixedWindow(b.rdb, l)
		require.NoError(t, err, "%v", l)
		lim.Close()
	}
	// A limit function's calendar limit for another strategy is an error
	// of the call.
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), WithLimitFunc(func(context.Context, string) (Limit, error) {
		return Daily(5, tokyo), nil
	}))
	_, err := lim.Allow(t.Context(), "k")
	require.ErrorIs(t, err, ErrInvalidLimit)
}

func TestCalendarLimitString(t *testing.T) {
	tokyo, ny := loadZone(t, "Asia/Tokyo"), loadZone(t, "America/New_York")
	assert.Equal(t, "1000/day Asia/Tokyo", Daily(1000, tokyo).String())
	assert.Equal(t, "500/week from Monday UTC", Weekly(500, nil, time.Monday).String())
	assert.Equal(t, "10000/month from day 31 America/New_York", Monthly(10000, ny, 31).String())
	assert.Equal(t, "10/1s", PerSecond(10).String(), "an ordinary limit")
}

// at moves b's clock to t.
func (b *backend) at(t time.Time) { b.setClock(t.Sub(t0)) }

// On the day New York springs forward: a call at 01:00 resets in 22 h, a
// denial retries then, and the next day's window starts at 0 and lasts 24 h;
// the key expires at the window's end.
func TestCalendarDailySpringForward(t *testing.T) {
	b, _ := miniBackend(t)
	ny := loadZone(t, "America/New_York")
	b.at(time.Date(2030, 3, 10, 1, 0, 0, 0, ny))
	lim := newLimiter(t, b.rdb, FixedWindow, Daily(3, ny))
	h := time.Hour
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 2, reset: 22 * h},
		{n: 2, allowed: true, remaining: 0, reset: 22 * h},
		{n: 1, allowed: false, remaining: 0, retry: 22 * h, reset: 22 * h},
		{advance: 22*h - time.Microsecond, n: 1, allowed: false, remaining: 0, retry: time.Microsecond, reset: time.Microsecond},
		{advance: time.Microsecond, n: 1, allowed: true, remaining: 2, reset: 24 * h},
	})
	checkTTL(t, b.rdb, lim.stateKey("k"), 24*h)
	res, err := lim.AllowN(t.Context(), "k", 0)
	require.NoError(t, err)
	assert.Equal(t, Daily(3, ny).String(), res.Limit.String(), "Result.Limit")
	// The estimate of the server's time (this machine's clock) missed the
	// window by years: the limiter learnt the server's offset.
	assert.Greater(t, lim.serverAhead.Load(), (2030-2027)*365*24*time.Hour.Microseconds())
}

// Two years of windows in each zone (of the days, every 8th and those
// around a change of offset), for a day, a week from Monday and a
// month from days 31 and 29: at the last µs of a window its count holds
// (reset in 1 µs); at the next µs, the boundary time.Date gives, a new
// window starts at 0 (the old key, kept 1 ms more by its rounded expiry,
// does not count) and resets at its own end.
func TestCalendarDecisionsAtEveryBoundary(t *testing.T) {
	t.Parallel() // simulated clocks, a miniredis per case: beside the lane's other parallel tests
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, zone := range calendarZones {
		loc := loadZone(t, zone)
		for _, l := range []Limit{Daily(2, loc), Weekly(2, loc, time.Monday), Monthly(2, loc, 31), Monthly(2, loc, 29)} {
			t.Run(zone+"/"+l.cal.Name(), func(t *testing.T) {
				b, _ := miniBackend(t)
				lim := newLimiter(t, b.rdb, FixedWindow, l)
				ctx := t.Context()
				starts := expectedStarts(l, from)
				visited := 0 // the last window that took an event at its start
				for k := 1; k+1 < len(starts); k++ {
					s, e := starts[k], starts[k+1]
					if l.cal.Kind == calendar.Day && k%8 != 1 && e.Sub(s) == 24*time.Hour && s.Sub(starts[k-1]) == 24*time.Hour {
						continue // of the days: every 8th, and those around a change of offset
					}
					b.at(s.Add(-time.Microsecond))
					res, err := lim.AllowN(ctx, "k", 1)
					require.NoError(t, err)
					want := "allowed=true remaining=0 reset=1µs" // the previous window's count holds
					if visited != k-1 || k == 1 {
						want = "allowed=true remaining=1 reset=1µs"
					}
					visited = k
					require.Equal(t, want, fmtRes(res), "the last µs before %v", s)
					b.at(s)
					res, err = lim.AllowN(ctx, "k", 1)
					require.NoError(t, err)
					require.Equal(t, "allowed=true remaining=1 reset="+e.Sub(s).String(), fmtRes(res), "at %v", s)
					res, err = lim.AllowN(ctx, "k", 2)
					require.NoError(t, err)
					require.Equal(t, "allowed=false remaining=1 reset="+e.Sub(s).String(), fmtRes(res), "at %v", s)
					require.Equal(t, e.Sub(s), res.RetryAfter, "RetryAfter at %v", s)
				}
			})
		}
	}
}

func fmtRes(r Result) string {
	return "allowed=" + strconv.FormatBool(r.Allowed) + " remaining=" + strconv.Itoa(r.Remaining) + " reset=" + r.ResetAfter.String()
}

// A month from day 31 through a leap February: Jan 31, Feb 29, Mar 31.
func TestCalendarMonthlyLeapFebruary(t *testing.T) {
	b, _ := miniBackend(t)
	tokyo := loadZone(t, "Asia/Tokyo")
	b.at(time.Date(2028, 2, 28, 23, 0, 0, 0, tokyo))
	lim := newLimiter(t, b.rdb, FixedWindow, Monthly(5, tokyo, 31))
	h, d := time.Hour, 24*time.Hour
	run(t, b, lim, "k", []step{
		{n: 5, allowed: true, remaining: 0, reset: h},
		{n: 1, allowed: false, remaining: 0, retry: h, reset: h},
		{advance: h, n: 1, allowed: true, remaining: 4, reset: 31 * d}, // Feb 29 to Mar 31
	})
}

// A window that is not a whole number of minutes long reaches
// single_calendar.lua in two arguments (singleWindowArgs), and decides as
// any other: Monrovia moved its clocks 44 min 30 s on 7 January 1972, so
// its month from the 7th began at 00:44:30 UTC and ended at 00:00 UTC on 7
// February; the next month, 29 days, goes in one argument again.
func TestCalendarWindowNotWholeMinutes(t *testing.T) {
	b, _ := miniBackend(t)
	monrovia := loadZone(t, "Africa/Monrovia")
	l := Monthly(3, monrovia, 7)
	at := time.Date(1972, 1, 20, 12, 0, 0, 0, time.UTC)
	s, e, _ := l.cal.Window(at)
	require.Equal(t, time.Date(1972, 1, 7, 0, 44, 30, 0, time.UTC), s.UTC(), "window's start")
	require.Equal(t, time.Date(1972, 2, 7, 0, 0, 0, 0, time.UTC), e.UTC(), "window's end")
	for _, c := range []struct {
		at  time.Time
		two bool
	}{{at, true}, {e, false}} {
		_, _, two := singleWindowArgs(l.cal.Args(c.at.UnixMicro()))
		require.Equal(t, c.two, two, "two arguments for the window of %v", c.at)
	}
	b.at(at)
	lim := newLimiter(t, b.rdb, FixedWindow, l)
	_, ok := lim.own.run.(calendarSingleRunner)
	require.True(t, ok, "runner %T", lim.own.run)
	left, d := e.Sub(at), 24*time.Hour
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 2, reset: left},
		{n: 2, allowed: true, remaining: 0, reset: left},
		{n: 1, allowed: false, remaining: 0, retry: left, reset: left},
		{advance: left - time.Microsecond, n: 1, allowed: false, remaining: 0, retry: time.Microsecond, reset: time.Microsecond},
		{advance: time.Microsecond, n: 1, allowed: true, remaining: 2, reset: 29 * d}, // Feb 7 to Mar 7, 1972
	})
}

// A calendar rule in a policy beside a token bucket: all or nothing, the
// calendar rule named by its calendar, a denial writing nothing in either.
func TestCalendarPolicy(t *testing.T) {
	b, _ := miniBackend(t)
	tokyo := loadZone(t, "Asia/Tokyo")
	b.at(time.Date(2030, 6, 1, 23, 0, 0, 0, tokyo))
	p := newPolicy(t, b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: PerSecond(10)},
		{Strategy: FixedWindow, Limit: Daily(3, tokyo)},
		{Strategy: FixedWindow, Limit: PerHour(100)},
	})
	assert.Equal(t, "fixed-window-daily-Asia/Tokyo", p.Rules()[1].Name)
	ctx := t.Context()
	res, err := p.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	assert.Equal(t, "fixed-window-daily-Asia/Tokyo", res.Rule, "the rule with the fewest remaining")
	assert.Equal(t, time.Hour, res.ResetAfter, "the longest reset: the day's")
	bucket := snapshot(t, b.rdb, ruleKey(p.stateKey("k", &p.own.rules[0]), p.own, 0))
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	assert.Equal(t, "fixed-window-daily-Asia/Tokyo", res.Rule)
	assert.Equal(t, time.Hour, res.RetryAfter)
	assert.Equal(t, bucket, snapshot(t, b.rdb, ruleKey(p.stateKey("k", &p.own.rules[0]), p.own, 0)), "a denial wrote into the bucket")
	b.advance(time.Hour) // midnight in Tokyo
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed, "%+v", res)
	assert.Equal(t, 2, res.Remaining)
	assert.Equal(t, 24*time.Hour, res.ResetAfter)

	// Two calendar rules of one calendar would share one state.
	_, err = NewPolicy(b.rdb, []Rule{{Name: "a", Strategy: FixedWindow, Limit: Daily(3, tokyo)}, {Name: "b", Strategy: FixedWindow, Limit: Daily(5, tokyo)}})
	require.ErrorIs(t, err, ErrInvalidLimit)
	// Per-call calendar rules count calls.
	pc := newPolicy(t, b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: PerMinute(1000)},
		{Strategy: FixedWindow, Limit: Monthly(2, tokyo, 1), PerCall: true},
	})
	assert.Equal(t, 2, allowedOfN(t, pc, "pc", 50, 4))
	// So does a policy of one per-call calendar rule, whichever script its
	// calendar would otherwise get (bakeCalendar): a day in a zone of one
	// offset, a day with daylight saving, a month.
	for _, l := range []Limit{Daily(2, tokyo), Daily(2, loadZone(t, "America/New_York")), Monthly(2, tokyo, 1)} {
		one := newPolicy(t, b.rdb, []Rule{{Strategy: FixedWindow, Limit: l, PerCall: true}})
		assert.Equal(t, 2, allowedOfN(t, one, "one", 50, 4), "%v", l)
	}
}

// A calendar quota's key ahead of now (the server's clock stepped back)
// keeps counting however far back, as a fixed window's does
// (TestClockSteps): days in a zone of one offset (the fixed window's
// script) and in one with daylight saving (single_calendar.lua), and the
// general script's (a policy).
func TestCalendarClockStepBack(t *testing.T) {
	ny := loadZone(t, "America/New_York")
	for _, back := range []int{1, 5, 6, 7, 8, 9, 10, 16} {
		for _, zone := range []*time.Location{time.UTC, ny} {
			l := Daily(5, zone)
			b, m := miniBackend(t)
			at := time.Date(2030, 6, 20, 12, 0, 0, 0, zone)
			b.at(at)
			lim := newLimiter(t, b.rdb, FixedWindow, l)
			pol := newPolicy(t, b.rdb, []Rule{{Strategy: FixedWindow, Limit: l}, {Strategy: TokenBucket, Limit: PerSecond(100)}}, WithPrefix("p"))
			for _, one := range []Limiter{lim, pol} {
				res, err := one.AllowN(t.Context(), "k", 5)
				require.NoError(t, err)
				require.True(t, res.Allowed, "%v", l)
			}
			step := time.Duration(back) * 24 * time.Hour
			b.at(at.Add(-step))
			moveExpiries(m, step)
			for _, one := range []Limiter{lim, pol} {
				res, err := one.Allow(t.Context(), "k")
				require.NoError(t, err)
				assert.False(t, res.Allowed, "%v: %d days back: %T admitted", l, back, one)
			}
		}
	}
}

func allowedOfN(t *testing.T, lim Limiter, key string, n, calls int) int {
	t.Helper()
	allowed := 0
	for range calls {
		res, err := lim.AllowN(t.Context(), key, n)
		require.NoError(t, err)
		allowed += btoi(res.Allowed)
	}
	return allowed
}

// WithLimitFunc and WithRulesFunc may give calendar limits, key by key.
func TestCalendarDynamicLimits(t *testing.T) {
	b, _ := miniBackend(t)
	ny := loadZone(t, "America/New_York")
	b.at(time.Date(2030, 11, 3, 0, 30, 0, 0, ny)) // the day New York falls back: 25 h
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(100), WithLimitFunc(func(_ context.Context, key string) (Limit, error) {
		if key == "daily" {
			return Daily(2, ny), nil
		}
		return Limit{}, nil
	}))
	h := time.Hour
	run(t, b, lim, "daily", []step{
		{n: 2, allowed: true, remaining: 0, reset: 24*h + 30*time.Minute},
		{n: 1, allowed: false, remaining: 0, retry: 24*h + 30*time.Minute, reset: 24*h + 30*time.Minute},
	})
	res, err := lim.Allow(t.Context(), "other")
	require.NoError(t, err)
	assert.Equal(t, 99, res.Remaining, "the limiter's own limit")
	assert.Equal(t, 30*time.Minute, res.ResetAfter)

	p := newPolicy(t, b.rdb, []Rule{{Strategy: TokenBucket, Limit: PerSecond(5)}}, WithRulesFunc(func(context.Context, string) ([]Rule, error) {
		return []Rule{{Strategy: TokenBucket, Limit: PerSecond(5)}, {Strategy: FixedWindow, Limit: Weekly(3, ny, time.Monday)}}, nil
	}))
	res, err = p.AllowN(t.Context(), "w", 3)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	// Sunday 00:30 EDT to Monday 00:00 EST: 24.5 h.
	assert.Equal(t, 24*h+30*time.Minute, res.ResetAfter)
	res, err = p.Allow(t.Context(), "w")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
}

// A reservation settles into its window: used < n gives back while the
// window lasts; once the next window started, nothing goes back into it,
// and more used is charged to the current window.
func TestCalendarReserveSettle(t *testing.T) {
	b, _ := miniBackend(t)
	london := loadZone(t, "Europe/London")
	b.at(time.Date(2030, 3, 31, 22, 0, 0, 0, london))
	lim := newLimiter(t, b.rdb, FixedWindow, Monthly(10, london, 1), WithReservationTTL(3*time.Hour))
	ctx := t.Context()
	r, err := lim.Reserve(ctx, "k", 6)
	require.NoError(t, err)
	require.True(t, r.Result().Allowed)
	res, err := r.Settle(ctx, 2)
	require.NoError(t, err)
	assert.Equal(t, 8, res.Remaining, "4 given back")
	assert.Equal(t, 2*time.Hour, res.ResetAfter)

	r, err = lim.Reserve(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, r.Result().Allowed)
	b.advance(2 * time.Hour) // April: a new window
	res, err = r.Settle(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, 10, res.Remaining, "nothing given back into April")
	assert.Equal(t, time.Duration(0), res.ResetAfter, "April is untouched")

	r, err = lim.Reserve(ctx, "k", 2)
	require.NoError(t, err)
	res, err = r.Settle(ctx, 5)
	require.NoError(t, err)
	assert.Equal(t, 5, res.Remaining, "3 more charged")
	assert.Equal(t, 30*24*time.Hour, res.ResetAfter, "April 1 to May 1, both in summer time")
}

// While Redis is down the stand-in of a calendar quota admits the
// instance's share of the quota at once, and refills it at Rate per the
// calendar's nominal Period.
func TestCalendarFallback(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	lim := newLimiter(t, rdb, FixedWindow, Daily(100, loadZone(t, "Asia/Kolkata")), WithFallbackShare(0.1), WithPingInterval(time.Hour))
	m.Close()
	admitted := 0
	for range 30 {
		res, err := lim.Allow(t.Context(), "k")
		require.NoError(t, err)
		require.True(t, res.Degraded)
		admitted += btoi(res.Allowed)
	}
	assert.Equal(t, 10, admitted, "the share of the quota")
}

// A call whose estimate of the server's time misses the window (the
// estimate is a day behind) is decided in the server's window all the
// same, and costs one more call only.
func TestCalendarWindowMiss(t *testing.T) {
	b, _ := miniBackend(t)
	london := loadZone(t, "Europe/London") // (a zone of one offset sends no window)
	at := time.Date(2030, 6, 1, 12, 0, 0, 0, london)
	b.at(at)
	lim := newLimiter(t, b.rdb, FixedWindow, Daily(2, london))
	require.NoError(t, lim.own.run.(calendarSingleRunner).one.Load(t.Context(), b.rdb).Err())
	var calls atomic.Int64
	b.rdb.AddHook(countHook{n: &calls})
	lim.serverAhead.Store(at.UnixMicro() - time.Now().UnixMicro() - 24*time.Hour.Microseconds())
	res, err := lim.Allow(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "allowed=true remaining=1 reset=12h0m0s", fmtRes(res))
	assert.Equal(t, int64(2), calls.Load(), "a miss and the call")
	res, err = lim.Allow(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "allowed=true remaining=0 reset=12h0m0s", fmtRes(res))
	assert.Equal(t, int64(3), calls.Load(), "the estimate learnt from the miss")
}

// With a client clock the window is that of the time the call sends.
func TestCalendarClientClock(t *testing.T) {
	b, _ := miniBackend(t)
	kolkata := loadZone(t, "Asia/Kolkata")
	at := time.Date(2030, 6, 1, 23, 59, 0, 0, kolkata)
	b.at(at)
	// The client's clock runs 3 h behind the server's; the limiter measures
	// the offset and sends the server's time.
	lim := newLimiter(t, b.rdb, FixedWindow, Daily(1, kolkata), WithClientClock(), withClock(func() time.Time { return at.Add(-3 * time.Hour) }))
	res, err := lim.Allow(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "allowed=true remaining=0 reset=1m0s", fmtRes(res))
}

// On a real Redis (its own clock): the window is the server's day in the
// zone, ResetAfter and RetryAfter run to the next local midnight, the key
// expires then, and a window missed by the estimate of the server's time
// (here two days behind), a reservation and a client clock all work.
func TestCalendarRedis(t *testing.T) {
	b := realBackend(t)
	ctx := t.Context()
	for _, zone := range []string{"Pacific/Auckland", "Asia/Kolkata", "America/New_York"} {
		loc := loadZone(t, zone)
		for _, opts := range [][]Option{nil, {WithClientClock()}} {
			lim := newLimiter(t, b.rdb, FixedWindow, Daily(3, loc), opts...)
			lim.serverAhead.Store(-48 * time.Hour.Microseconds())
			key := zone + strconv.Itoa(len(opts))
			before := time.Now()
			_, end, _ := Daily(3, loc).Window(before)
			if end.Sub(before) < 10*time.Second {
				t.Skipf("%s: %v to midnight", zone, end.Sub(before))
			}
			r, err := lim.Reserve(ctx, key, 3)
			require.NoError(t, err)
			require.True(t, r.Result().Allowed, "%+v", r.Result())
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, res.Allowed)
			assert.InDelta(t, float64(end.Sub(before)), float64(res.RetryAfter), float64(2*time.Second), "RetryAfter: to %v", end)
			assert.InDelta(t, float64(end.Sub(before)), float64(res.ResetAfter), float64(2*time.Second), "ResetAfter: to %v", end)
			ttl, err := b.rdb.PTTL(ctx, lim.stateKey(key)).Result()
			require.NoError(t, err)
			assert.InDelta(t, float64(end.Sub(before)), float64(ttl), float64(2*time.Second), "the key's TTL: to %v", end)
			res, err = r.Settle(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, 2, res.Remaining, "given back")
			assert.Equal(t, 2, allowedOf(t, lim, key, 3))
		}
	}
}

// Prefetches of a calendar quota: served calls count, and what they did not
// serve goes back into the window at Close.
func TestCalendarPrefetch(t *testing.T) {
	b, _ := miniBackend(t)
	tokyo := loadZone(t, "Asia/Tokyo")
	b.at(time.Date(2030, 6, 1, 12, 0, 0, 0, tokyo))
	lim := newLimiter(t, b.rdb, FixedWindow, Daily(1000, tokyo), WithPrefetch(100, time.Second))
	for range 300 {
		res, err := lim.Allow(t.Context(), "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	assert.NotZero(t, lim.PrefetchStats().Served, "calls served from prefetches")
	require.NoError(t, lim.Close())
	check := newLimiter(t, b.rdb, FixedWindow, Daily(1000, tokyo))
	res, err := check.AllowN(t.Context(), "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 700, res.Remaining, "the unserved events given back: %+v", lim.PrefetchStats())
	assert.Equal(t, 12*time.Hour, res.ResetAfter)
}

// A single calendar rule's usual calls run single_calendar.lua
// (calendarSingleRunner), or for a day or a week in a zone of one offset
// (Tokyo, Kolkata, UTC) the fixed window's script, shifted
// (specialisedRunner), its reservations the general script: the same
// calls on a limiter whose every call runs the general script
// (calendarRunner) get the same Results and leave the same state, across
// window boundaries and clocks stepped back, with misses of the window
// (the process's clock is not miniredis's) and direct calls at a client's
// time in or out of the window sent (the fixed window's script is sent
// none).
func TestSingleCalendarDecidesAsGeneral(t *testing.T) {
	b, m := miniBackend(t)
	rng := rand.New(rand.NewPCG(41, 42))
	for round, zone := range calendarZones {
		loc := loadZone(t, zone)
		rate := []int{1, 3, 10, 1000, MaxRate}[rng.IntN(5)]
		l := []Limit{Daily(rate, loc), Weekly(rate, loc, time.Monday), Monthly(rate, loc, 31)}[round%3]
		c := &calendarCompare{singleCompare: singleCompare{t: t, b: b, m: m, rng: rng, what: fmt.Sprintf("round %d, %v", round, l)}}
		c.one = newLimiter(t, b.rdb, FixedWindow, l, WithPrefix(fmt.Sprintf("r%done", round)), withoutFunctions())
		c.gen = newLimiter(t, b.rdb, FixedWindow, l, WithPrefix(fmt.Sprintf("r%dgen", round)), withoutFunctions())
		c.single, c.fixed = calendarSingle(t, l, c.one.own.run)
		c.gen.own.run = calendarRunner{}
		c.keyOne, c.keyGen = c.one.stateKey("k"), c.gen.stateKey("k")
		for range 300 {
			c.step()
		}
	}
}

// calendarCompare plays TestSingleCalendarDecidesAsGeneral's calls on one
// (the specialised script) and gen (the general script).
type calendarCompare struct {
	singleCompare
	fixed bool // one's script is the fixed window's (calendar.Fixed)
}

// calendarSingle returns the script that run, the runner of a single
// calendar rule of limit l, gives l's usual calls, and whether it is the
// fixed window's: which it must be where l's calendar is a fixed window
// (calendar.Fixed).
func calendarSingle(t *testing.T, l Limit, run runner) (*redis.Script, bool) {
	t.Helper()
	_, _, fixed := l.cal.Fixed(time.Now())
	if fixed {
		sr, ok := run.(specialisedRunner)
		require.True(t, ok, "%v: runner %T", l, run)
		wr, ok := sr.one.(writtenRunner)
		require.True(t, ok && wr.single, "%v: runner %T", l, sr.one)
		_, ok = sr.general.(calendarRunner)
		require.True(t, ok, "%v: reservations' runner %T", l, sr.general)
		return wr.script, true
	}
	sr, ok := run.(calendarSingleRunner)
	require.True(t, ok, "%v: runner %T", l, run)
	return sr.one, false
}

func (c *calendarCompare) step() {
	ctx := context.Background()
	cal := c.one.limit.cal
	switch op := c.rng.IntN(10); {
	case op < 3: // by µs, by hours, to just before or at a window's end, or back
		now := t0.Add(c.now)
		_, end, _ := cal.Window(now)
		c.now += []time.Duration{
			time.Duration(1 + c.rng.IntN(1000)),
			time.Duration(1+c.rng.IntN(30)) * time.Hour,
			end.Sub(now) - time.Duration(c.rng.IntN(3))*time.Microsecond,
			-time.Duration(1+c.rng.IntN(5_000_000)) * time.Microsecond,
		}[c.rng.IntN(4)]
		c.b.setClock(c.now)
	case op < 6:
		n := c.pickN(c.one)
		ro, errO := c.one.AllowN(ctx, "k", n)
		rg, errG := c.gen.AllowN(ctx, "k", n)
		require.Equal(c.t, errG, errO, c.what)
		require.Equal(c.t, rg, ro, "%s: AllowN(%d) at %v", c.what, n, c.now)
	case op < 8:
		c.script()
	case op < 9:
		c.reserve()
	default:
		c.settle()
	}
	c.compareState()
}

// script calls both scripts directly, as their runners would, at the
// server's time or a client's about it, with the window of a time near
// it: the same reply, or the same miss.
func (c *calendarCompare) script() {
	ctx := context.Background()
	server := t0.Add(c.now)
	now := int64(0)
	if c.rng.IntN(2) == 0 {
		now = server.Add(time.Duration(c.rng.IntN(5)-2) * time.Microsecond).UnixMicro()
	}
	at := server.Add(time.Duration(c.rng.IntN(5)-2) * time.Microsecond).UnixMicro()
	n := c.pickN(c.one)
	var argsOne []any
	if c.fixed {
		// No window sent; the general script's is the call's own.
		argsOne, at = []any{n, 1, now}, server.UnixMicro()
		if now != 0 {
			at = now
		}
	}
	sd, end := c.one.limit.cal.Args(at)
	r := &c.one.own.rules[0]
	if !c.fixed {
		window := windowArgsOne(sd, end, c.rng.IntN(3) == 0)
		argsOne = append(window, n, now)
		if now == 0 && c.rng.IntN(2) == 0 {
			argsOne = argsOne[:len(window)+1] // as the runner sends them: n only if not 1
			if n == 1 {
				argsOne = argsOne[:len(window)]
			}
		}
	}
	ro, errO := c.single.Run(ctx, c.b.rdb, []string{c.keyOne}, argsOne...).Result()
	rg, errG := c.gen.own.calScript.Run(ctx, c.b.rdb, []string{c.keyGen}, n, 1, now, -1, 0, "", 0, r.args[0], r.args[1], sd, end).Result()
	if errG != nil || errO != nil { // the same miss (miniredis adds the stack)
		missO, okO := missedWindow(errO)
		missG, okG := missedWindow(errG)
		require.True(c.t, okO && okG, "%s: %v, %v", c.what, errO, errG)
		require.Equal(c.t, missG, missO, c.what)
		return
	}
	require.Equal(c.t, rg, ro, "%s: n %d at %v, window of %d", c.what, n, c.now, at)
}

// On real Redis (Lua 5.1, struct.pack), single_calendar.lua replies as
// the general script does, or misses the window with the same time, and
// leaves the same state and TTL, for calls at a client's time moving
// forward (to windows' ends too) and back, each sent the window of a time
// within 2 µs of it.
func TestSingleCalendarDecidesAsGeneralRedis(t *testing.T) {
	_, rdb, _ := ownServer(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(42, 43))
	for round, zone := range calendarZones {
		rate := []int{1, 3, 10, 1000, MaxRate}[rng.IntN(5)]
		loc := loadZone(t, zone)
		l := []Limit{Daily(rate, loc), Weekly(rate, loc, time.Sunday), Monthly(rate, loc, 30)}[round%3]
		rs := newRuleSet([]rule{mustRule(t, FixedWindow, l)})
		bake(rs, &config{})
		single, fixed := calendarSingle(t, l, rs.run)
		keys := []string{fmt.Sprintf("{c%d}gen", round), fmt.Sprintf("{c%d}one", round)}
		require.NoError(t, rs.calScript.Load(ctx, rdb).Err())
		require.NoError(t, single.Load(ctx, rdb).Err())
		r := &rs.rules[0]
		now := t0.UnixMicro()
		misses := 0
		for step := range 400 {
			_, end, _ := l.cal.Window(time.UnixMicro(now))
			switch rng.IntN(6) {
			case 0:
				now -= 1 + rng.Int64N(2_000_000)
			case 1:
				now += rng.Int64N(int64(30 * time.Hour / time.Microsecond))
			case 2:
				now = end.UnixMicro() - rng.Int64N(3)
			default:
				now += rng.Int64N(1000)
			}
			at := now + rng.Int64N(5) - 2
			if fixed {
				at = now // (the fixed window's script is sent no window)
			}
			sd, stop := l.cal.Args(at)
			n := []int{0, 1, 1, 2, rng.IntN(rate + 1)}[rng.IntN(5)]
			argsOne := append(windowArgsOne(sd, stop, rng.IntN(3) == 0), n, now)
			if fixed {
				argsOne = []any{n, 1, now}
			}
			var cmds [2]*redis.Cmd
			var ttls [2]*redis.DurationCmd
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				cmds[0] = p.EvalSha(ctx, rs.calScript.Hash(), keys[:1], n, 1, now, -1, 0, "", 0, r.args[0], r.args[1], sd, stop)
				cmds[1] = p.EvalSha(ctx, single.Hash(), keys[1:], argsOne...)
				for i := range ttls {
					ttls[i] = p.PTTL(ctx, keys[i])
				}
				return nil
			})
			where := fmt.Sprintf("%v, step %d: n %d at %d, window %d to %d", l, step, n, now, sd, stop)
			if cmds[0].Err() != nil {
				missG, okG := missedWindow(cmds[0].Err())
				missO, okO := missedWindow(cmds[1].Err())
				require.True(t, okG && okO, "%s: %v, %v", where, cmds[0].Err(), cmds[1].Err())
				require.Equal(t, missG, missO, where)
				misses++
				continue
			}
			require.NoError(t, err, where)
			require.Equal(t, cmds[0].Val(), cmds[1].Val(), where)
			require.InDelta(t, ttls[0].Val(), ttls[1].Val(), float64(20*time.Millisecond), where)
			if stop-now < 10_000_000 {
				// Keys that live less than 10 s (the test's time is
				// the calls', the keys' TTLs run on Redis's clock): they
				// could expire while the test reads them or between two
				// calls of a step, on a busy machine
				// (TestSingleCalendarDecidesAsGeneral plays TTLs on
				// miniredis's clock).
				require.NoError(t, rdb.Del(ctx, keys...).Err())
				continue
			}
			require.Equal(t, dumpState(t, rdb, keys[0]), dumpState(t, rdb, keys[1]), where)
		}
		if !fixed {
			require.Positive(t, misses, "%v: no call missed its window", l)
		}
	}
}

// windowArgsOne returns the arguments that single_calendar.lua takes for
// the window of Args (startDigit, end): singleWindowArgs's, or with two
// twoWindowArgs's, which it takes for any window.
func windowArgsOne(startDigit, end int64, two bool) []any {
	w, _, needsTwo := singleWindowArgs(startDigit, end)
	if two || needsTwo {
		neg, endS := twoWindowArgs(startDigit, end)
		return []any{neg, endS}
	}
	return []any{w}
}
