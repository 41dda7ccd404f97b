package calendar

import (
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
