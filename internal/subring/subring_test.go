package subring

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Of and Start agree at every bound: a sub-window starts at the first µs
// that Of puts in it, also where 64-bit products would overflow.
func TestOfStart(t *testing.T) {
	for _, tt := range []struct{ period, s int64 }{
		{60_000_000, 6}, {1_000_000, 7}, {3_600_000_000, 60}, {math.MaxInt64 / 2, 1000},
	} {
		for _, b := range []int64{0, 1, 5, 1_000_003, tt.s * (math.MaxInt64 / 2 / tt.period)} {
			if b > tt.s*(math.MaxInt64/tt.period) {
				continue // starts past the int64 µs
			}
			start := Start(b, tt.period, tt.s)
			assert.Equal(t, b, Of(start, tt.period, tt.s), "%+v: sub-window %d starts in it", tt, b)
			if start > 0 {
				assert.Equal(t, b-1, Of(start-1, tt.period, tt.s), "%+v: the µs before sub-window %d", tt, b)
			}
		}
	}
}

// A ring against a model that keeps every event: what counts at now is the
// events of the s+1 newest sub-windows; n fit when they and those do not
// pass the capacity, and a denial waits until enough stop counting.
func TestRingModel(t *testing.T) {
	const period, s, capacity = int64(1_000_000), int64(5), int64(20)
	type event struct{ b, n int64 }
	rng := rand.New(rand.NewPCG(3, 4))
	g := New(time.Duration(period)*time.Microsecond, int(s))
	var events []event
	now := time.UnixMicro(1_700_000_000_000_000)
	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(300_000)) * time.Microsecond)
		cw := Of(now.UnixMicro(), period, s)
		counted := func(after int64) (total int64) { // what counts once sub-window after starts
			for _, e := range events {
				if e.b > after-s-1 {
					total += e.n
				}
			}
			return total
		}
		n := rng.IntN(8)
		v := g.Check(now, n, capacity)
		total := counted(cw)
		require.Equal(t, total, g.Total(), "step %d", step)
		require.Equal(t, int(max(capacity-total, 0)), v.Avail, "step %d", step)
		require.Equal(t, total+int64(n) <= capacity, v.OK, "step %d", step)
		require.Equal(t, int64(n) > capacity, v.Never, "step %d", step)
		if !v.OK && !v.Never {
			// Enough stop counting when sub-window cw+k starts, not before.
			k := int64(1)
			for counted(cw+k)+int64(n) > capacity {
				k++
			}
			want := time.Duration(Start(cw+k, period, s)-now.UnixMicro()) * time.Microsecond
			require.Equal(t, want, v.Wait, "step %d", step)
			continue
		}
		if v.OK && n > 0 {
			require.Equal(t, cw, g.Take(n, now))
			events = append(events, event{cw, int64(n)})
			if rng.IntN(4) == 0 { // a refund of what was just taken
				back := rng.IntN(n + 1)
				g.GiveBack(cw, back, now)
				events[len(events)-1].n -= int64(back)
			}
		}
	}
}

// A refund to a sub-window that stopped counting changes nothing.
func TestGiveBackLate(t *testing.T) {
	g := New(time.Second, 2)
	t0 := time.UnixMicro(0)
	b := g.Take(3, t0)
	late := t0.Add(2 * time.Second)
	g.GiveBack(b, 3, late)
	assert.Zero(t, g.Total())
	g.Take(1, late)
	g.GiveBack(b, 3, late)
	assert.Equal(t, int64(1), g.Total(), "the old sub-window's refund is not taken from the new")
}
