// Package calendar holds the windows of calendar quotas: days, weeks or
// months in a time zone, not multiples of a period since the Unix epoch,
// and the arguments that scripts/calendar.lua takes for the window of a
// call.
package calendar

import (
	"strconv"
	"time"
)

// Calendar is a calendar quota's calendar. The zero value is no calendar.
type Calendar struct {
	Kind Kind
	// Day is the week's first day (a time.Weekday) for Week, the month's
	// first day (1–31) for Month.
	Day int
	Loc *time.Location // never nil in a calendar: UTC for nil
}

// Kind is a calendar's window: a day, a week or a month.
type Kind uint8

// The kinds of calendars.
const (
	Day Kind = iota + 1
	Week
	Month
)

// The nominal Periods of calendar limits: a calendar limit's Period holds
// its calendar's nominal length, which the in-process fallback's stand-in
// and the HTTP quota headers use; the windows themselves follow the
// calendar.
const (
	DayPeriod   = 24 * time.Hour
	WeekPeriod  = 7 * DayPeriod
	MonthPeriod = 31 * DayPeriod // the longest month
)

// Check returns what is wrong with c, or "".
func (c Calendar) Check() string {
	switch {
	case c.Loc == nil:
		return "the calendar has no time zone"
	case c.Kind == Week && (c.Day < 0 || c.Day > 6):
		return "the week's first day " + strconv.Itoa(c.Day) + " is not a time.Weekday"
	case c.Kind == Month && (c.Day < 1 || c.Day > 31):
		return "the month's first day " + strconv.Itoa(c.Day) + " must be between 1 and 31"
	case c.Kind > Month:
		return "unknown calendar"
	}
	return ""
}

// Period returns the nominal Period of c's limits.
func (c Calendar) Period() time.Duration {
	switch c.Kind {
	case Day:
		return DayPeriod
	case Week:
		return WeekPeriod
	}
	return MonthPeriod
}

// String names the calendar and its zone: "day Asia/Tokyo", "week from
// Monday UTC", "month from day 31 America/New_York".
func (c Calendar) String() string {
	switch c.Kind {
	case Day:
		return "day " + c.Loc.String()
	case Week:
		return "week from " + time.Weekday(c.Day).String() + " " + c.Loc.String()
	}
	return "month from day " + strconv.Itoa(c.Day) + " " + c.Loc.String()
}

// Name is c in a rule's default name and its state key's suffix: "daily",
// "weekly-1" (from Monday), "monthly-31", then "-" and the zone's name.
func (c Calendar) Name() string {
	var s string
	switch c.Kind {
	case Day:
		s = "daily"
	case Week:
		s = "weekly-" + strconv.Itoa(c.Day)
	default:
		s = "monthly-" + strconv.Itoa(c.Day)
	}
	return s + "-" + c.Loc.String()
}

// Window returns the window of c that holds t, [start, end), and its
// index: a number that grows from each window to the next (the local
// day's, the week's or the month's number; by two after a date that the
// zone skips whole), whose last digit the script keeps with the count (see
// scripts/calendar.lua). A window holds the instants whose local dates are
// its dates: it starts at the first instant of its first date (see
// dateStart) and ends at the first instant of the next window's.
func (c Calendar) Window(t time.Time) (start, end time.Time, index int64) {
	t = t.In(c.Loc)
	y, m, d := t.Date()
	switch c.Kind {
	case Day:
		start, end, index = c.dateStart(y, m, d), c.dateStart(y, m, d+1), CivilDay(y, m, d)
		if !t.Before(end) { // a local date that repeats after the next one began (see dateStart)
			start, end, index = end, c.dateStart(y, m, d+2), index+1
		}
		return start, end, index
	case Week:
		d -= (int(t.Weekday()) - c.Day + 7) % 7
		start, end = c.dateStart(y, m, d), c.dateStart(y, m, d+7)
		if !t.Before(end) {
			start, end, d = end, c.dateStart(y, m, d+14), d+7
		}
		return start, end, floorDiv(CivilDay(y, m, d), 7)
	}
	// first returns the month's first date, normalised as time.Date does
	// (13 is next year's January); day 0 of the next month is this month's
	// last day.
	first := func(y int, m time.Month) (time.Month, int) {
		return m, min(c.Day, time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day())
	}
	if _, fd := first(y, m); d < fd {
		m--
	}
	m0, d0 := first(y, m)
	m1, d1 := first(y, m+1)
	start, end = c.dateStart(y, m0, d0), c.dateStart(y, m1, d1)
	if !t.Before(end) {
		m++
		m2, d2 := first(y, m+1)
		start, end = end, c.dateStart(y, m2, d2)
	}
	return start, end, int64(y)*12 + int64(m) - 1
}

// dateStart returns the first instant of the local date y-m-d (normalised
// as time.Date does) in c's zone: its midnight; where a change of offset
// skips that midnight, the change (the clocks go from 00:00 to 01:00, or
// from the day before to the day after when a date is skipped whole);
// where the date starts twice (a change back over midnight), its first
// start. time.Date resolves a skipped or repeated midnight in either zone
// of the change (an hour early, in the day before, or the second time), so
// near a change the zone's periods are walked instead.
func (c Calendar) dateStart(y int, m time.Month, d int) time.Time {
	day := CivilDay(y, m, d)
	mid := day * 86400 // the date's midnight at offset 0, in s
	// Zones' offsets stay within ±26 h: no instant before mid-27h is on
	// the date or later, and within one period of the zone the local time
	// grows with time.
	const span = 27 * 3600
	t := time.Date(y, m, d, 0, 0, 0, 0, c.Loc)
	if c.localDay(t) >= day {
		if s, _ := t.ZoneBounds(); s.IsZero() || s.Unix() <= mid-span {
			return t
		}
	}
	// The first instant on the date or later: in the first period of the
	// zone from mid-span that has one, its midnight in the period's offset
	// or the period's start. Changes are whole seconds.
	p := time.Unix(mid-span, 0).In(c.Loc)
	for range 8 {
		_, offset := p.Zone()
		_, end := p.ZoneBounds()
		x := time.Unix(max(p.Unix(), mid-int64(offset)), 0).In(c.Loc)
		if end.IsZero() || x.Before(end) {
			return x
		}
		if !end.After(p) {
			break // ZoneBounds' end of a leap year's last period, a day early (2040): no change
		}
		p = end
	}
	return t
}

// localDay returns the number of t's local date in c's zone (see
// CivilDay).
func (c Calendar) localDay(t time.Time) int64 {
	y, m, d := t.In(c.Loc).Date()
	return CivilDay(y, m, d)
}

// CivilDay returns the number of the date y-m-d (normalised as time.Date
// does) in days since 1970-01-01.
func CivilDay(y int, m time.Month, d int) int64 {
	return floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), 86400)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Fixed returns, for a day or a week in a zone that keeps one offset from t
// on (ZoneBounds: no change ahead, as in UTC or Asia/Tokyo), the length of
// its windows and the shift, both in µs, that make them fixed windows: from
// the start of the zone's period that holds t, the window that holds an
// instant u is the one of index floor((u + shift) / period) (µs), as Window
// gives it, and ends at (index + 1) × period − shift. ok is false for a
// month, or where the zone changes its offset after t.
func (c Calendar) Fixed(t time.Time) (period, shift int64, ok bool) {
	t = t.In(c.Loc)
	if _, end := t.ZoneBounds(); c.Kind == Month || !end.IsZero() {
		return 0, 0, false
	}
	_, offset := t.Zone()
	const day = int64(86400 * time.Second / time.Microsecond)
	shift = int64(offset) * int64(time.Second/time.Microsecond)
	if c.Kind == Day {
		return day, shift, true
	}
	// A week's index is its first date's number (CivilDay) over 7, floored:
	// weeks start on the dates whose number is r modulo 7 (1970-01-01, day
	// 0, was a Thursday).
	r := int64(c.Day-int(time.Thursday)+7) % 7
	return 7 * day, shift - r*day, true
}

// Args returns the period and burst arguments of a calendar rule
// for a call whose time is about nowUS (µs): its window's start, plus the
// last digit of the window's index (a start is a whole second, whose last
// digit in µs is free), and its end, in µs (see scripts/calendar.lua).
func (c Calendar) Args(nowUS int64) (startDigit, end int64) {
	s, e, index := c.Window(time.UnixMicro(nowUS))
	return s.UnixMicro() + (index%10+10)%10, e.UnixMicro()
}
