package redlimit

import (
	"archive/zip"
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/calendar"
)

// tzZones returns the names of the zones of the tz database: the Zone lines
// of the system's tzdata.zi, or else the files of Go's own zoneinfo.zip
// (links are other names of these zones, left out).
func tzZones(t testing.TB) []string {
	t.Helper()
	var names []string
	if f, err := os.Open("/usr/share/zoneinfo/tzdata.zi"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if name, ok := strings.CutPrefix(sc.Text(), "Z "); ok {
				names = append(names, strings.Fields(name)[0])
			}
		}
		require.NoError(t, sc.Err())
		return names
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	require.NoError(t, err, "no list of the tz database's zones: no /usr/share/zoneinfo/tzdata.zi, and go env GOROOT failed")
	z, err := zip.OpenReader(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "time", "zoneinfo.zip"))
	require.NoError(t, err, "no list of the tz database's zones: neither /usr/share/zoneinfo/tzdata.zi nor Go's zoneinfo.zip")
	defer z.Close()
	for _, f := range z.File {
		if !strings.HasSuffix(f.Name, "/") {
			names = append(names, f.Name)
		}
	}
	return names
}

// localDay returns the number of t's local date in loc (days since
// 1970-01-01).
func localDay(t time.Time, loc *time.Location) int64 {
	y, m, d := t.In(loc).Date()
	return calendar.CivilDay(y, m, d)
}

// Every zone of the tz database, 2000–2040: around each change of offset
// (the µs before it and the change itself), the window of a day, of a week
// and of a month that start on the local dates there holds the instant, is
// not empty, starts and ends at the first instant of a local date (its
// midnight, or where the zone skips that midnight the end of the skipped
// time), and meets its neighbours; a day's window is the instant's own
// local date. Where daylight saving starts at 00:00 (America/Havana
// 2025-03-09) time.Date puts midnight an hour early, and a day can be
// skipped whole (Pacific/Apia 2011-12-30).
func TestCalendarWindowsEveryZone(t *testing.T) {
	names := tzZones(t)
	require.Greater(t, len(names), 300, "zones in the tz database")
	from, to := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2041, 1, 1, 0, 0, 0, 0, time.UTC)
	var zones, changes, checked int
	var wrong []string
	wrongZones := map[string]bool{}
	for _, name := range names {
		loc, err := time.LoadLocation(name)
		require.NoError(t, err, "zone %s", name)
		zones++
		for at := from.In(loc); at.Before(to); {
			_, next := at.ZoneBounds()
			if next.IsZero() || !next.Before(to) {
				break
			}
			if !next.After(at) {
				// ZoneBounds, past a zone's last listed change, ends a leap
				// year's last period a day early (Dec 31, 2040): not a
				// change; go on from the next day.
				next = at.Add(24 * time.Hour)
			}
			at = next
			changes++
			for _, p := range []time.Time{at.Add(-time.Microsecond), at} {
				lp := p.In(loc)
				for _, l := range []Limit{Daily(1, loc), Weekly(1, loc, lp.Weekday()), Monthly(1, loc, lp.Day())} {
					checked++
					if msg := checkWindow(l, p); msg != "" {
						wrong = append(wrong, msg)
						wrongZones[name] = true
					}
				}
			}
		}
	}
	t.Logf("%d zones, %d changes of offset, %d windows checked", zones, changes, checked)
	require.Greater(t, changes, 10000, "changes of offset 2000–2040")
	for _, msg := range wrong[:min(len(wrong), 10)] {
		t.Error(msg)
	}
	assert.Zero(t, len(wrong), "%d of %d windows wrong, in %d of %d zones", len(wrong), checked, len(wrongZones), zones)
}

// checkWindow checks the window of l that holds p and its neighbours (see
// TestCalendarWindowsEveryZone): it returns what is wrong, or "".
func checkWindow(l Limit, p time.Time) string {
	loc := l.cal.Loc
	at := func(x time.Time) string { return x.In(loc).Format("2006-01-02 15:04:05.999999 MST") }
	s, e, idx := l.cal.Window(p)
	if p.Before(s) || !p.Before(e) {
		return fmt.Sprintf("%v at %s: window [%s, %s) does not hold it", l, at(p), at(s), at(e))
	}
	for _, b := range []time.Time{s, e} {
		if localDay(b.Add(-time.Nanosecond), loc) >= localDay(b, loc) {
			return fmt.Sprintf("%v at %s: window [%s, %s): %s is not the first instant of its local date", l, at(p), at(s), at(e), at(b))
		}
	}
	// A day's window is the instant's own local date, or the next one where
	// the clocks went back past midnight after it began (America/Goose_Bay
	// until 2011: from 00:01 back to 23:01), as s <= p shows.
	if day := localDay(p, loc); l.cal.Kind == calendar.Day && localDay(s, loc) != day && localDay(s, loc) != day+1 {
		return fmt.Sprintf("%v at %s: the day's window starts at %s", l, at(p), at(s))
	}
	for _, q := range []time.Time{s, e.Add(-time.Microsecond)} {
		if qs, qe, qi := l.cal.Window(q); !qs.Equal(s) || !qe.Equal(e) || qi != idx {
			return fmt.Sprintf("%v at %s: window [%s, %s) #%d, at %s [%s, %s) #%d", l, at(p), at(s), at(e), idx, at(q), at(qs), at(qe), qi)
		}
	}
	ns, _, ni := l.cal.Window(e)
	_, pe, pi := l.cal.Window(s.Add(-time.Microsecond))
	if !ns.Equal(e) || !pe.Equal(s) || pi >= idx || idx >= ni {
		return fmt.Sprintf("%v at %s: window [%s, %s) #%d; the next starts at %s #%d, the previous ends at %s #%d", l, at(p), at(s), at(e), idx, at(ns), ni, at(pe), pi)
	}
	return ""
}

// A call in the hour before a skipped midnight, and on a day that a zone
// skips whole, is decided (it failed with "the calendar window missed the
// server's time 5 times"): America/Havana's day of 2025-03-08 ends at
// 01:00 on the 9th (the clocks go from 00:00 to 01:00), 23 hours long;
// Pacific/Apia's 2011-12-29 ends when its clocks go from 24:00 to 00:00 on
// the 31st.
func TestCalendarSkippedMidnight(t *testing.T) {
	for _, c := range []struct {
		zone      string
		at        func(*time.Location) time.Time
		remaining int
		reset     time.Duration
		next      time.Duration // the next day's length
	}{
		{"America/Havana", func(loc *time.Location) time.Time { return time.Date(2025, 3, 8, 23, 30, 0, 0, loc) }, 2, 30 * time.Minute, 23 * time.Hour},
		{"America/Santiago", func(loc *time.Location) time.Time { return time.Date(2025, 9, 6, 23, 15, 0, 0, loc) }, 2, 45 * time.Minute, 23 * time.Hour},
		{"Atlantic/Azores", func(loc *time.Location) time.Time { return time.Date(2025, 3, 29, 23, 59, 0, 0, loc) }, 2, time.Minute, 23 * time.Hour},
		{"Pacific/Apia", func(loc *time.Location) time.Time { return time.Date(2011, 12, 29, 12, 0, 0, 0, loc) }, 2, 12 * time.Hour, 24 * time.Hour},
	} {
		t.Run(c.zone, func(t *testing.T) {
			b, _ := miniBackend(t)
			loc := loadZone(t, c.zone)
			b.at(c.at(loc))
			lim := newLimiter(t, b.rdb, FixedWindow, Daily(3, loc))
			run(t, b, lim, "k", []step{
				{n: 1, allowed: true, remaining: c.remaining, reset: c.reset},
				{n: 3, allowed: false, remaining: c.remaining, retry: c.reset, reset: c.reset},
				{advance: c.reset - time.Microsecond, n: 2, allowed: true, remaining: 0, reset: time.Microsecond},
				{advance: time.Microsecond, n: 1, allowed: true, remaining: 2, reset: c.next},
			})
		})
	}
}
