package main

import (
	"bufio"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pattern returns the arrival times, sorted and in whole microseconds, of
// traffic with a mean of offered requests per second over duration.
type pattern func(offered float64, period, duration time.Duration) []time.Duration

// patterns are the generated traffic patterns, by name (see the help of
// simulate).
var patterns = map[string]pattern{
	"steady": steady,
	"bursty": bursty,
	"ramp":   ramp,
	"onoff":  onOff,
}

// seconds turns a time in seconds into a Duration in whole microseconds.
func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s*1e6)) * time.Microsecond
}

// evenly returns n times spread evenly over [from, from+width), the first
// at from, keeping those before end. It stops once ts holds more than
// maxArrivals times, which the caller refuses anyway.
func evenly(ts []time.Duration, n int, from, width, end time.Duration) []time.Duration {
	for i := range n {
		t := from + seconds(width.Seconds()*float64(i)/float64(n))
		if t >= end || len(ts) > maxArrivals {
			break
		}
		ts = append(ts, t)
	}
	return ts
}

// steady sends requests evenly spaced at the offered rate, from time 0.
func steady(offered float64, _, duration time.Duration) []time.Duration {
	return evenly(nil, count(offered*duration.Seconds()), 0, duration, duration)
}

// bursty sends, every 2 periods, the 2×period×offered requests of those
// periods in one burst spread over period/10 and centred on the window
// boundary at 1, 3, 5... periods. period must be positive.
func bursty(offered float64, period, duration time.Duration) []time.Duration {
	n := count(offered * 2 * period.Seconds())
	width := period / 10
	var ts []time.Duration
	for c := period; ; c += 2 * period {
		ts = evenly(ts, n, c-width/2, width, duration)
		// The next burst starts 2 periods later, if before duration
		// (compared without adding: c+2×period can overflow for periods
		// of years).
		if c-width/2 >= duration-2*period {
			return ts
		}
	}
}

// ramp sends at a rate growing linearly from 0 to 2×offered over duration:
// the expected count by time t is offered×t²/duration, and the i-th request
// comes when that count reaches i+½.
func ramp(offered float64, _, duration time.Duration) []time.Duration {
	d := duration.Seconds()
	n := min(count(offered*d), maxArrivals+1) // the caller refuses more
	ts := make([]time.Duration, 0, n)
	for i := range n {
		t := seconds(math.Sqrt((float64(i) + 0.5) * d / offered))
		if t >= duration {
			break
		}
		ts = append(ts, t)
	}
	return ts
}

// onOff sends at 2×offered for 2 periods, then nothing for 2 periods, and
// so on. period must be positive.
func onOff(offered float64, period, duration time.Duration) []time.Duration {
	on := 2 * period
	n := count(2 * offered * on.Seconds())
	var ts []time.Duration
	for from := time.Duration(0); ; from += 2 * on {
		ts = evenly(ts, n, from, on, duration)
		// The next cycle starts 2×on later, if before duration (compared
		// without forming 2×on, which can overflow for periods of years).
		if left := duration - from; left-on <= on {
			return ts
		}
	}
}

// count returns x, a number of requests, rounded to an int; past
// math.MaxInt32 it returns that, more than any simulation takes, rather
// than what the conversion of a huge float gives (a negative number on
// amd64).
func count(x float64) int {
	return int(min(math.Round(x), math.MaxInt32))
}

// readArrivals reads arrival times from a file: one per line, as a Go
// duration ("1.25s", "300ms") or a number of seconds ("1.25"). Blank lines
// and lines starting with '#' are skipped. The times are returned sorted.
func readArrivals(path string) ([]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only: its Close loses nothing
	var ts []time.Duration
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		t, err := parseOffset(s)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		ts = append(ts, t)
		if len(ts) > maxArrivals {
			return nil, fmt.Errorf("%s: more than the %d requests a simulation can take", path, maxArrivals)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s: no arrival times", path)
	}
	slices.Sort(ts)
	return ts, nil
}

// parseOffset parses one arrival time of a file, rounded to the microsecond.
func parseOffset(s string) (time.Duration, error) {
	var t time.Duration
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e9 {
			return 0, fmt.Errorf("bad time %q", s)
		}
		t = seconds(v)
	} else if d, err := time.ParseDuration(s); err == nil {
		t = d.Round(time.Microsecond)
	} else {
		return 0, fmt.Errorf("bad time %q: want a duration such as 1.25s or a number of seconds", s)
	}
	if t < 0 {
		return 0, fmt.Errorf("negative time %q", s)
	}
	return t, nil
}

// coverPeriods returns the time from 0 past the last of ts, rounded up to a
// whole number of periods.
func coverPeriods(ts []time.Duration, period time.Duration) time.Duration {
	return (ts[len(ts)-1]/period + 1) * period
}

// before returns the times of ts, which is sorted, that come before end.
func before(ts []time.Duration, end time.Duration) []time.Duration {
	i, _ := slices.BinarySearch(ts, end)
	return ts[:i]
}

// jitter moves each time of ts at random by up to half the gap to its
// neighbours, the same way for the same seed, and keeps the result sorted
// and within [0, end).
func jitter(ts []time.Duration, seed int64, end time.Duration) []time.Duration {
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		lo, hi := t, t
		if i > 0 {
			lo = t - (t-ts[i-1])/2
		}
		if i+1 < len(ts) {
			hi = t + (ts[i+1]-t)/2
		}
		j := (lo + seconds(r.Float64()*(hi-lo).Seconds())).Round(time.Microsecond)
		out[i] = min(max(j, 0), end-time.Microsecond)
	}
	slices.Sort(out)
	return out
}
