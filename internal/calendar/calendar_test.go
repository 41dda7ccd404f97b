package calendar

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWindow(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, ny) // the day the clocks go forward
	cases := []struct {
		name       string
		c          Calendar
		start, end time.Time
	}{
		{"a 23-hour day", Calendar{Kind: Day, Loc: ny}, time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"a week from Monday", Calendar{Kind: Week, Day: int(time.Monday), Loc: ny}, time.Date(2026, 3, 2, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"a month from day 31", Calendar{Kind: Month, Day: 31, Loc: time.UTC}, time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, e, idx := tc.c.Window(at)
			assert.True(t, tc.start.Equal(s), "start %v, want %v", s, tc.start)
			assert.True(t, tc.end.Equal(e), "end %v, want %v", e, tc.end)
			_, _, next := tc.c.Window(e)
			assert.Equal(t, idx+1, next, "the next window's index")
			sd, end := tc.c.Args(at.UnixMicro())
			assert.Equal(t, s.UnixMicro()+idx%10, sd, "the start carries the index's last digit")
			assert.Equal(t, e.UnixMicro(), end)
		})
	}
	assert.Equal(t, 23*time.Hour, cases[0].end.Sub(cases[0].start))
}

func TestCheckAndNames(t *testing.T) {
	assert.Empty(t, Calendar{Kind: Month, Day: 31, Loc: time.UTC}.Check())
	assert.NotEmpty(t, Calendar{Kind: Month, Day: 32, Loc: time.UTC}.Check())
	assert.NotEmpty(t, Calendar{Kind: Week, Day: 7, Loc: time.UTC}.Check())
	assert.NotEmpty(t, Calendar{Kind: Day}.Check(), "no zone")
	assert.NotEmpty(t, Calendar{Kind: Month + 1, Loc: time.UTC}.Check())
	assert.Equal(t, "weekly-1-UTC", Calendar{Kind: Week, Day: 1, Loc: time.UTC}.Name())
	assert.Equal(t, "week from Monday UTC", Calendar{Kind: Week, Day: 1, Loc: time.UTC}.String())
	assert.Equal(t, MonthPeriod, Calendar{Kind: Month, Day: 1}.Period())
	assert.Equal(t, int64(0), CivilDay(1970, 1, 1))
	assert.Equal(t, int64(-1), CivilDay(1969, 12, 31))
}

// A day or a week in a zone of one offset is a fixed window, shifted: at
// random instants over two centuries from 1970, and at windows' edges,
// Fixed's index, start and end are Window's. A month, or a zone with
// changes ahead, is not.
func TestFixed(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var zones []*time.Location
	for _, name := range []string{"UTC", "Asia/Tokyo", "Asia/Kolkata"} {
		loc, err := time.LoadLocation(name)
		require.NoError(t, err)
		zones = append(zones, loc)
	}
	zones = append(zones, time.FixedZone("-03:30", -(3*3600+1800)), time.FixedZone("+14", 14*3600))
	rng := rand.New(rand.NewPCG(7, 12))
	for _, loc := range zones {
		cals := []Calendar{{Kind: Day, Loc: loc}}
		for d := range 7 {
			cals = append(cals, Calendar{Kind: Week, Day: d, Loc: loc})
		}
		for _, c := range cals {
			period, shift, ok := c.Fixed(now)
			require.True(t, ok, "%v", c)
			check := func(u time.Time) {
				s, e, idx := c.Window(u)
				us := u.UnixMicro()
				w := us + shift
				i := w / period
				if w%period < 0 {
					i--
				}
				require.Equal(t, idx, i, "%v at %v", c, u)
				require.Equal(t, s.UnixMicro(), i*period-shift, "%v at %v: start", c, u)
				require.Equal(t, e.UnixMicro(), (i+1)*period-shift, "%v at %v: end", c, u)
			}
			for range 2000 {
				u := time.Unix(rng.Int64N(200*365*86400), rng.Int64N(1e9)).UTC()
				if s, _ := now.In(loc).ZoneBounds(); u.Before(s) {
					continue // before the zone's last change (Tokyo: 1951)
				}
				check(u)
				_, e, _ := c.Window(u)
				check(e)
				check(e.Add(-time.Microsecond))
			}
		}
	}
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	for _, c := range []Calendar{{Kind: Day, Loc: ny}, {Kind: Week, Day: 1, Loc: ny}, {Kind: Month, Day: 1, Loc: time.UTC}} {
		_, _, ok := c.Fixed(now)
		assert.False(t, ok, "%v", c)
	}
}
