package redlimit

import (
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

// checkSub is the verdict of a sub-window counter's stand-in lr on n events
// at now, as scripts/subwindow.lua decides, at lr.capacity less kept (a
// priority share's headroom). It takes nothing. ping is the retry when
// the stand-in's capacity can never admit n.
func checkSub(lr *localRule, now time.Time, n, kept int, ping time.Duration) verdict {
	c := lr.sub.Check(now, n, int64(lr.capacity-kept))
	v := verdict{ok: c.OK, avail: c.Avail, resetNow: c.ResetNow, resetAfter: c.ResetAfter, wait: c.Wait}
	if v.ok {
		return v
	}
	v.why = reasonLimit
	if c.Never {
		// The stand-in's share of the limit can never admit n at once.
		v.wait = ping
	}
	if kept > 0 && int64(n) <= int64(lr.capacity)-lr.sub.Total() {
		v.why = reasonPriority
	}
	return v
}
