package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// base is three instances offering 300/s in all to one key for 10 s,
// against a token bucket of 100/s and a burst of 50 (a limit of 1,050 over
// the run), or a fixed window of 600 a minute.
func base(regions int, sync time.Duration, fixed bool) config {
	c := config{regions: regions, instances: 3, keys: 2, sync: sync, rtt: 2 * sync, oneway: sync,
		rate: 100, limit: 100, period: time.Second, burst: 50, run: 10 * time.Second,
		peerFirst: 0.5, spread: time.Hour, seed: 7}
	if fixed {
		c.fixed, c.limit, c.period = true, 600, time.Minute
	}
	return c
}

// TestOneRegionExact: a region alone admits its limit (a bucket's refill
// between the last call and the end aside), whatever the interval.
func TestOneRegionExact(t *testing.T) {
	for _, sync := range []time.Duration{0, 200 * time.Millisecond} {
		o := simulate(base(1, sync, false))
		assert.Equal(t, 2*1050.0, o.limit)
		assert.InDelta(t, o.limit, o.admitted, 2, "token bucket, Sync %v", sync)
		assert.LessOrEqual(t, o.admitted, o.limit)
		o = simulate(base(1, sync, true))
		assert.Equal(t, 2*600.0, o.admitted, "fixed window, Sync %v", sync)
	}
}

// TestNoSyncNoOver: with every admission applied at every peer at once
// (Sync and latency 0), three regions admit the limit, give or take a
// decision per key; with Sync 200 ms a fixed window admits more, within
// the bound, and every peer hears every key's journal.
func TestNoSyncNoOver(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		o := simulate(base(3, 0, fixed))
		assert.InDelta(t, o.limit, o.admitted, 2, "fixed %v", fixed)
	}
	c := base(3, 200*time.Millisecond, true)
	o := simulate(c)
	bound := 2 * 2 * 600 * (c.sync + c.rtt).Seconds() // (N-1)·A·(Sync+RTT), A at most 600/s a key
	assert.Greater(t, o.admitted, o.limit)
	assert.Less(t, o.admitted, o.limit+bound)
	for r, n := range o.region {
		assert.Positive(t, n.charge, "region %d", r)
		assert.Zero(t, n.share, "region %d: no peer silent", r)
	}
}

// TestCutCharged: a region cut off is charged its peers' shares, and
// they its own.
func TestCutCharged(t *testing.T) {
	c := base(3, 200*time.Millisecond, false)
	c.cut = 5 * time.Second
	o := simulate(c)
	for r, n := range o.region {
		assert.Positive(t, n.share, "region %d", r)
	}
	assert.InDelta(t, o.limit, o.admitted, 0.1*o.limit)
}
