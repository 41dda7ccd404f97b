package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
)

// useUp takes every event key has left under a limiter of s and limit,
// and returns how many.
func useUp(t *testing.T, rdb redlimit.Limiter, key string) int {
	t.Helper()
	res, err := rdb.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	require.Positive(t, res.Remaining)
	res2, err := rdb.AllowN(context.Background(), key, res.Remaining)
	require.NoError(t, err)
	require.True(t, res2.Allowed, "%+v", res2)
	return res.Remaining
}

// reset reaches a calendar quota's keys (-calendar, -zone, -first), and
// inspect and reset a warming bucket's (-warmup): "cw-daily-Asia/Tokyo"
// and "wt1000000", not the "fw86400000000" and "tb1000000" of a limiter
// without them, which inspect showed full (remaining 10) for a key with
// none left.
func TestResetCalendarInspectWarmUp(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t) // 2030-01-01 00:00:00.25 UTC
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)

	allowT(t, rdb, redlimit.FixedWindow, redlimit.Daily(10, tokyo), "k", 3)
	const daily = "redlimit:{k}:cw-daily-Asia/Tokyo"
	require.True(t, m.Exists(daily))
	code, stdout, stderr := runT(t, "reset", "-redis", m.Addr(), "-strategy", "fixed-window", "-calendar", "day", "-zone", "Asia/Tokyo", "k")
	require.Zero(t, code, "reset -calendar: exit %d, stderr %q", code, stderr)
	assert.Equal(t, `reset "k": deleted "`+daily+`"`+"\n", stdout)
	assert.False(t, m.Exists(daily), "%s after reset", daily)
	code, _, stderr = runT(t, "reset", "-redis", m.Addr(), "-strategy", "fixed-window", "-calendar", "day", "-period", "24h", "k")
	assert.Equal(t, 2, code, "-calendar and -period: exit %d, stderr %q; want a usage error", code, stderr)

	for _, s := range []redlimit.Strategy{redlimit.TokenBucket, redlimit.LeakyBucket} {
		limit := redlimit.Limit{Rate: 10, Period: time.Second, WarmUp: 4 * time.Second}
		lim, err := redlimit.New(rdb, s, limit)
		require.NoError(t, err)
		used := useUp(t, lim, "w")
		lim.(*redlimit.RateLimiter).Close()
		state := "redlimit:{w}:" + map[redlimit.Strategy]string{redlimit.TokenBucket: "wt", redlimit.LeakyBucket: "wl"}[s] + "1000000"
		require.True(t, m.Exists(state), "%v: %s", s, m.Keys())
		args := []string{"-redis", m.Addr(), "-strategy", s.String(), "-period", "1s", "-warmup", "4s", "w"}
		code, stdout, stderr := runT(t, append([]string{"inspect", "-rate", "10"}, args...)...)
		require.Zero(t, code, "%v: inspect -warmup: exit %d, stderr %q", s, code, stderr)
		assert.Equal(t, "0", field(stdout, "remaining"), "%v: %d used\n%s", s, used, stdout)
		assert.Equal(t, "10/1s warm-up 4s", field(stdout, "limit"), "%v\n%s", s, stdout)
		assert.NotEmpty(t, rowOf(stdout, strconv.Quote(state)), "%v: no row for %s\n%s", s, state, stdout)
		code, stdout, stderr = runT(t, append([]string{"reset"}, args...)...)
		require.Zero(t, code, "%v: reset -warmup: exit %d, stderr %q", s, code, stderr)
		assert.Equal(t, `reset "w": deleted "`+state+`"`+"\n", stdout, s)
		assert.Empty(t, m.Keys(), s)
	}
}

// -rule describes a calendar quota (RATE/day, week[-WEEKDAY] or
// month[-DAY], then @ZONE) and a warming bucket (:warmup=D): inspect shows
// each rule's state from its own key, and reset deletes them.
func TestRuleCalendarWarmUp(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t) // 2030-01-01 00:00:00.25 UTC, a Tuesday
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "daily", Strategy: redlimit.FixedWindow, Limit: redlimit.Daily(100, ny)},
		{Name: "weekly", Strategy: redlimit.FixedWindow, Limit: redlimit.Weekly(500, nil, time.Saturday)},
		{Name: "monthly", Strategy: redlimit.FixedWindow, Limit: redlimit.Monthly(1000, ny, 31)},
		{Name: "rps", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 10, Period: time.Second, WarmUp: 4 * time.Second}},
	})
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	used := useUp(t, pol, "k")
	rules := []string{
		"-rule", "daily=fixed-window:100/day@America/New_York",
		"-rule", "weekly=fixed-window:500/week-saturday",
		"-rule", "monthly=fixed-window:1000/month-31@America/New_York",
		"-rule", "rps=token-bucket:10/1s:warmup=4s",
	}
	code, stdout, stderr := runT(t, append(append([]string{"inspect", "-timeout", "5s", "-redis", m.Addr()}, rules...), "k")...)
	require.Zero(t, code, "inspect: exit %d, stderr %q", code, stderr)
	assert.Equal(t, "0 (rule rps)", field(stdout, "remaining"), "%d used\n%s", used, stdout)
	assert.Equal(t, "fixed-window 100/day America/New_York "+strconv.Itoa(used)+" of 100 counted in this window, which ends in 4h59m59.75s", field(stdout, "daily"), stdout)
	assert.Regexp(t, `^token-bucket 10/1s warm-up 4s `, field(stdout, "rps"), stdout)
	keys := []string{"redlimit:{k}:cw-daily-America/New_York", "redlimit:{k}:cw-monthly-31-America/New_York", "redlimit:{k}:cw-weekly-6-UTC", "redlimit:{k}:wt1000000"}
	require.Equal(t, keys, m.Keys())
	for _, k := range keys {
		assert.NotEmpty(t, rowOf(stdout, strconv.Quote(k)), "no row for %s\n%s", k, stdout)
	}
	code, stdout, stderr = runT(t, append(append([]string{"reset", "-timeout", "5s", "-redis", m.Addr()}, rules...), "k")...)
	require.Zero(t, code, "reset: exit %d, stderr %q", code, stderr)
	assert.Equal(t, `reset "k": deleted "`+keys[0]+`", "`+keys[2]+`", "`+keys[1]+`", "`+keys[3]+`"`+"\n", stdout)
	assert.Empty(t, m.Keys())

	for _, bad := range []string{"d=fixed-window:1/day@Mars/Olympus", "d=fixed-window:1/fortnight", "d=fixed-window:1/week-funday",
		"d=fixed-window:1/month-32", "d=token-bucket:1/day", "w=token-bucket:1/1s:warmup=soon", "w=token-bucket:1/1s:5:6"} {
		code, _, stderr := runT(t, "inspect", "-redis", m.Addr(), "-rule", bad, "k")
		assert.Equal(t, 2, code, "%s: exit %d, stderr %q; want a usage error", bad, code, stderr)
	}
}
