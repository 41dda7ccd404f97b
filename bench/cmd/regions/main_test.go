package main

import (
	"math"
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
		spread: time.Hour, seed: 7}
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

// TestBatchCalls: one server takes up to 64 keys a call, whatever their
// slots; a cluster only one slot's, so 2,000 keys over 16,384 slots need
// about as many calls as keys (16384·(1-e^(-2000/16384)) = 1,883).
func TestBatchCalls(t *testing.T) {
	assert.Equal(t, 0.0, batchCalls(0, 64, 16384, false))
	assert.Equal(t, 1.0, batchCalls(1, 64, 16384, false))
	assert.Equal(t, 32.0, batchCalls(2000, 64, 16384, false))
	assert.InDelta(t, 16384*(1-math.Exp(-2000.0/16384)), batchCalls(2000, 64, 16384, true), 1)
	assert.InDelta(t, 1, batchCalls(1, 64, 16384, true), 1e-3)
	assert.Greater(t, batchCalls(1e6, 64, 16384, true), 1e6/64)
}

// TestOneReadPerKey: an instance reads a key's journal once an interval
// for all its peers, so a region's GETs do not grow with the regions; the
// keys its peers apply do.
func TestOneReadPerKey(t *testing.T) {
	small, large := simulate(base(2, 200*time.Millisecond, false)), simulate(base(4, 200*time.Millisecond, false))
	assert.InDelta(t, small.region[0].gets, large.region[0].gets, 0.1*small.region[0].gets)
	in := func(c counts) float64 { return c.charge + c.noop }
	assert.InDelta(t, 3*in(small.region[0]), in(large.region[0]), 0.3*in(large.region[0]))
	assert.Positive(t, small.region[0].calls)
}
