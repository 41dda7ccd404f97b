package warmcurve

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Guava's own test of SmoothWarmingUp (rate 2/s, warm-up 4 s): eight
// acquires in a row wait 0, 1.375, 1.125, 0.875, 0.625, 0.5, 0.5, 0.5 s.
func TestGuavaWaits(t *testing.T) {
	c := New(2, 4*time.Second, t0)
	want := []time.Duration{0, 1375, 1125, 875, 625, 500, 500, 500}
	now := t0
	for i, w := range want {
		require.Equal(t, w*time.Millisecond, c.Take(1, now), "acquire %d", i)
		now = now.Add(w * time.Millisecond)
	}
	assert.Equal(t, 500*time.Millisecond, c.Stable())
}

// A curve is cold at first, warm after a run of calls, and cold again
// UntilCold after its last call.
func TestUntilCold(t *testing.T) {
	c := New(2, 4*time.Second, t0)
	assert.Zero(t, c.UntilCold(t0), "cold")
	now := t0
	for range 8 {
		now = now.Add(c.Take(1, now))
	}
	cold := c.UntilCold(now)
	require.Positive(t, cold)
	assert.Zero(t, c.UntilCold(now.Add(cold)), "cold again")
	assert.Zero(t, c.Wait(now.Add(cold)))
}

// GiveBack undoes a Take within the same instant: the curve is as before.
func TestGiveBack(t *testing.T) {
	c := New(2, 4*time.Second, t0)
	before := *c
	c.Take(3, t0)
	require.Positive(t, c.Wait(t0))
	c.GiveBack(3, c.Next(), t0)
	assert.Zero(t, c.Wait(t0))
	assert.InDelta(t, before.stored, c.stored, 1e-9)
	assert.Equal(t, before.next, c.next)
}

// Follow keeps a key as cold as it was under a new rate: the stored
// permits scaled by the rates, up to the new most, and the next free time.
func TestFollow(t *testing.T) {
	for _, tt := range []struct {
		name     string
		from, to float64 // events per second
	}{
		{"faster", 10, 100},
		{"slower", 100, 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			old := New(tt.from, 4*time.Second, t0)
			old.Take(5, t0)
			c := New(tt.to, 4*time.Second, t0)
			c.Follow(old, t0)
			assert.Equal(t, old.next, c.next)
			assert.InDelta(t, min(old.stored*tt.to/tt.from, c.max), c.stored, 1e-9)
			assert.InDelta(t, old.stored/old.max, c.stored/c.max, 1e-9, "as cold as it was")
		})
	}
}
