package redlimit

import (
	"math/bits"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// subWindowCounter is the sub-window counter: a count per sub-window of the
// Period, in one Redis hash per key.
var subWindowCounter = &algorithm{strategy: SubWindowCounter, code: "sw", maxRate: MaxRate}

// MaxSubWindows is the most sub-windows a SubWindowCounter's Period may be
// cut into (Limit.SubWindows): a key holds at most one count per
// sub-window, and the scripts keep a sub-window's index in 12 bits beside
// its count (see scripts/subwindow.lua). More is an error wrapping
// ErrInvalidLimit.
const MaxSubWindows = 1000

// defaultSubWindows is what Limit.SubWindows 0 means: 60, or one per whole
// millisecond for a Period under 60 ms.
const defaultSubWindows = 60

// NewSubWindowCounter returns a limiter that allows at most limit.Rate
// events in any interval of length limit.Period, as the sliding log does,
// in memory bounded by the sub-windows whatever the Rate. The Period is cut
// into limit.SubWindows sub-windows (0 means 60), a grid aligned to the
// Unix epoch on the decision's clock: sub-window b covers
// [b·Period/SubWindows, (b+1)·Period/SubWindows), its bounds rounded up to
// the microsecond. An event counts until its whole sub-window has left the
// window, as if it happened at the sub-window's end; n events are admitted
// if the counts of the sub-windows that still count, plus n, are at most
// Rate. So it never admits more than Rate in any interval of length Period,
// and denies only when at least Rate events were admitted within Period
// plus one sub-window: the price of constant memory is at most one
// sub-window of delay. RetryAfter is exact: the instant enough of the
// oldest counted sub-windows stop counting; ResetAfter can reach Period
// plus one sub-window. Burst is ignored.
//
// It keeps one Redis hash per key, at most one field per sub-window with
// events and three more (a few hundred bytes for 60 sub-windows, see
// docs/subwindows.md), expiring when its newest sub-window stops counting;
// a sub-window that has left the window is dropped by the next call that
// finds it, one at a time (amortised O(1) per decision).
func NewSubWindowCounter(rdb redis.UniversalClient, limit Limit, opts ...Option) (*RateLimiter, error) {
	return newRateLimiter(SubWindowCounter, rdb, limit, opts)
}

// subWindows returns the sub-windows of l for a rule of alg: l.SubWindows,
// or its default for the sub-window counter; 0 for another strategy; or
// an error wrapping ErrInvalidLimit. l is validated already.
func subWindows(alg *algorithm, l Limit) (int, error) {
	bad := func(format string, args ...any) (int, error) {
		return 0, errorf("%v %v: "+format+": %w", append(append([]any{alg.strategy, l}, args...), ErrInvalidLimit)...)
	}
	s := l.SubWindows
	switch {
	case alg.strategy != SubWindowCounter:
		if s != 0 {
			return bad("SubWindows is for %v limits only", SubWindowCounter)
		}
		return 0, nil
	case s < 0:
		return bad("SubWindows must not be negative")
	case s == 0:
		return min(defaultSubWindows, int(l.Period/time.Millisecond)), nil
	case s > MaxSubWindows:
		return bad("SubWindows must be at most %d", MaxSubWindows)
	case l.Period/time.Duration(s) < time.Millisecond:
		return bad("%d sub-windows of %v are shorter than 1ms", s, l.Period)
	}
	return s, nil
}

// subWindowSuffix is the state key's suffix of a sub-window counter of
// periodUS µs in s sub-windows: the code, the period and the sub-windows,
// as "}:sw3600000000x60" (limits with other sub-windows count on another
// grid, so they keep apart).
func subWindowSuffix(periodUS int64, s int) string {
	return "}:" + subWindowCounter.code + strconv.FormatInt(periodUS, 10) + "x" + strconv.Itoa(s)
}

// subWindowOf returns floor(t·s/period), the sub-window that holds t (µs
// since the Unix epoch) in a period of period µs cut into s, in exact
// 128-bit arithmetic.
func subWindowOf(t, period, s int64) int64 {
	hi, lo := bits.Mul64(uint64(t), uint64(s))
	q, _ := bits.Div64(hi, lo, uint64(period))
	return int64(q)
}

// subWindowStart returns ceil(b·period/s), when sub-window b starts (µs).
func subWindowStart(b, period, s int64) int64 {
	hi, lo := bits.Mul64(uint64(b), uint64(period))
	q, r := bits.Div64(hi, lo, uint64(s))
	if r > 0 {
		q++
	}
	return int64(q)
}

// subRing is a sub-window counter's in-process stand-in (fallback.go): the
// counts of the sub-windows that count, on this process's clock, on the
// grid of scripts/subwindow.lua, so that it keeps the same promise at the
// stand-in's capacity (the instance's share of Rate): never more than it
// in any Period. It holds 8 bytes per sub-window, and the caller's lock
// guards it.
type subRing struct {
	period, s int64   // µs, sub-windows
	counts    []int64 // sub-window b's count at b mod (s+1)
	newest    int64   // counts hold the sub-windows newest-s .. newest
	total     int64
}

func newSubRing(period time.Duration, s int) *subRing {
	return &subRing{period: int64(period / time.Microsecond), s: int64(s), counts: make([]int64, s+1)}
}

// at brings the ring to the sub-window of now, which it returns: the
// sub-windows that stopped counting are cleared. When the clock went back,
// it stays at its newest, and returns that: events count there, later.
func (g *subRing) at(now time.Time) int64 {
	cw := subWindowOf(now.UnixMicro(), g.period, g.s)
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
func (g *subRing) until(b int64, now time.Time) time.Duration {
	return micros(subWindowStart(b, g.period, g.s) - now.UnixMicro())
}

// take counts n events at now and returns the sub-window they count in.
func (g *subRing) take(n int, now time.Time) int64 {
	b := g.at(now)
	g.counts[b%(g.s+1)] += int64(n)
	g.total += int64(n)
	return b
}

// giveBack takes back at most k events from sub-window b, while it counts.
func (g *subRing) giveBack(b int64, k int, now time.Time) {
	g.at(now)
	if b < g.newest-g.s || b > g.newest {
		return
	}
	i := b % (g.s + 1)
	back := min(int64(k), g.counts[i])
	g.counts[i] -= back
	g.total -= back
}

// checkSub is the verdict of a sub-window counter's stand-in lr on n events
// at now, as scripts/subwindow.lua decides, at lr.capacity less kept (a
// priority share's headroom). It takes nothing. ping is the retry when
// the stand-in's capacity can never admit n.
func checkSub(lr *localRule, now time.Time, n, kept int, ping time.Duration) verdict {
	g := lr.sub
	cw := g.at(now)
	capacity := int64(lr.capacity - kept)
	v := verdict{ok: true, avail: int(max(capacity-g.total, 0))}
	for b := g.newest; b >= g.newest-g.s && g.total > 0; b-- {
		if g.counts[b%(g.s+1)] > 0 {
			v.resetNow = g.until(b+g.s+1, now) // the newest with events stops counting
			break
		}
	}
	v.resetAfter = v.resetNow
	need := g.total + int64(n) - capacity
	switch {
	case need <= 0:
		if n > 0 {
			v.resetAfter = g.until(cw+g.s+1, now)
		}
	case int64(n) > capacity:
		// The stand-in's share of the limit can never admit n at once.
		v.ok, v.why, v.wait = false, reasonLimit, ping
	default:
		v.ok, v.why = false, reasonLimit
		for b := g.newest - g.s; b <= g.newest; b++ {
			if need -= g.counts[b%(g.s+1)]; need <= 0 {
				v.wait = g.until(b+g.s+1, now)
				break
			}
		}
	}
	if !v.ok && kept > 0 && int64(n) <= int64(lr.capacity)-g.total {
		v.why = reasonPriority
	}
	return v
}
