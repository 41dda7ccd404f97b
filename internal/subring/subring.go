// Package subring is a sub-window counter in process: the counts of the
// sub-windows that count, on the grid of the limiters' sub-window script
// (a Period cut into s sub-windows, aligned on the Unix epoch), so that a
// stand-in keeps the same promise at its capacity: never more than it in
// any Period. Times are on the process's clock, in µs since the Unix epoch
// on the grid.
package subring

import (
	"math"
	"math/bits"
	"time"
)

// Of returns floor(t·s/period), the sub-window that holds t (µs since the
// Unix epoch) in a period of period µs cut into s, in exact 128-bit
// arithmetic.
func Of(t, period, s int64) int64 {
	hi, lo := bits.Mul64(uint64(t), uint64(s))
	q, _ := bits.Div64(hi, lo, uint64(period))
	return int64(q)
}

// Start returns ceil(b·period/s), when sub-window b starts (µs).
func Start(b, period, s int64) int64 {
	hi, lo := bits.Mul64(uint64(b), uint64(period))
	q, r := bits.Div64(hi, lo, uint64(s))
	if r > 0 {
		q++
	}
	return int64(q)
}

// Ring is the counts of one key's sub-windows that count. It holds 8
// bytes per sub-window; it is not safe for concurrent use: its owner
// locks it.
type Ring struct {
	period, s int64   // µs, sub-windows
	counts    []int64 // sub-window b's count at b mod (s+1)
	newest    int64   // counts hold the sub-windows newest-s .. newest
	total     int64
}

// New returns an empty ring of a period cut into s sub-windows.
func New(period time.Duration, s int) *Ring {
	return &Ring{period: int64(period / time.Microsecond), s: int64(s), counts: make([]int64, s+1)}
}

// at brings the ring to the sub-window of now, which it returns: the
// sub-windows that stopped counting are cleared. When the clock went back,
// it stays at its newest, and returns that: events count there, later.
func (g *Ring) at(now time.Time) int64 {
	cw := Of(now.UnixMicro(), g.period, g.s)
	switch {
	case cw <= g.newest:
		return g.newest
	case cw-g.newest > g.s:
		clear(g.counts)
		g.total = 0
	default:
		for b := g.newest + 1; b <= cw; b++ {
			i := b % (g.s + 1)
			g.total -= g.counts[i]
			g.counts[i] = 0
		}
	}
	g.newest = cw
	return cw
}

// until returns the time from now until sub-window b starts.
func (g *Ring) until(b int64, now time.Time) time.Duration {
	return micros(Start(b, g.period, g.s) - now.UnixMicro())
}

// Take counts n events at now and returns the sub-window they count in.
func (g *Ring) Take(n int, now time.Time) int64 {
	b := g.at(now)
	g.counts[b%(g.s+1)] += int64(n)
	g.total += int64(n)
	return b
}

// GiveBack takes back at most k events from sub-window b, while it counts.
func (g *Ring) GiveBack(b int64, k int, now time.Time) {
	g.at(now)
	if b < g.newest-g.s || b > g.newest {
		return
	}
	i := b % (g.s + 1)
	back := min(int64(k), g.counts[i])
	g.counts[i] -= back
	g.total -= back
}

// Verdict is what Check says of n events.
type Verdict struct {
	OK         bool
	Avail      int           // the events that fit now, before these
	ResetNow   time.Duration // until no event counts, as it is
	ResetAfter time.Duration // the same, after these events if OK
	Wait       time.Duration // not OK: until n fit, unless Never
	Never      bool          // n exceeds the capacity: they never fit at once
}

// Check tells whether n events fit at now in capacity, as the sub-window
// script decides, without taking them.
func (g *Ring) Check(now time.Time, n int, capacity int64) Verdict {
	cw := g.at(now)
	v := Verdict{OK: true, Avail: int(max(capacity-g.total, 0))}
	for b := g.newest; b >= g.newest-g.s && g.total > 0; b-- {
		if g.counts[b%(g.s+1)] > 0 {
			v.ResetNow = g.until(b+g.s+1, now) // the newest with events stops counting
			break
		}
	}
	v.ResetAfter = v.ResetNow
	need := g.total + int64(n) - capacity
	switch {
	case need <= 0:
		if n > 0 {
			v.ResetAfter = g.until(cw+g.s+1, now)
		}
	case int64(n) > capacity:
		v.OK, v.Never = false, true
	default:
		v.OK = false
		for b := g.newest - g.s; b <= g.newest; b++ {
			if need -= g.counts[b%(g.s+1)]; need <= 0 {
				v.Wait = g.until(b+g.s+1, now)
				break
			}
		}
	}
	return v
}

// Total returns the events that count, as of the last call.
func (g *Ring) Total() int64 { return g.total }

// micros converts v µs to a Duration: 0 when v <= 0, at most the longest.
func micros(v int64) time.Duration {
	switch {
	case v <= 0:
		return 0
	case v > math.MaxInt64/int64(time.Microsecond):
		return math.MaxInt64
	}
	return time.Duration(v) * time.Microsecond
}
