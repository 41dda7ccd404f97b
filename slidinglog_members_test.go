package redlimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The sliding log's members: "<µs>" for the first event of a microsecond,
// "<µs>:<L><i>" after it, so that the newest member tells the next index
// (see scripts/slidinglog.lua). Events in one microsecond, before and after
// the clock goes back onto it, stay distinct members.
func TestSlidingLogMembersSameMicrosecond(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, Limit{Rate: 1000, Period: time.Hour})
	ctx := context.Background()
	key := lim.stateKey("k")
	allow := func(n int) {
		t.Helper()
		if res, err := lim.AllowN(ctx, "k", n); err != nil || !res.Allowed {
			t.Fatalf("AllowN(%d): %+v, %v", n, res, err)
		}
	}
	allow(1)  // index 0: "<µs>"
	allow(12) // indexes 1 to 12, past one digit
	b.advance(time.Millisecond)
	allow(1)
	b.setClock(0) // back onto the first microsecond, which is not the newest
	allow(2)
	members, err := b.rdb.ZRange(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(members), 16; got != want {
		t.Fatalf("%d members, want %d: %q", got, want, members)
	}
	first := members[0]
	if strings.ContainsAny(first, ".:") {
		t.Errorf("first member %q, want the bare µs", first)
	}
	for i, want := range []string{first + ":11", first + ":19", first + ":210", first + ":212", first + ":213", first + ":214"} {
		idx := map[int]int{0: 1, 1: 9, 2: 10, 3: 12, 4: 13, 5: 14}[i]
		if got := members[idx]; got != want {
			t.Errorf("member %d = %q, want %q", idx, got, want)
		}
	}
	// The count is exact: 16 events, 984 left.
	if res, err := lim.AllowN(ctx, "k", 0); err != nil || res.Remaining != 1000-16 {
		t.Fatalf("n=0: %+v, %v; want %d remaining", res, err, 1000-16)
	}
}

// The log's expiry moves only when an admission's newest event was in
// another expiry cell (a 64th of the period, here 15.625 ms, from t0, a
// cell's start): to a period, a cell and a ms (1.017 s) ahead. An event
// late in the cell, which left it as it was, still counts until it leaves
// the window.
func TestSlidingLogExpiryFollowsNewest(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, Limit{Rate: 100, Period: time.Second})
	ctx := context.Background()
	key := lim.stateKey("k")
	const px = 1017 * time.Millisecond
	var at, set time.Duration // the clock from t0, and when the expiry was set
	for _, step := range []struct {
		at    time.Duration
		moves bool
	}{
		{0, true},
		{300 * time.Microsecond, false}, // the same cell
		{15500 * time.Microsecond, false},
		{15700 * time.Microsecond, true}, // the next cell
		{500 * time.Millisecond, true},
		{510 * time.Millisecond, false},
	} {
		b.advance(step.at - at)
		at = step.at
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
		if step.moves {
			set = at
		}
		got, err := b.rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		want := px - (at - set)
		assert.InDelta(t, want, got, float64(time.Millisecond), "at %v", at)
	}
	// Just before the event at 510 ms leaves the window, the log still
	// counts it (and the one at 500 ms is gone).
	b.advance(1509*time.Millisecond + 900*time.Microsecond - at)
	res, err := lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 99, res.Remaining)
}

// Expired members are trimmed when an admission's newest is in another
// eighth of the period: the log never holds, besides the window's events,
// more than those of one eighth of a period before it.
func TestSlidingLogTrim(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, Limit{Rate: 100, Period: time.Second})
	ctx := context.Background()
	key := lim.stateKey("k")
	for i := range 60 {
		if i > 0 {
			b.advance(50 * time.Millisecond)
		}
		if res, err := lim.Allow(ctx, "k"); err != nil || !res.Allowed {
			t.Fatalf("Allow %d: %+v, %v", i, res, err)
		}
		n, err := b.rdb.ZCard(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// 20 events in the window (one every 50ms), and at most the 3
		// of the 125ms before it.
		if n > 23 {
			t.Fatalf("after %d events: %d members, want at most 23", i+1, n)
		}
	}
}
