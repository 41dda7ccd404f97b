package redlimit

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/calendar"
)

// Daily returns a calendar limit for FixedWindow: rate events per calendar
// day in loc (nil means UTC). A day starts at local midnight (where a
// daylight-saving change skips midnight, when the clocks jump to 01:00),
// so a day of a daylight-saving change lasts 23 or 25 hours. Its Period
// is 24h, the nominal length; the windows follow the calendar.
func Daily(rate int, loc *time.Location) Limit {
	return Limit{Rate: rate, Period: calendar.DayPeriod, cal: calendar.Calendar{Kind: calendar.Day, Loc: orUTC(loc)}}
}

// Weekly returns a calendar limit for FixedWindow: rate events per calendar
// week in loc (nil means UTC), a week starting at 00:00 on first. Its
// Period is 7×24h, the nominal length.
func Weekly(rate int, loc *time.Location, first time.Weekday) Limit {
	return Limit{Rate: rate, Period: calendar.WeekPeriod, cal: calendar.Calendar{Kind: calendar.Week, Day: int(first), Loc: orUTC(loc)}}
}

// Monthly returns a calendar limit for FixedWindow: rate events per
// calendar month in loc (nil means UTC), a month starting at 00:00 on
// firstDay (1–31; a month with fewer days starts on its last day, so
// firstDay 31 gives Jan 31, Feb 28, Mar 31, Apr 30, ...). Its Period is
// 31×24h, the longest month. A firstDay outside 1–31 makes the limit
// invalid: the constructors return an error wrapping ErrInvalidLimit.
func Monthly(rate int, loc *time.Location, firstDay int) Limit {
	return Limit{Rate: rate, Period: calendar.MonthPeriod, cal: calendar.Calendar{Kind: calendar.Month, Day: firstDay, Loc: orUTC(loc)}}
}

func orUTC(loc *time.Location) *time.Location {
	if loc == nil {
		return time.UTC
	}
	return loc
}

// isCalendar reports whether l is a calendar limit.
func (l Limit) isCalendar() bool { return l.cal.Kind != 0 }

// Window returns the calendar window of l that holds t: its start and its
// end (the next window's start), in l's time zone. ok is false when l is
// not a calendar limit. It is the window a call decided at t counts in.
func (l Limit) Window(t time.Time) (start, end time.Time, ok bool) {
	if !l.isCalendar() || l.cal.Check() != "" {
		return time.Time{}, time.Time{}, false
	}
	start, end, _ = l.cal.Window(t)
	return start, end, true
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
		suffix: "}:" + calendarCode + "-" + l.cal.Name(),
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
		sd, end := r.limit.cal.Args(nowUS)
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
// rules now, see Reservation.settleRedis), as inWindow does.
func (e *engine) runCalendar(ctx context.Context, script *redis.Script, keys []string, args []any, base int, rs *ruleSet, sent any, trailer []any, more *ruleSet) (any, []any, error) {
	reply, err := e.inWindow(sent, func(at int64) (any, error) {
		args = append(appendRuleArgs(args[:base], rs, at), trailer...)
		if more != nil {
			args = appendRuleArgs(args, more, at)
		}
		return script.Run(ctx, e.rdb, keys, args...).Result()
	})
	return reply, args, err
}

// inWindow returns what call returns for the calendar windows of the
// call's time (see calendarNow; sent is the time the call sends) or, when
// the script's time missed a calendar rule's window, of the script's time:
// call again with it, at most maxWindowMisses times.
func (e *engine) inWindow(sent any, call func(at int64) (any, error)) (any, error) {
	at := e.calendarNow(sent)
	for miss := 0; ; miss++ {
		reply, err := call(at)
		server, missed := missedWindow(err)
		if !missed {
			return reply, err
		}
		if miss == maxWindowMisses {
			return nil, errorf("%s: the calendar window missed the server's time %d times: %w", e.kind, miss+1, err)
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

// evalCalendarSingle runs script, a single calendar rule's specialised
// script (calendarSingleRunner), with its arguments: the window (see
// singleWindowArgs), then n and the call's time, each left out when
// trailing and its default (1 and 0; see scripts/single_calendar.lua).
func (e *engine) evalCalendarSingle(r *request, script *redis.Script) (any, error) {
	a := &r.args
	n, cal := a.args[0], r.rs.rules[0].limit.cal
	return e.inWindow(r.now, func(at int64) (any, error) {
		w, end, two := singleWindowArgs(cal.Args(at))
		a.args = append(a.args[:0], w)
		if two {
			a.args = append(a.args, end)
		}
		switch {
		case r.now != argZero:
			a.args = append(a.args, n, r.now)
		case n != defaultArgs[0]:
			a.args = append(a.args, n)
		}
		return script.Run(r.ctx, e.rdb, a.keys, a.args...).Result()
	})
}

// singleWindowArgs returns the window of a calendar rule's arguments (its
// start in µs plus the digit d, and its end in µs, both whole seconds,
// after 1970) as single_calendar.lua takes them: in one argument, w =
// (start in seconds × 10 + d) × 2^16 + its length in minutes, where the
// window is a whole number of minutes long (every window from 1990 on in
// the tz database; a month is at most 44,820 minutes, well below 2^16);
// else in two, as twoWindowArgs writes them (two is true).
func singleWindowArgs(startDigit, end int64) (w, endS int64, two bool) {
	tens := windowTens(startDigit)
	length := end - (tens-tens%10)*100_000
	if minutes := length / 60_000_000; length%60_000_000 == 0 && minutes < 1<<16 && tens < 1<<(53-16) {
		return tens<<16 + minutes, 0, false
	}
	w, endS = twoWindowArgs(startDigit, end)
	return w, endS, true
}

// twoWindowArgs returns the two arguments in which single_calendar.lua
// takes any window (see singleWindowArgs): -(start in seconds × 10 + d) -
// 1, and the end in seconds.
func twoWindowArgs(startDigit, end int64) (negTens, endS int64) {
	return -windowTens(startDigit) - 1, end / 1_000_000
}

// windowTens returns a window's start in seconds × 10 + d, from its start
// in µs plus d (see singleWindowArgs).
func windowTens(startDigit int64) int64 {
	d := startDigit % 10
	return (startDigit-d)/100_000 + d
}
