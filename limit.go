package redlimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redlimit/redlimit/internal/calendar"
)

// Limit is a rate: Rate events per Period. The zero value is not a valid
// Limit; use [PerSecond], [PerMinute], [PerHour] or fill in the fields.
type Limit struct {
	Rate   int           // events allowed per Period
	Period time.Duration // window length, or the time in which Rate tokens refill
	Burst  int           // bucket capacity for TokenBucket and LeakyBucket; 0 means Rate
	// WarmUp, for TokenBucket and LeakyBucket only, makes a cold key (new,
	// or idle for about WarmUp) start at Rate/3 and reach Rate after
	// WarmUp of steady use, as Guava's SmoothWarmingUp (see
	// docs/warmup.md). A warming token bucket never bursts: its Burst must
	// be 0 (or Rate, which 0 means). 0: no warm-up.
	WarmUp time.Duration
	// SubWindows, for SubWindowCounter only, is how many sub-windows a
	// Period is cut into (see [NewSubWindowCounter]): 0 means 60, or one
	// per whole millisecond for a Period under 60 ms; at most
	// [MaxSubWindows], none shorter than 1 ms.
	SubWindows int

	cal calendar.Calendar // Daily, Weekly, Monthly: windows of a calendar (calendar.go)
}

// PerSecond returns a Limit of rate events per second.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a Limit of rate events per minute.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a Limit of rate events per hour.
func PerHour(rate int) Limit { return Limit{Rate: rate, Period: time.Hour} }

// String returns the limit as "rate/period", with the burst, the warm-up
// and the sub-windows when they are set, for example "10/1s", "10/1s burst
// 20", "10/1s warm-up 1m0s" or "1000/1h0m0s sub-windows 60"; a calendar limit as "rate/calendar zone", for
// example "1000/day Asia/Tokyo" or "500/week from Monday UTC".
func (l Limit) String() string {
	if l.isCalendar() {
		return strconv.Itoa(l.Rate) + "/" + l.cal.String()
	}
	s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
	if l.Burst != 0 && l.Burst != l.Rate {
		s += " burst " + strconv.Itoa(l.Burst)
	}
	if l.WarmUp != 0 {
		s += " warm-up " + l.WarmUp.String()
	}
	if l.SubWindows != 0 {
		s += " sub-windows " + strconv.Itoa(l.SubWindows)
	}
	return s
}

// Limits on the values a Limit may hold: a Limit outside them is an error
// wrapping ErrInvalidLimit. They keep every number the scripts compute
// exact, or at worst rounded, in a Lua double.
const (
	// MaxRate is the largest Rate (and Burst) accepted: 2^40, about 1.1e12.
	MaxRate = 1 << 40
	// MaxPeriod is the largest Period accepted: 100 years.
	MaxPeriod = 100 * 365 * 24 * time.Hour
	// MinPeriod is the smallest Period accepted.
	MinPeriod = time.Millisecond
)

// Strategy names a rate-limiting algorithm. See the package documentation
// for how to choose one.
type Strategy int

// The strategies.
const (
	FixedWindow Strategy = iota + 1
	SlidingLog
	SlidingCounter
	TokenBucket
	LeakyBucket
	SubWindowCounter
)

var strategyNames = [...]string{
	FixedWindow:      "fixed-window",
	SlidingLog:       "sliding-log",
	SlidingCounter:   "sliding-counter",
	TokenBucket:      "token-bucket",
	LeakyBucket:      "leaky-bucket",
	SubWindowCounter: "sub-window-counter",
}

// Strategies lists every strategy, in the order of their values.
func Strategies() []Strategy {
	return []Strategy{FixedWindow, SlidingLog, SlidingCounter, TokenBucket, LeakyBucket, SubWindowCounter}
}

// String returns the strategy's name: "fixed-window", "sliding-log",
// "sliding-counter", "token-bucket", "leaky-bucket" or
// "sub-window-counter".
func (s Strategy) String() string {
	if s >= FixedWindow && s <= SubWindowCounter {
		return strategyNames[s]
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// ParseStrategy returns the strategy named s, as written by String.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies() {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, errorf("unknown strategy %q (want one of fixed-window, sliding-log, sliding-counter, token-bucket, leaky-bucket, sub-window-counter)", s)
}

// Rule is one limit of a Policy.
type Rule struct {
	// Name is shown in Result.Rule, headers and observers. Empty: the
	// strategy and the period, such as "token-bucket-1s" or
	// "fixed-window-1h" (see Policy.Rules).
	Name     string
	Strategy Strategy
	Limit    Limit
	// PerCall makes the rule count each call as one event, whatever its n
	// (n = 0 still only reports): requests per second beside tokens per
	// minute in one policy, where AllowN and Reserve take n = tokens.
	// Settling a reservation keeps the call's one event if anything was
	// used, and gives it back for used = 0 (Cancel).
	PerCall bool
}

// MaxRules is the most rules a Policy may have: more is an error wrapping
// ErrInvalidLimit.
const MaxRules = 16

// validate checks a limit against the rules every strategy shares and
// returns it with Burst filled in.
func (l Limit) validate(maxRate int) (Limit, error) {
	bad := func(format string, args ...any) (Limit, error) {
		return l, errorf("limit %v: %s: %w", l, fmt.Sprintf(format, args...), ErrInvalidLimit)
	}
	switch {
	case l.Rate < 1:
		return bad("Rate must be at least 1")
	case l.Rate > maxRate:
		return bad("Rate must be at most %d", maxRate)
	case l.Period < MinPeriod:
		return bad("Period must be at least %v", MinPeriod)
	case l.Period > MaxPeriod:
		return bad("Period must be at most %v", MaxPeriod)
	case l.Period%time.Microsecond != 0:
		return bad("Period must be a whole number of microseconds")
	case l.Burst < 0:
		return bad("Burst must not be negative")
	case l.Burst > MaxRate:
		return bad("Burst must be at most %d", MaxRate)
	}
	if l.isCalendar() {
		if why := l.cal.Check(); why != "" {
			return bad("%s", why)
		}
		if l.Period != l.cal.Period() {
			return bad("a calendar limit's Period must be its calendar's, %v", l.cal.Period())
		}
	}
	if l.Burst == 0 {
		l.Burst = l.Rate
	}
	return l, nil
}
