// Command regions predicts, without Redis, what WithRegions admits and what
// its exchange costs each region's Redis. It models the algorithm of
// regions.go, scripts/region.lua and scripts/region_apply.lua in
// simulated time (µs, one event at a time, deterministic for a seed):
// each region's Redis decides its own calls; every Sync, each instance's
// main loop reads the journals of the keys it decided since (one GET a
// key), hands them to its peer loops, which send them to their peers at
// once, a batch of keys per region script call, and charges the shares of
// peers silent for 4 intervals; a peer charges what is past what it
// applied. See docs/regions-simulation.md for the model's assumptions and
// where it differs from the implementation.
//
//	go run ./cmd/regions [-regions 3] [-instances 2] [-keys 1] [-all-keys 0]
//	    [-sync 200ms] [-rtt 50ms] [-oneway -1ns] [-rate 100]
//	    [-strategy tb|fw] [-limit 300] [-period 1s] [-burst 0]
//	    [-run 8s] [-pre 0s] [-cut 0s] [-seeds 20] [-spread 1h]
//	    [-cluster] [-batch 64] [-slots 16384] [-reread]
//	go run ./cmd/regions -measure [-measure-keys 20000] [-measure-rounds 5]
//	    [-measure-batches 1,8,64]
//
// Each instance offers -rate calls a second to each of -keys keys, spread
// round robin over its region's instances (so that a key is decided by
// min(instances, calls per interval) instances each interval). It prints
// what the regions admitted over -run (mean and range over the seeds)
// against the limit, the bound (N-1)·A·(Sync+RTT), and the same calls
// with Sync 0 (every admission applied everywhere at once: what is left
// is the calls' own discreteness); then, by region, what the exchange
// cost its Redis, counted for the simulated keys and scaled to -all-keys
// (a call's keys batched as on one server, or with -cluster as on a
// cluster: one hash slot's), beside the analytic count. -measure starts
// two redis-servers (internal/redistest) and times the exchange's
// commands, a region script call of 1, 8 and 64 keys: the costs in
// measured, the -cost flags' defaults.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// errUsage reports flags out of range.
var errUsage = errors.New("bad flags")

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "regions:", err)
		os.Exit(1)
	}
}

// measured are the costs -measure found on this machine (2 shared cores,
// Redis 7.0.15; server CPU from INFO cpu, reading and replying included),
// by strategy: the medians of 15 runs (the GETs', of 5), a call's fixed
// cost and each key's fitted through calls of 1 and 64 keys, the fixed
// cost the median over the four kinds of key; bytes for keys of 15
// characters.
var measured = map[string]costs{
	"tb": {get: 1.4, call: 11.6, charge: 9.5, noop: 4.2, share: 9.2, skip: 3.3, callBytes: 214, keyBytes: 171},
	"fw": {get: 1.4, call: 10.2, charge: 11.9, noop: 5.3, share: 10.7, skip: 4.1, callBytes: 219, keyBytes: 173},
}

// options are the command line's settings beyond a config's.
type options struct {
	allKeys, seeds int
	strategy       string
	measure        bool
	mKeys, mRounds int
	mBatches       string
}

// run parses the flags and either measures the exchange's commands or
// simulates the configured deployment and reports on it.
func run() error {
	var c config
	o := defineFlags(&c)
	flag.Parse()
	if o.measure {
		sizes, err := parseBatches(o.mBatches)
		if err != nil {
			return err
		}
		return measure(o.mKeys, o.mRounds, sizes)
	}
	if err := complete(&c, o); err != nil {
		return err
	}
	simulateSeeds(c, o.seeds)
	return nil
}

// defineFlags defines the command's flags, into c and the options it
// returns.
func defineFlags(c *config) *options {
	var o options
	flag.IntVar(&c.regions, "regions", 3, "regions")
	flag.IntVar(&c.instances, "instances", 2, "instances per region")
	flag.IntVar(&c.keys, "keys", 1, "keys simulated")
	flag.IntVar(&o.allKeys, "all-keys", 0, "active keys the cost is scaled to (0: -keys)")
	flag.DurationVar(&c.sync, "sync", 200*time.Millisecond, "Regions.Sync (0: every peer applies each admission at once)")
	flag.DurationVar(&c.rtt, "rtt", 50*time.Millisecond, "round trip between regions")
	flag.DurationVar(&c.oneway, "oneway", -1, "from a delivery's send to its run on the peer's Redis (negative: rtt/2)")
	flag.Float64Var(&c.rate, "rate", 100, "calls per second each instance offers each key")
	flag.StringVar(&o.strategy, "strategy", "tb", "tb (token bucket) or fw (fixed window)")
	flag.Float64Var(&c.limit, "limit", 300, "limit: events per period")
	flag.DurationVar(&c.period, "period", time.Second, "limit's period")
	flag.Float64Var(&c.burst, "burst", 0, "token bucket's burst (0: -limit)")
	flag.DurationVar(&c.run, "run", 8*time.Second, "counted run")
	flag.DurationVar(&c.pre, "pre", 0, "traffic before the counted run (not counted)")
	flag.DurationVar(&c.cut, "cut", 0, "region 0 cut off from the others from the counted run's start, for this long")
	flag.DurationVar(&c.spread, "spread", time.Hour, "the instances' tickers start uniformly within this (at most -sync)")
	flag.BoolVar(&c.cluster, "cluster", false, "each region's Redis is a cluster: a region script call takes keys of one hash slot")
	flag.IntVar(&c.batch, "batch", 64, "most keys a region script call takes (maxRegionBatch)")
	flag.IntVar(&c.slots, "slots", 16384, "a cluster's hash slots")
	flag.BoolVar(&c.reread, "reread", false, "not the implementation: a peer loop reads its pending keys' journals again once its peer answers after a failed delivery")
	flag.IntVar(&o.seeds, "seeds", 20, "runs, seeds 1..seeds")
	defineCostFlags(&c.cost)
	flag.BoolVar(&o.measure, "measure", false, "time the exchange's commands on real redis-servers instead")
	flag.IntVar(&o.mKeys, "measure-keys", 20000, "keys of -measure")
	flag.IntVar(&o.mRounds, "measure-rounds", 5, "rounds of -measure")
	flag.StringVar(&o.mBatches, "measure-batches", "1,8,64", "keys per region script call -measure times, comma-separated")
	return &o
}

// defineCostFlags defines the flags that price the exchange's commands,
// into k (negative: the measured defaults, set by complete).
func defineCostFlags(k *costs) {
	flag.Float64Var(&k.get, "cost-get", -1, "Redis CPU per journal GET, µs (negative: this machine's, see measured)")
	flag.Float64Var(&k.call, "cost-call", -1, "Redis CPU per region script call, before its keys, µs")
	flag.Float64Var(&k.charge, "cost-charge", -1, "Redis CPU per key of a delivery that charges, µs")
	flag.Float64Var(&k.noop, "cost-noop", -1, "Redis CPU per key of a delivery that changes nothing, µs")
	flag.Float64Var(&k.share, "cost-share", -1, "Redis CPU per key charged a silent peer's share, µs")
	flag.Float64Var(&k.skip, "cost-skip", -1, "Redis CPU per key of a share call passed over, µs")
	flag.Float64Var(&k.callBytes, "bytes-call", -1, "bytes of a region script EVALSHA on the link, before its keys")
	flag.Float64Var(&k.keyBytes, "bytes-key", -1, "bytes of a key (its keys and journal) in a region script EVALSHA")
}

// parseBatches parses -measure-batches: positive batch sizes,
// comma-separated.
func parseBatches(list string) ([]int, error) {
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		b, err := strconv.Atoi(f)
		if err != nil || b < 1 {
			return nil, fmt.Errorf("-measure-batches %q: %w", list, errUsage)
		}
		sizes = append(sizes, b)
	}
	return sizes, nil
}

// complete checks c and o and fills in what the flags left to defaults:
// the strategy, the burst, the one-way delay, the costs and the scale.
func complete(c *config, o *options) error {
	def, ok := measured[o.strategy]
	if !ok {
		return fmt.Errorf("strategy %q: tb or fw: %w", o.strategy, errUsage)
	}
	c.fixed = o.strategy == "fw"
	if c.burst == 0 {
		c.burst = c.limit
	}
	if c.oneway < 0 {
		c.oneway = c.rtt / 2
	}
	k := &c.cost
	for _, f := range []struct {
		v *float64
		d float64
	}{{&k.get, def.get}, {&k.call, def.call}, {&k.charge, def.charge}, {&k.noop, def.noop}, {&k.share, def.share},
		{&k.skip, def.skip}, {&k.callBytes, def.callBytes}, {&k.keyBytes, def.keyBytes}} {
		if *f.v < 0 {
			*f.v = f.d
		}
	}
	if o.allKeys == 0 {
		o.allKeys = c.keys
	}
	if c.regions < 1 || c.instances < 1 || c.keys < 1 || c.rate <= 0 || c.limit <= 0 || o.seeds < 1 || c.batch < 1 || c.slots < 1 {
		return fmt.Errorf("regions, instances, keys, rate, limit, seeds, batch and slots must be positive: %w", errUsage)
	}
	c.scale = float64(o.allKeys) / float64(c.keys)
	return nil
}

// simulateSeeds simulates c for seeds 1..seeds, reports the outcomes and,
// with an exchange and no cut, the baseline; then the time it took.
func simulateSeeds(c config, seeds int) {
	t0 := time.Now()
	var outs []outcome
	for s := range seeds {
		c.seed = uint64(s + 1)
		outs = append(outs, simulate(c))
	}
	report(c, outs)
	if c.sync > 0 && c.cut == 0 {
		reportBaseline(c, outs, seeds)
	}
	fmt.Printf("simulated in %v (%d seeds)\n\n", time.Since(t0).Round(time.Millisecond), seeds)
}

// reportBaseline simulates the same calls as outs's, every admission
// applied everywhere at once (Sync 0, no latency), and prints what the
// exchange's delay adds to that.
func reportBaseline(c config, outs []outcome, seeds int) {
	b, sum := c, 0.0
	b.sync, b.rtt, b.oneway = 0, 0, 0
	for s := range seeds {
		b.seed = uint64(s + 1)
		sum += simulate(b).admitted
	}
	mean := sum / float64(seeds)
	fmt.Printf("  baseline (Sync 0, no latency: the calls' own discreteness): admitted %.1f; the exchange's delay adds %+.1f (%+.2f%% of the limit, %+.3f per key)\n",
		mean, meanAdmitted(outs)-mean, 100*(meanAdmitted(outs)-mean)/outs[0].limit, (meanAdmitted(outs)-mean)/float64(c.keys))
}

// meanAdmitted is the mean of outs's admitted totals.
func meanAdmitted(outs []outcome) float64 {
	sum := 0.0
	for _, o := range outs {
		sum += o.admitted
	}
	return sum / float64(len(outs))
}

// report prints the admitted totals over the seeds (mean [min..max]) and
// the exchange's cost per region, for all the active keys.
func report(c config, outs []outcome) {
	reportSetup(c)
	reportAdmitted(c, outs)
	if c.sync == 0 {
		return
	}
	reportAnalytic(c)
	for r := range c.regions {
		reportRegion(c, outs, r)
		if c.regions > 4 && r == 0 && c.cut == 0 {
			fmt.Printf("  (the other regions alike)\n")
			break
		}
	}
}

// reportSetup prints the simulated deployment, its traffic and its limit.
func reportSetup(c config) {
	name := fmt.Sprintf("token bucket %g/%v burst %g", c.limit, c.period, c.burst)
	if c.fixed {
		name = fmt.Sprintf("fixed window %g/%v", c.limit, c.period)
	}
	redis := "one Redis server per region (a call takes any keys)"
	if c.cluster {
		redis = fmt.Sprintf("a cluster per region (a call takes keys of one of %d slots)", c.slots)
	}
	all := c.scale * float64(c.keys)
	fmt.Printf("%d regions x %d instances, %d keys simulated (cost for %.0f), Sync %v, RTT %v (one way %v), %g/s per instance per key, %s, run %v (after %v), region 0 cut %v; %s, at most %d keys a call\n",
		c.regions, c.instances, c.keys, all, c.sync, c.rtt, c.oneway, c.rate, name, c.run, c.pre, c.cut, redis, c.batch)
}

// reportAdmitted prints what the regions admitted over the seeds (mean
// [min..max]) against the limit and the bound, and with several keys, per
// key.
func reportAdmitted(c config, outs []outcome) {
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for _, o := range outs {
		lo, hi, sum = min(lo, o.admitted), max(hi, o.admitted), sum+o.admitted
	}
	mean, limit := sum/float64(len(outs)), outs[0].limit
	a := mean / c.run.Seconds()
	bound := float64(c.regions-1) * a * (c.sync + c.rtt).Seconds()
	fmt.Printf("  admitted %.1f [%.0f..%.0f] of a limit of %.0f (offered %.0f): over %+.1f (%+.2f%%) [%+.0f..%+.0f]; bound (N-1)·A·(Sync+RTT) = %d·%.1f/s·%v = %.1f (A: admitted per second)\n",
		mean, lo, hi, limit, outs[0].offered, mean-limit, 100*(mean-limit)/limit, lo-limit, hi-limit, c.regions-1, a, c.sync+c.rtt, bound)
	if c.keys <= 1 {
		return
	}
	var over []float64
	for _, o := range outs {
		for _, a := range o.perKey {
			over = append(over, a-limit/float64(c.keys))
		}
	}
	slices.Sort(over)
	fmt.Printf("  per key: limit %.1f, over %+.2f on average, %+.0f at the 99th percentile, %+.0f at most; bound %.1f\n",
		limit/float64(c.keys), (mean-limit)/float64(c.keys), over[len(over)*99/100], over[len(over)-1], bound/float64(c.keys))
}

// reportAnalytic prints the exchange's commands per region per second as
// the analytic count has them, for all the active keys.
func reportAnalytic(c config) {
	all := c.scale * float64(c.keys)
	S := c.sync.Seconds()
	M := float64(c.instances)
	lambda := c.rate * M                  // a key's calls per second in a region
	perInst := all * min(lambda*S, M) / M // keys an instance decides in an interval
	gets := all * min(lambda, M/S)
	fmt.Printf("  analytic, per region per second: GETs keys·min(λ, M/Sync) = %.0f·min(%g/s, %g/s) = %.0f; keys in (N-1)·that = %.0f (if every key decided has a journal); an instance decides %.1f keys an interval, in %.1f calls, so calls in (N-1)·(M/Sync)·%.1f = %.0f\n",
		all, lambda, M/S, gets, float64(c.regions-1)*gets, perInst, batchCalls(perInst, c.batch, c.slots, c.cluster), batchCalls(perInst, c.batch, c.slots, c.cluster),
		float64(c.regions-1)*M/S*batchCalls(perInst, c.batch, c.slots, c.cluster))
}

// regionTotals sums region r's counts and busiest intervals over outs.
func regionTotals(outs []outcome, r int) (n counts, peak, peakKeys, peakCPU float64) {
	for _, o := range outs {
		x := o.region[r]
		n.gets, n.calls, n.charge, n.noop = n.gets+x.gets, n.calls+x.calls, n.charge+x.charge, n.noop+x.noop
		n.shareCalls, n.share, n.skip, n.pings = n.shareCalls+x.shareCalls, n.share+x.share, n.skip+x.skip, n.pings+x.pings
		n.cpu, n.bytes = n.cpu+x.cpu, n.bytes+x.bytes
		peak, peakKeys, peakCPU = peak+o.peak[r], peakKeys+o.peakKeys[r], peakCPU+o.peakCPU[r]
	}
	return n, peak, peakKeys, peakCPU
}

// reportRegion prints what the exchange cost region r's Redis, the mean
// over outs, per interval and per second.
func reportRegion(c config, outs []outcome, r int) {
	secs, intervals, S := c.run.Seconds(), c.run.Seconds()/c.sync.Seconds(), c.sync.Seconds()
	k := c.cost
	n, peak, peakKeys, peakCPU := regionTotals(outs, r)
	f := 1 / float64(len(outs))
	g, calls, ch, no, sc, sh, sk := n.gets*f, n.calls*f, n.charge*f, n.noop*f, n.shareCalls*f, n.share*f, n.skip*f
	cpuGet, cpuCall := g*k.get, (calls+sc)*k.call
	cpuKeys := ch*k.charge + no*k.noop + sh*k.share + sk*k.skip
	perCall := 0.0
	if calls > 0 {
		perCall = (ch + no) / calls
	}
	fmt.Printf("  region %d per interval: GET %.0f; calls in %.0f (%.1f keys a call: %.0f charging, %.0f no-op); share calls %.0f (keys %.0f charged, %.0f passed over); PING in %.1f (the sample's, not scaled); the busiest interval: %.0f commands (GETs, calls) carrying %.0f keys, %.1f cores\n",
		r, g/intervals, calls/intervals, perCall, ch/intervals, no/intervals, sc/intervals, sh/intervals, sk/intervals, n.pings*f/intervals, peak*f, peakKeys*f, peakCPU*f/(S*1e6))
	fmt.Printf("  region %d per second:   GET %.0f, calls in %.0f (keys %.0f), share calls %.0f (keys %.0f); Redis CPU %.4g s/s (cores): GETs %.3g, calls %.3g, keys %.3g; link in %.4g MB/s\n",
		r, g/secs, calls/secs, (ch+no)/secs, sc/secs, (sh+sk)/secs, n.cpu*f/secs/1e6, cpuGet/secs/1e6, cpuCall/secs/1e6, cpuKeys/secs/1e6, n.bytes*f/secs/1e6)
}
