// Command regions predicts, without Redis, what WithRegions admits and what
// its exchange costs each region's Redis. It models the algorithm of
// regions.go, scripts/region.lua and scripts/region_apply.lua in
// simulated time (µs, one event at a time, deterministic for a seed):
// each region's Redis decides its own calls; every instance's main loop
// hands the keys it decided to its peer loops each Sync and charges the
// shares of peers silent for 4 intervals; each peer loop reads the
// journals of its pending keys and sends them to its peer, which charges
// what is past what it applied. See docs/regions-simulation.md for the
// model's assumptions and where it differs from the implementation.
//
//	go run ./cmd/regions [-regions 3] [-instances 2] [-keys 1] [-all-keys 0]
//	    [-sync 200ms] [-rtt 50ms] [-oneway -1ns] [-rate 100]
//	    [-strategy tb|fw] [-limit 300] [-period 1s] [-burst 0]
//	    [-run 8s] [-pre 0s] [-cut 0s] [-seeds 20] [-spread 1h] [-peer-first 0.5]
//	go run ./cmd/regions -measure [-measure-keys 20000] [-measure-rounds 5]
//
// Each instance offers -rate calls a second to each of -keys keys, spread
// round robin over its region's instances (so that a key is decided by
// min(instances, calls per interval) instances each interval). It prints
// what the regions admitted over -run (mean and range over the seeds)
// against the limit, the bound (N-1)·A·(Sync+RTT), and the same calls
// with Sync 0 (every admission applied everywhere at once: what is left
// is the calls' own discreteness); then, by region, what the exchange
// cost its Redis, counted for the simulated keys and scaled to -all-keys,
// beside the analytic count. -measure starts two redis-servers
// (internal/redistest) and times the exchange's commands: the costs in
// measured, the -cost flags' defaults.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "regions:", err)
		os.Exit(1)
	}
}

// costs are Redis's CPU per exchange command (µs) and a region script
// EVALSHA's size on the link (bytes).
type costs struct {
	get, charge, noop, share, bytes float64
}

// measured are the costs -measure found on this machine (2 cores, Redis
// 7.0.15, pipelines of 1,000; server CPU from INFO cpu, reading and
// replying included), by strategy; bytes for a key of 15 characters.
var measured = map[string]costs{
	"tb": {get: 1.24, charge: 16.9, noop: 12.2, share: 21.6, bytes: 352},
	"fw": {get: 1.33, charge: 23.8, noop: 19.3, share: 18.5, bytes: 359},
}

func run() error {
	var c config
	flag.IntVar(&c.regions, "regions", 3, "regions")
	flag.IntVar(&c.instances, "instances", 2, "instances per region")
	flag.IntVar(&c.keys, "keys", 1, "keys simulated")
	allKeys := flag.Int("all-keys", 0, "active keys the cost is scaled to (0: -keys)")
	flag.DurationVar(&c.sync, "sync", 200*time.Millisecond, "Regions.Sync (0: every peer applies each admission at once)")
	flag.DurationVar(&c.rtt, "rtt", 50*time.Millisecond, "round trip between regions")
	flag.DurationVar(&c.oneway, "oneway", -1, "from a delivery's send to its run on the peer's Redis (negative: rtt/2)")
	flag.Float64Var(&c.rate, "rate", 100, "calls per second each instance offers each key")
	strategy := flag.String("strategy", "tb", "tb (token bucket) or fw (fixed window)")
	flag.Float64Var(&c.limit, "limit", 300, "limit: events per period")
	flag.DurationVar(&c.period, "period", time.Second, "limit's period")
	flag.Float64Var(&c.burst, "burst", 0, "token bucket's burst (0: -limit)")
	flag.DurationVar(&c.run, "run", 8*time.Second, "counted run")
	flag.DurationVar(&c.pre, "pre", 0, "traffic before the counted run (not counted)")
	flag.DurationVar(&c.cut, "cut", 0, "region 0 cut off from the others from the counted run's start, for this long")
	flag.Float64Var(&c.peerFirst, "peer-first", 0.5, "chance that a peer loop's ticker fires before its main loop's")
	flag.DurationVar(&c.spread, "spread", time.Hour, "the instances' tickers start uniformly within this (at most -sync)")
	seeds := flag.Int("seeds", 20, "runs, seeds 1..seeds")
	var k costs
	flag.Float64Var(&k.get, "cost-get", -1, "Redis CPU per journal GET, µs (negative: this machine's, see measured)")
	flag.Float64Var(&k.charge, "cost-charge", -1, "Redis CPU per region script EVALSHA that charges, µs")
	flag.Float64Var(&k.noop, "cost-noop", -1, "Redis CPU per no-op region script EVALSHA, µs")
	flag.Float64Var(&k.share, "cost-share", -1, "Redis CPU per silent-share EVALSHA, µs")
	flag.Float64Var(&k.bytes, "bytes", -1, "bytes of one region script EVALSHA on the link")
	doMeasure := flag.Bool("measure", false, "time the exchange's commands on real redis-servers instead")
	mKeys := flag.Int("measure-keys", 20000, "keys of -measure")
	mRounds := flag.Int("measure-rounds", 5, "rounds of -measure")
	flag.Parse()
	if *doMeasure {
		return measure(*mKeys, *mRounds)
	}
	if _, ok := measured[*strategy]; !ok {
		return fmt.Errorf("strategy %q: tb or fw", *strategy)
	}
	c.fixed = *strategy == "fw"
	if c.burst == 0 {
		c.burst = c.limit
	}
	if c.oneway < 0 {
		c.oneway = c.rtt / 2
	}
	def := measured[*strategy]
	for _, f := range []struct {
		v *float64
		d float64
	}{{&k.get, def.get}, {&k.charge, def.charge}, {&k.noop, def.noop}, {&k.share, def.share}, {&k.bytes, def.bytes}} {
		if *f.v < 0 {
			*f.v = f.d
		}
	}
	if *allKeys == 0 {
		*allKeys = c.keys
	}
	if c.regions < 1 || c.instances < 1 || c.keys < 1 || c.rate <= 0 || c.limit <= 0 || *seeds < 1 {
		return fmt.Errorf("regions, instances, keys, rate, limit and seeds must be positive")
	}
	t0 := time.Now()
	var outs []outcome
	for s := range *seeds {
		c.seed = uint64(s + 1)
		outs = append(outs, simulate(c))
	}
	report(c, outs, float64(*allKeys)/float64(c.keys), k)
	if c.sync > 0 && c.cut == 0 { // the same calls, every admission applied everywhere at once
		b, sum := c, 0.0
		b.sync, b.rtt, b.oneway = 0, 0, 0
		for s := range *seeds {
			b.seed = uint64(s + 1)
			sum += simulate(b).admitted
		}
		mean := sum / float64(*seeds)
		fmt.Printf("  baseline (Sync 0, no latency: the calls' own discreteness): admitted %.1f; the exchange's delay adds %+.1f (%+.2f%% of the limit, %+.3f per key)\n",
			mean, meanAdmitted(outs)-mean, 100*(meanAdmitted(outs)-mean)/outs[0].limit, (meanAdmitted(outs)-mean)/float64(c.keys))
	}
	fmt.Printf("simulated in %v (%d seeds)\n\n", time.Since(t0).Round(time.Millisecond), *seeds)
	return nil
}

func meanAdmitted(outs []outcome) float64 {
	sum := 0.0
	for _, o := range outs {
		sum += o.admitted
	}
	return sum / float64(len(outs))
}

// report prints the admitted totals over the seeds (mean [min..max]) and
// the exchange's cost per region, scaled by scale.
func report(c config, outs []outcome, scale float64, k costs) {
	name := fmt.Sprintf("token bucket %g/%v burst %g", c.limit, c.period, c.burst)
	if c.fixed {
		name = fmt.Sprintf("fixed window %g/%v", c.limit, c.period)
	}
	fmt.Printf("%d regions x %d instances, %d keys simulated (cost scaled to %.0f), Sync %v, RTT %v (one way %v), %g/s per instance per key, %s, run %v (after %v), region 0 cut %v\n",
		c.regions, c.instances, c.keys, scale*float64(c.keys), c.sync, c.rtt, c.oneway, c.rate, name, c.run, c.pre, c.cut)
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for _, o := range outs {
		lo, hi, sum = min(lo, o.admitted), max(hi, o.admitted), sum+o.admitted
	}
	mean, limit := sum/float64(len(outs)), outs[0].limit
	a := mean / c.run.Seconds()
	bound := float64(c.regions-1) * a * (c.sync + c.rtt).Seconds()
	fmt.Printf("  admitted %.1f [%.0f..%.0f] of a limit of %.0f (offered %.0f): over %+.1f (%+.2f%%) [%+.0f..%+.0f]; bound (N-1)·A·(Sync+RTT) = %d·%.1f/s·%v = %.1f (A: admitted per second)\n",
		mean, lo, hi, limit, outs[0].offered, mean-limit, 100*(mean-limit)/limit, lo-limit, hi-limit, c.regions-1, a, c.sync+c.rtt, bound)
	if c.keys > 1 {
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
	if c.sync == 0 {
		return
	}
	secs, intervals := c.run.Seconds(), c.run.Seconds()/c.sync.Seconds()
	lambda := c.rate * float64(c.instances) // a key's calls per second in a region
	fmt.Printf("  analytic: EVALSHA in per region per second (N-1)·keys·min(λ, M/Sync) = %d·%.0f·min(%g/s, %g/s) = %.0f (as many journal GETs), all keys with a journal\n",
		c.regions-1, scale*float64(c.keys), lambda, float64(c.instances)/c.sync.Seconds(),
		float64(c.regions-1)*scale*float64(c.keys)*min(lambda, float64(c.instances)/c.sync.Seconds()))
	for r := range c.regions {
		var n counts
		var peak float64
		for _, o := range outs {
			x := o.region[r]
			n.gets, n.charge, n.noop, n.share, n.pings = n.gets+x.gets, n.charge+x.charge, n.noop+x.noop, n.share+x.share, n.pings+x.pings
			peak += float64(o.peak[r])
		}
		f := scale / float64(len(outs))
		g, ch, no, sh := float64(n.gets)*f, float64(n.charge)*f, float64(n.noop)*f, float64(n.share)*f
		cpu := (g*k.get + ch*k.charge + no*k.noop + sh*k.share) / secs // µs per s
		fmt.Printf("  region %d per interval: GET %.0f, EVALSHA in %.0f (charging %.0f, no-op %.0f), share EVALSHA %.0f, PING in %.1f (not scaled); peak interval %.0f commands\n",
			r, g/intervals, (ch+no)/intervals, ch/intervals, no/intervals, sh/intervals, float64(n.pings)/float64(len(outs))/intervals, peak*f)
		fmt.Printf("  region %d per second:   GET %.0f, EVALSHA in %.0f, share EVALSHA %.0f; Redis CPU %.1f ms/s (%.1f%% of a core); link in %.1f kB/s\n",
			r, g/secs, (ch+no)/secs, sh/secs, cpu/1e3, cpu/1e4, (ch+no)*k.bytes/secs/1e3)
		if c.regions > 4 && r == 0 && c.cut == 0 {
			fmt.Printf("  (the other regions alike)\n")
			break
		}
	}
}
