// Package warmcurve is Guava's SmoothWarmingUp in float64 seconds: a
// bucket whose cold key starts at a third of its stable rate and warms up
// over a warm-up period, as the limiters' warm-up script decides it. The
// fallback's stand-in of a limit with a warm-up follows it in process.
package warmcurve

import (
	"math"
	"time"
)

// Curve is one key's warm-up at a rate. It is not safe for concurrent use:
// its owner locks it.
type Curve struct {
	stable    float64   // seconds per permit at the stable rate
	threshold float64   // permits: 0.5·W/stable
	max       float64   // permits: 2·threshold
	stored    float64   // permits stored
	next      time.Time // when the next call is free
}

// New returns a cold curve of every events per second and a warm-up of w,
// at now.
func New(every float64, w time.Duration, now time.Time) *Curve {
	c := &Curve{stable: 1 / every, next: now}
	c.threshold = 0.5 * w.Seconds() / c.stable
	c.max = c.threshold + 2*w.Seconds()/(c.stable+3*c.stable)
	c.stored = c.max
	return c
}

// Stable returns the interval between events at the stable rate.
func (c *Curve) Stable() time.Duration { return seconds(c.stable) }

// Next returns when the next call is free (as of the last call).
func (c *Curve) Next() time.Time { return c.next }

// Follow makes c, a new curve of the same key, continue old at now, as
// the warm-up script does when the rate changes (Guava's setRate): the
// stored permits scaled by the new rate over the old, so that the key is
// as cold as it was, up to the new most.
func (c *Curve) Follow(old *Curve, now time.Time) {
	old.sync(now)
	c.stored = min(old.stored*old.stable/c.stable, c.max)
	c.next = old.next
}

// sync brings the stored permits to now: one comes back per stable
// interval after the next free time.
func (c *Curve) sync(now time.Time) {
	if now.After(c.next) {
		c.stored = math.Min(c.max, c.stored+now.Sub(c.next).Seconds()/c.stable)
		c.next = now
	}
}

// cost is the time that taking n permits costs: stored ones above the
// threshold along the line from stable to 3·stable, the others stable.
func (c *Curve) cost(n float64) float64 { return c.costFrom(c.stored, n) }

// costFrom is the cost of taking n permits from stored ones.
func (c *Curve) costFrom(stored, n float64) float64 {
	spend := math.Min(n, stored)
	t := (n - spend) * c.stable
	if above := stored - c.threshold; above > 0 {
		take := math.Min(above, spend)
		slope := 2 * c.stable / (c.max - c.threshold)
		t += take * (2*c.stable + (2*above-take)*slope) / 2
		spend -= take
	}
	return t + spend*c.stable
}

// Wait returns how long a call must wait at now for the next free time.
func (c *Curve) Wait(now time.Time) time.Duration {
	c.sync(now)
	return max(c.next.Sub(now), 0)
}

// Take takes n permits at now and returns the wait before them (Guava's
// reserve).
func (c *Curve) Take(n int, now time.Time) time.Duration {
	w := c.Wait(now)
	c.next = c.next.Add(seconds(c.cost(float64(n))))
	c.stored = math.Max(c.stored-float64(n), 0)
	return w
}

// GiveBack undoes a take of n permits at now, as the settle script does
// (a refund): the permits come back, and what they cost at what is stored
// now comes back as time owed until end (the reservation's own time: none
// passed, none that later calls owe), the rest as the permits an idle key
// would have stored meanwhile.
func (c *Curve) GiveBack(n float64, end, now time.Time) {
	c.sync(now)
	cost := c.costFrom(math.Min(c.stored+n, c.max), n)
	back := min(cost, max(end.Sub(now).Seconds(), 0), c.next.Sub(now).Seconds())
	c.next = c.next.Add(-seconds(back))
	c.stored = math.Min(c.stored+n+(cost-back)/c.stable, c.max)
}

// UntilCold is how long, with no more calls, until the curve is cold again.
func (c *Curve) UntilCold(now time.Time) time.Duration {
	c.sync(now)
	return c.next.Sub(now) + seconds((c.max-c.stored)*c.stable)
}

// seconds converts s seconds to a Duration, rounded up; 0 if s <= 0.
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}
