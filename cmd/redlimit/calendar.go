package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// calendarFlags choose a calendar limit (redlimit.Daily, Weekly or
// Monthly) instead of -period.
type calendarFlags struct {
	calendar string
	zone     string
	first    string
}

func (f *calendarFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.calendar, "calendar", "", "a calendar quota instead of -period: `day`, week or month in -zone (fixed-window only)")
	fs.StringVar(&f.zone, "zone", "UTC", "the calendar's time `zone`, an IANA name such as Asia/Tokyo")
	fs.StringVar(&f.first, "first", "", "the calendar's first `day`: of the week, a weekday name (default Monday); of the month, 1 to 31 (default 1)")
}

// limit returns the calendar limit of rate that f chooses; ok is false
// when -calendar is not given.
func (f *calendarFlags) limit(cmd string, rate int) (l redlimit.Limit, ok bool, err error) {
	if f.calendar == "" {
		if f.first != "" {
			return l, false, usagef(cmd, "-first is for -calendar week or month")
		}
		return l, false, nil
	}
	loc, err := time.LoadLocation(f.zone)
	if err != nil {
		return l, false, usagef(cmd, "-zone %q: %v", f.zone, err)
	}
	switch f.calendar {
	case "day":
		if f.first != "" {
			return l, false, usagef(cmd, "-first is for -calendar week or month")
		}
		return redlimit.Daily(rate, loc), true, nil
	case "week":
		first := time.Monday
		if f.first != "" {
			if first, ok = parseWeekday(f.first); !ok {
				return l, false, usagef(cmd, "-first %q: want a weekday name, such as Monday", f.first)
			}
		}
		return redlimit.Weekly(rate, loc, first), true, nil
	case "month":
		day := 1
		if f.first != "" {
			if day, err = strconv.Atoi(f.first); err != nil {
				return l, false, usagef(cmd, "-first %q: want a day of the month, 1 to 31", f.first)
			}
		}
		return redlimit.Monthly(rate, loc, day), true, nil
	}
	return l, false, usagef(cmd, "-calendar %q: want day, week or month", f.calendar)
}

// calendarPeriod returns the calendar limit of rate that a -rule's PERIOD
// names: day, week[-WEEKDAY] (from Monday by default) or month[-DAY]
// (from day 1 by default), then @ZONE (UTC by default), as the -calendar,
// -first and -zone flags would; ok is false for any other PERIOD (a
// duration).
func calendarPeriod(rate int, period string) (l redlimit.Limit, ok bool, err error) {
	period, zone, hasZone := strings.Cut(period, "@")
	kind, first, _ := strings.Cut(period, "-")
	switch kind {
	case "day", "week", "month":
	default:
		if hasZone {
			return l, false, fmt.Errorf("@%s: a zone is for a calendar's day, week or month", zone)
		}
		return l, false, nil
	}
	f := calendarFlags{calendar: kind, zone: "UTC", first: first}
	if hasZone {
		f.zone = zone
	}
	l, ok, err = f.limit("", rate)
	if err != nil {
		var uerr *usageError
		if errors.As(err, &uerr) {
			err = errors.New(uerr.msg)
		}
	}
	return l, ok, err
}

func parseWeekday(s string) (time.Weekday, bool) {
	for d := time.Sunday; d <= time.Saturday; d++ {
		if strings.EqualFold(d.String(), s) {
			return d, true
		}
	}
	return 0, false
}

// calendarCode returns the part of a calendar limit's state key after the
// hash tag, as the package names it: "cw-daily-Asia/Tokyo",
// "cw-weekly-1-UTC" (from Monday), "cw-monthly-31-America/New_York"; ok is
// false for a limit that is not a calendar's. It reads l.String ("10/day
// Asia/Tokyo", "10/week from Monday UTC", "10/month from day 31 UTC"); the
// tests check it against the keys the library writes.
func calendarCode(l redlimit.Limit) (string, bool) {
	if _, _, ok := l.Window(time.Time{}); !ok {
		return "", false
	}
	_, s, _ := strings.Cut(l.String(), "/")
	f := strings.Fields(s)
	zone := f[len(f)-1]
	switch {
	case f[0] == "day" && len(f) == 2:
		return "cw-daily-" + zone, true
	case f[0] == "week" && len(f) == 4:
		d, ok := parseWeekday(f[2])
		return "cw-weekly-" + strconv.Itoa(int(d)) + "-" + zone, ok
	case f[0] == "month" && len(f) == 5:
		return "cw-monthly-" + f[3] + "-" + zone, true
	}
	return "", false
}
