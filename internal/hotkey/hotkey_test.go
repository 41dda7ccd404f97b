package hotkey

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

const w = int64(1000) // the window of the tests' rate estimates

// The rate estimate is a sliding counter: the events of the current window,
// plus those of the window before in proportion to its part still within w.
func TestRecent(t *testing.T) {
	var s State
	s.Record(0, 10, w)
	s.Record(500, 10, w)
	for _, tt := range []struct {
		now  int64
		want int64
	}{
		{0, 20},   // one window, all within w
		{999, 20}, // still the first window
		{1000, 20},
		{1500, 10}, // half the first window left
		{1999, 0},  // 20 × 1/1000, rounded down
		{2000, 0},  // two windows on: nothing
		{-1, 0},    // before the window: nothing
	} {
		assert.Equal(t, tt.want, s.Recent(tt.now, w), "Recent(%d)", tt.now)
	}

	// A record in the next window moves cur to prev; one two windows on
	// starts afresh.
	s.Record(1200, 4, w)
	assert.Equal(t, int64(4+20*800/1000), s.Recent(1200, w), "prev spread evenly")
	s.Record(5000, 3, w)
	assert.Equal(t, int64(3), s.Recent(5000, w), "afresh")
}

// Size is what the key saw in the last window, bounded by Max less the
// pending events and by 1/Share of Remaining; below MinEvents or 2n, none.
func TestSize(t *testing.T) {
	z := Sizing{Max: 100, MaxAge: w}
	for _, tt := range []struct {
		name      string
		seen      int
		remaining int
		pending   int
		n         int
		fixed     bool
		windowEnd int64
		want      int
	}{
		{name: "unknown remaining", seen: 50, remaining: -1, want: 0},
		{name: "the rate", seen: 50, remaining: 1000, want: 50},
		{name: "a quarter of remaining", seen: 50, remaining: 100, want: 25},
		{name: "max less pending", seen: 500, remaining: 10_000, pending: 70, want: 30},
		{name: "below MinEvents", seen: 3, remaining: 1000, want: 0},
		{name: "below 2n", seen: 50, remaining: 1000, n: 26, want: 0},
		{name: "2n", seen: 50, remaining: 1000, n: 25, want: 50},
		{name: "fixed window ends sooner", seen: 50, remaining: 1000, fixed: true, windowEnd: 500, want: 25},
		{name: "fixed window ends later", seen: 50, remaining: 1000, fixed: true, windowEnd: 5000, want: 50},
		{name: "fixed window over", seen: 50, remaining: 1000, fixed: true, windowEnd: -1, want: 0},
		{name: "fixed window end unknown", seen: 50, remaining: 1000, fixed: true, want: 50},
		{name: "a window end, not fixed", seen: 50, remaining: 1000, windowEnd: 500, want: 50},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			s.Record(0, tt.seen, w)
			s.Remaining, s.Pending, s.WindowEnd = tt.remaining, tt.pending, tt.windowEnd
			z := z
			z.FixedWindow = tt.fixed
			assert.Equal(t, tt.want, s.Size(0, tt.n, z))
		})
	}
}

// A new key and a forgotten one know nothing of Redis's answer, so no
// prefetch is sized for them however hot they are.
func TestNewAndForget(t *testing.T) {
	s := New()
	s.Record(0, 50, w)
	assert.Equal(t, -1, s.Remaining)
	assert.Zero(t, s.Size(0, 1, Sizing{Max: 100, MaxAge: w}))
	s.Remaining, s.WindowEnd = 1000, 500
	assert.Equal(t, 50, s.Size(0, 1, Sizing{Max: 100, MaxAge: w}))
	s.Forget()
	assert.Equal(t, -1, s.Remaining)
	assert.Zero(t, s.WindowEnd)
	assert.Zero(t, s.Size(0, 1, Sizing{Max: 100, MaxAge: w}))
}
