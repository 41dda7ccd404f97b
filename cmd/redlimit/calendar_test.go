package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
)

// A calendar quota in simulate: the fixed window's days are New York's
// (the clock starts at its midnight before 2030-01-01 UTC), so three days
// of steady traffic admit exactly 3 × rate.
func TestSimulateCalendar(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"simulate", "-calendar", "day", "-zone", "America/New_York", "-rate", "100",
		"-duration", "72h", "-offered", "0.002", "-out", filepath.Join(t.TempDir(), "c.png")}, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	assert.Equal(t, []string{"fixed-window", "518", "300", "100", "0s"}, rowOf(stdout.String(), "fixed-window"), stdout.String())
	assert.Contains(t, stdout.String(), "the calendar quota 100/day America/New_York, from 2029-12-31T00:00:00-05:00")

	for _, args := range [][]string{
		{"-calendar", "year"},
		{"-calendar", "month", "-first", "32"},
		{"-calendar", "week", "-first", "Funday"},
		{"-calendar", "day", "-zone", "Mars/Olympus"},
		{"-calendar", "day", "-period", "1h"},
	} {
		code := run(context.Background(), append([]string{"simulate", "-out", filepath.Join(t.TempDir(), "c.png")}, args...), &stdout, &stderr)
		assert.Equal(t, 2, code, "%v: exit %d, want a usage error", args, code)
	}
}

// inspect of a calendar quota: its keys are the library's, and it shows
// the window that holds the server's time, local start and end.
func TestInspectCalendar(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t) // 2030-01-01 00:00:00.25 UTC
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	for _, c := range []struct {
		limit  redlimit.Limit
		args   []string
		state  string
		window string
	}{
		{redlimit.Daily(10, tokyo), []string{"-calendar", "day", "-zone", "Asia/Tokyo"}, "redlimit:{k}:cw-daily-Asia/Tokyo",
			"2030-01-01T00:00:00+09:00 to 2030-01-02T00:00:00+09:00 (24h0m0s)"},
		{redlimit.Weekly(10, nil, time.Saturday), []string{"-calendar", "week", "-first", "saturday"}, "redlimit:{k}:cw-weekly-6-UTC",
			"2029-12-29T00:00:00Z to 2030-01-05T00:00:00Z (168h0m0s)"},
		{redlimit.Monthly(10, tokyo, 31), []string{"-calendar", "month", "-first", "31", "-zone", "Asia/Tokyo"}, "redlimit:{k}:cw-monthly-31-Asia/Tokyo",
			"2029-12-31T00:00:00+09:00 to 2030-01-31T00:00:00+09:00 (744h0m0s)"},
	} {
		allowT(t, rdb, redlimit.FixedWindow, c.limit, "k", 3)
		require.Equal(t, []string{c.state}, m.Keys(), "%v: the library's key", c.limit)
		args := append([]string{"inspect", "-redis", m.Addr(), "-strategy", "fixed-window", "-rate", "10"}, c.args...)
		code, stdout, stderr := runT(t, append(args, "k")...)
		require.Zero(t, code, "%v: exit %d, stderr %q", c.limit, code, stderr)
		assert.Equal(t, c.window, field(stdout, "window"), "%v\n%s", c.limit, stdout)
		assert.Equal(t, "7", field(stdout, "remaining"), "%v\n%s", c.limit, stdout)
		row := rowOf(stdout, strconv.Quote(c.state))
		require.NotEmpty(t, row, "%v: no row for %s\n%s", c.limit, c.state, stdout)
		m.FlushAll()
	}
}
