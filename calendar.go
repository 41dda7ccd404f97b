package redlimit

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// calendar is what makes a Limit a calendar quota (see [Daily], [Weekly]
// and [Monthly]): its windows are days, weeks or months in a time zone,
// not multiples of Period since the Unix epoch. The zero value is no
// calendar.
type calendar struct {
	kind calendarKind
	// day is the week's first day (a time.Weekday) for calendarWeek, the
	// month's first day (1–31) for calendarMonth.
	day int
	loc *time.Location // never nil in a calendar: UTC for nil
}

type calendarKind uint8

const (
	calendarDay calendarKind = iota + 1
	calendarWeek
	calendarMonth
)

// Nominal Periods of calendar limits: a calendar limit's Period holds its
// calendar's nominal length, which the in-process fallback's stand-in and
// the HTTP quota headers use; the windows themselves follow the calendar.
const (
	dayPeriod   = 24 * time.Hour
	weekPeriod  = 7 * dayPeriod
	monthPeriod = 31 * dayPeriod // the longest month
)

// Daily returns a calendar limit for FixedWindow: rate events per calendar
// day in loc (nil means UTC). A day starts at local midnight (where a
// daylight-saving change skips midnight, when the clocks jump to 01:00),
// so a day of a daylight-saving change lasts 23 or 25 hours. Its Period
// is 24h, the nominal length; the windows follow the calendar.
func Daily(rate int, loc *time.Location) Limit {
	return Limit{Rate: rate, Period: dayPeriod, cal: calendar{kind: calendarDay, loc: orUTC(loc)}}
}

// Weekly returns a calendar limit for FixedWindow: rate events per calendar
// week in loc (nil means UTC), a week starting at 00:00 on first. Its
// Period is 7×24h, the nominal length.
func Weekly(rate int, loc *time.Location, first time.Weekday) Limit {
	return Limit{Rate: rate, Period: weekPeriod, cal: calendar{kind: calendarWeek, day: int(first), loc: orUTC(loc)}}
}

// Monthly returns a calendar limit for FixedWindow: rate events per
// calendar month in loc (nil means UTC), a month starting at 00:00 on
// firstDay (1–31; a month with fewer days starts on its last day, so
// firstDay 31 gives Jan 31, Feb 28, Mar 31, Apr 30, ...). Its Period is
// 31×24h, the longest month. A firstDay outside 1–31 makes the limit
// invalid: the constructors return an error wrapping ErrInvalidLimit.
func Monthly(rate int, loc *time.Location, firstDay int) Limit {
	return Limit{Rate: rate, Period: monthPeriod, cal: calendar{kind: calendarMonth, day: firstDay, loc: orUTC(loc)}}
}

func orUTC(loc *time.Location) *time.Location {
	if loc == nil {
		return time.UTC
	}
	return loc
}

// isCalendar reports whether l is a calendar limit.
func (l Limit) isCalendar() bool { return l.cal.kind != 0 }

// Window returns the calendar window of l that holds t: its start and its
// end (the next window's start), in l's time zone. ok is false when l is
// not a calendar limit. It is the window a call decided at t counts in.
func (l Limit) Window(t time.Time) (start, end time.Time, ok bool) {
	if !l.isCalendar() || l.cal.check() != "" {
		return time.Time{}, time.Time{}, false
	}
	start, end, _ = l.cal.window(t)
	return start, end, true
}

// check returns what is wrong with c, or "".
func (c calendar) check() string {
	switch {
	case c.loc == nil:
		return "the calendar has no time zone"
	case c.kind == calendarWeek && (c.day < 0 || c.day > 6):
		return "the week's first day " + strconv.Itoa(c.day) + " is not a time.Weekday"
	case c.kind == calendarMonth && (c.day < 1 || c.day > 31):
		return "the month's first day " + strconv.Itoa(c.day) + " must be between 1 and 31"
	case c.kind > calendarMonth:
		return "unknown calendar"
	}
	return ""
}

// period returns the nominal Period of c's limits.
func (c calendar) period() time.Duration {
	switch c.kind {
	case calendarDay:
		return dayPeriod
	case calendarWeek:
		return weekPeriod
	}
	return monthPeriod
}

// String names the calendar and its zone: "day Asia/Tokyo", "week from
// Monday UTC", "month from day 31 America/New_York".
func (c calendar) String() string {
	switch c.kind {
	case calendarDay:
		return "day " + c.loc.String()
	case calendarWeek:
		return "week from " + time.Weekday(c.day).String() + " " + c.loc.String()
	}
	return "month from day " + strconv.Itoa(c.day) + " " + c.loc.String()
}

// name is c in a rule's default name and its state key's suffix: "daily",
// "weekly-1" (from Monday), "monthly-31", then "-" and the zone's name.
func (c calendar) name() string {
	var s string
	switch c.kind {
	case calendarDay:
		s = "daily"
	case calendarWeek:
		s = "weekly-" + strconv.Itoa(c.day)
	default:
		s = "monthly-" + strconv.Itoa(c.day)
	}
	return s + "-" + c.loc.String()
}

// window returns the window of c that holds t, [start, end), and its
// index: a number that grows from each window to the next (the local
// day's, the week's or the month's number; by two after a date that the
// zone skips whole), whose last digit the script keeps with the count (see
// scripts/calendar.lua). A window holds the instants whose local dates are
// its dates: it starts at the first instant of its first date (see
// dateStart) and ends at the first instant of the next window's.
func (c calendar) window(t time.Time) (start, end time.Time, index int64) {
	t = t.In(c.loc)
	y, m, d := t.Date()
	switch c.kind {
	case calendarDay:
		start, end, index = c.dateStart(y, m, d), c.dateStart(y, m, d+1), civilDay(y, m, d)
		if !t.Before(end) { // a local date that repeats after the next one began (see dateStart)
			start, end, index = end, c.dateStart(y, m, d+2), index+1
		}
		return start, end, index
	case calendarWeek:
		d -= (int(t.Weekday()) - c.day + 7) % 7
		start, end = c.dateStart(y, m, d), c.dateStart(y, m, d+7)
		if !t.Before(end) {
			start, end, d = end, c.dateStart(y, m, d+14), d+7
		}
		return start, end, floorDiv(civilDay(y, m, d), 7)
	}
	// first returns the month's first date, normalised as time.Date does
	// (13 is next year's January); day 0 of the next month is this month's
	// last day.
	first := func(y int, m time.Month) (time.Month, int) {
		return m, min(c.day, time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day())
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
func (c calendar) dateStart(y int, m time.Month, d int) time.Time {
	day := civilDay(y, m, d)
	mid := day * 86400 // the date's midnight at offset 0, in s
	// Zones' offsets stay within ±26 h: no instant before mid-27h is on
	// the date or later, and within one period of the zone the local time
	// grows with time.
	const span = 27 * 3600
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	if c.localDay(t) >= day {
		if s, _ := t.ZoneBounds(); s.IsZero() || s.Unix() <= mid-span {
			return t
		}
	}
	// The first instant on the date or later: in the first period of the
	// zone from mid-span that has one, its midnight in the period's offset
	// or the period's start. Changes are whole seconds.
	p := time.Unix(mid-span, 0).In(c.loc)
	for range 8 {
		_, offset := p.Zone()
		_, end := p.ZoneBounds()
		x := time.Unix(max(p.Unix(), mid-int64(offset)), 0).In(c.loc)
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
// civilDay).
func (c calendar) localDay(t time.Time) int64 {
	y, m, d := t.In(c.loc).Date()
	return civilDay(y, m, d)
}

// civilDay returns the number of the date y-m-d (normalised as time.Date
// does) in days since 1970-01-01.
func civilDay(y int, m time.Month, d int) int64 {
	return floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), 86400)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// calendarArgs returns the period and burst arguments of a calendar rule
// for a call whose time is about nowUS (µs): its window's start, plus the
// last digit of the window's index (a start is a whole second, whose last
// digit in µs is free), and its end, in µs (see scripts/calendar.lua).
func (c calendar) args(nowUS int64) (startDigit, end int64) {
	s, e, index := c.window(time.UnixMicro(nowUS))
	return s.UnixMicro() + (index%10+10)%10, e.UnixMicro()
}

// windowMiss is the word a calendar check's error starts with when the
// script's time is outside the window the call sent, followed by the
// script's time in µs (see scripts/calendar.lua).
const windowMiss = "redlimit-window-miss "

// missedWindow returns the script's time from a calendar check's error,
// and whether err is one.
func missedWindow(err error) (int64, bool) {
	if err == nil {
		return 0, false
	}
	msg := err.Error()
	i := strings.Index(msg, windowMiss)
	if i < 0 {
		return 0, false
	}
	s := msg[i+len(windowMiss):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	v, err := strconv.ParseInt(s[:j], 10, 64)
	return v, err == nil
}

// calendarCode is a calendar rule's code in the script's arguments.
const calendarCode = "cw"

// calendarFile is the script file of calendar rules.
const calendarFile = "calendar.lua"

// newCalendarRule prepares a validated calendar limit l as a rule: only
// for FixedWindow. Its state key names the calendar and the zone, and its
// window is sent with each call (see appendRuleArgs).
func newCalendarRule(name string, alg *algorithm, l Limit) (rule, error) {
	if alg.strategy != FixedWindow {
		return rule{}, errorf("%v %v: calendar limits are for %v: %w", alg.strategy, l, FixedWindow, ErrInvalidLimit)
	}
	return rule{
		name:   name,
		alg:    alg,
		limit:  l,
		suffix: "}:" + calendarCode + "-" + l.cal.name(),
		args:   [4]any{calendarCode, int64(l.Rate), argZero, argZero},
	}, nil
}

// appendRuleArgs appends the arguments of rs's rules to args, for a call
// at nowUS (µs, the server's time or an estimate of it): a calendar rule's
// window is the one that holds nowUS.
func appendRuleArgs(args []any, rs *ruleSet, nowUS int64) []any {
	for i := range rs.rules {
		r := &rs.rules[i]
		if !r.limit.isCalendar() {
			args = append(args, r.args[:]...)
			continue
		}
		sd, end := r.limit.cal.args(nowUS)
		args = append(args, r.args[0], r.args[1], sd, end)
	}
	return args
}

// maxWindowMisses bounds the calls a decision makes when its estimate of
// the server's time keeps missing a calendar rule's window.
const maxWindowMisses = 4

// calendarNow returns the time a call of calendar rules sends its windows
// for: sent, the time the call sends (a client clock's), or else an
// estimate of the server's: this process's clock and the offset the latest
// miss showed.
func (e *engine) calendarNow(sent any) int64 {
	if us, ok := sent.(int64); ok && us > 0 {
		return us
	}
	return time.Now().UnixMicro() + e.serverAhead.Load()
}

// runCalendar runs script with args, whose first base are the call's,
// then each rule's for the window of the call's time, then trailer, then,
// when more is not nil, each rule's of more for the same window (a settle's
// rules now, see Reservation.settleRedis); when the script's time missed a
// calendar rule's window, again for the window of the script's time.
func (e *engine) runCalendar(ctx context.Context, script *redis.Script, keys []string, args []any, base int, rs *ruleSet, sent any, trailer []any, more *ruleSet) (any, []any, error) {
	at := e.calendarNow(sent)
	for miss := 0; ; miss++ {
		args = append(appendRuleArgs(args[:base], rs, at), trailer...)
		if more != nil {
			args = appendRuleArgs(args, more, at)
		}
		reply, err := script.Run(ctx, e.rdb, keys, args...).Result()
		server, missed := missedWindow(err)
		if !missed {
			return reply, args, err
		}
		if miss == maxWindowMisses {
			return nil, args, errorf("%s: the calendar window missed the server's time %d times: %w", e.kind, miss+1, err)
		}
		e.serverAhead.Store(server - time.Now().UnixMicro())
		at = server
	}
}

// evalCalendar runs the decision script for rules with a calendar rule
// among them (calendarRunner): the rules are arguments, a calendar rule's
// window chosen for the call's time (see scripts/calendar.lua), then the
// call's priority share.
func (e *engine) evalCalendar(r *request) (any, error) {
	var trailer []any
	if r.share != 0 { // after the rules' arguments (see scripts/args.lua)
		trailer = []any{r.share}
	}
	a := &r.args
	reply, args, err := e.runCalendar(r.ctx, r.rs.calScript, a.keys, a.args, len(a.args), r.rs, r.now, trailer, nil)
	a.args = args // back to the pool
	return reply, err
}
