package main

//go:generate go run . simulate -pattern bursty -rate 10 -period 1s -duration 6s -out ../../docs/simulate.png

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

var simulateCmd = &command{
	name:  "simulate",
	args:  "[flags]",
	short: "replay a traffic pattern through all six strategies and chart it",
	long: `
Simulate sends the same traffic to one limiter of each strategy, all with the
same limit, and reports what each admitted: a table on standard output and,
with -out, a chart (PNG or SVG, by the extension of -out's file) of
admitted requests per -step over time, against the offered traffic. It
writes no file without -out.

It runs on an embedded miniredis with a virtual clock, set before every
request, so it takes no real time and gives the same result on every run.
The clock starts at a window boundary of the fixed-window and
sliding-counter strategies. A leaky-bucket request counts at its arrival
plus the Delay it was given, when the queue lets it out.

The patterns (-offered is the mean rate over the whole run in each of them):

	steady   evenly spaced requests at the offered rate
	bursty   every 2 periods, a burst of 2×period×offered requests, evenly
	         spread over period/10 centred on a window boundary (at 1, 3, 5...
	         periods), where a fixed window admits twice its rate
	ramp     the rate grows linearly from 0 to 2×offered over -duration
	onoff    2 periods at 2×offered, then 2 periods with no traffic, repeated
	         (the mean is offered over whole cycles of 4 periods)
	file     the arrival times in -file: one per line, as a duration ("1.25s")
	         or in seconds ("1.25"); blank lines and lines starting with #
	         are skipped. Without -duration, the run lasts until the last
	         arrival, rounded up to whole periods.

With -subwindows, the sub-window counter cuts each period into that many
sub-windows (0 means 60, or one per whole millisecond for a period under
60ms); its panel of the chart draws their bounds (every one, or every
k-th when there are more than 400), and the table's max/period column
shows it never passes the rate.

With -warmup, the token bucket and the leaky bucket warm up (Limit.WarmUp,
Guava's SmoothWarmingUp): cold at the start, they admit rate/3 and reach the
rate after the warm-up of steady use, which the chart shows as a ramp; the
token bucket's -burst must then be 0. The other strategies ignore it.

With -shares S,N the limiters have redlimit.WithPriorityShares(S, N) and the
requests take the priorities in turn (sheddable, normal, critical: an equal
mix): the table and the chart show what each priority got. Under overload,
sheddable requests get at most S of the capacity and normal ones at most N,
and critical ones keep the rest.

The table's "max/period" column is the most requests admitted in any
interval [t, t+period), counted exactly over the admitted times: a sliding
log never exceeds the rate, a fixed window can reach twice the rate across
a window boundary, and a token bucket can reach burst+rate-1.

With -calendar day, week or month (and -zone, -first), the fixed window
runs a calendar quota (redlimit.Daily, Weekly, Monthly: -rate per calendar
day, week or month in -zone), the others -rate per the calendar's nominal
period (24h, 168h, 744h), and the clock starts at the calendar window that
holds 2030-01-01 00:00 UTC. For example:

	redlimit simulate -calendar day -zone Asia/Tokyo -rate 100 -duration 72h -offered 0.005`,
	setup: setupSimulate,
}

// simFlags are the flags of the simulate command.
type simFlags struct {
	rate     int
	period   time.Duration
	burst    int
	pattern  string
	file     string
	duration time.Duration
	offered  float64
	seed     int64
	out      string
	step     time.Duration
	warmUp   time.Duration
	sub      int
	shares   string
	cal      calendarFlags
}

func setupSimulate(fs *flag.FlagSet) runFunc {
	f := new(simFlags)
	fs.IntVar(&f.rate, "rate", 10, "events allowed per period")
	fs.DurationVar(&f.period, "period", time.Second, "the limit's period")
	fs.IntVar(&f.burst, "burst", 0, "bucket capacity of token-bucket and leaky-bucket (0 means -rate)")
	fs.StringVar(&f.pattern, "pattern", "steady", "traffic `pattern`: steady, bursty, ramp, onoff or file")
	fs.StringVar(&f.file, "file", "", "`path` of the arrival times for -pattern file")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "length of the simulated traffic")
	fs.Float64Var(&f.offered, "offered", 0, "mean offered requests per second (0 means 3 × rate / period)")
	fs.Int64Var(&f.seed, "seed", 0, "if not 0, move each arrival at random by up to half the gap to its neighbours, reproducibly for the seed")
	fs.StringVar(&f.out, "out", "", "chart `file` to write, .png or .svg (none without it)")
	fs.DurationVar(&f.step, "step", 0, "time covered by each point of the chart (0 means period/10)")
	fs.DurationVar(&f.warmUp, "warmup", 0, "warm-up of token-bucket and leaky-bucket: a cold key starts at rate/3 and reaches the rate after it (0 means none)")
	fs.IntVar(&f.sub, "subwindows", 0, "sub-windows per period of sub-window-counter (0 means 60, or one per whole ms under 60ms)")
	fs.StringVar(&f.shares, "shares", "", "`sheddable,normal`: priority shares (see redlimit.WithPriorityShares); requests take the priorities in turn")
	f.cal.register(fs)
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		return f.run(ctx, args, set, stdout)
	}
}

// maxArrivals caps the requests of one simulation: miniredis decides about
// 6000 a second, and every request is decided six times.
const maxArrivals = 200_000

// maxBuckets caps the points of each line in the chart.
const maxBuckets = 100_000

func (f *simFlags) run(ctx context.Context, args []string, set map[string]bool, stdout io.Writer) error {
	sim, err := f.simulation(args, set)
	if err != nil {
		return err
	}
	outs, err := runSimulation(ctx, sim)
	if err != nil {
		return err
	}
	// Before the table, so that a refused run prints nothing: a leaky
	// bucket lets requests out after its queue's delays, which simulation
	// could not know (a queue of 100000 at 1/s drew a million points per
	// line, for 42s and 1.3 GB).
	if n := chartSteps(sim, outs); n > maxBuckets {
		return chartTooLong(sim, outs, n)
	}
	printTable(stdout, sim, outs)
	if f.out == "" {
		fmt.Fprintln(stdout, "\nno chart written (-out FILE.png or FILE.svg writes one)")
		return nil
	}
	if err := writeChart(f.out, sim, outs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nchart written to %s\n", f.out)
	return nil
}

// simulation checks the flags and builds the simulation they describe. The
// steps check in a fixed order, which decides the error of a command line
// with several mistakes.
func (f *simFlags) simulation(args []string, set map[string]bool) (*simulation, error) {
	if len(args) > 0 {
		return nil, usagef("simulate", "unexpected argument %q", args[0])
	}
	if f.file != "" && !set["pattern"] {
		f.pattern = "file"
	}
	if err := checkChartFile(f.out); err != nil {
		return nil, err
	}
	limit, cal, err := f.limits(set)
	if err != nil {
		return nil, err
	}
	f.setDefaults()
	if err := f.checkTraffic(); err != nil {
		return nil, err
	}
	arrivals, err := f.arrivals(set)
	if err != nil {
		return nil, err
	}
	shares, err := parseShares(f.shares)
	if err != nil {
		return nil, err
	}
	if len(arrivals) > maxArrivals {
		return nil, usagef("simulate", "%d requests, more than the %d a simulation can take", len(arrivals), maxArrivals)
	}
	if f.seed != 0 {
		arrivals = jitter(arrivals, f.seed, f.duration)
	}
	if err := f.checkChartPoints(); err != nil {
		return nil, err
	}
	return &simulation{
		limit:    limit,
		calendar: cal,
		pattern:  f.pattern,
		arrivals: arrivals,
		duration: f.duration,
		step:     f.step,
		shares:   shares,
	}, nil
}

// checkChartFile checks that out, the -out flag, names a file the chart
// can be written as: none, or a .png or .svg file.
func checkChartFile(out string) error {
	switch ext := strings.ToLower(filepath.Ext(out)); {
	case out == "", ext == ".png", ext == ".svg":
		return nil
	default:
		return usagef("simulate", "-out %q: the chart must be a .png or .svg file", out)
	}
}

// limits checks and returns the limit of the strategies and, with
// -calendar, the fixed window's calendar quota (the zero Limit without). It
// sets f.period to the calendar's nominal period with -calendar.
//
// The limit comes first, as bench's check does: the defaults divide by the
// period, and the patterns step by it (with -period 0, bursty and onoff
// never ended, a file's arrivals were divided by 0, and the default
// -offered was +Inf).
func (f *simFlags) limits(set map[string]bool) (limit, calendar redlimit.Limit, err error) {
	cal, isCal, err := f.cal.limit("simulate", f.rate)
	if err != nil {
		return limit, calendar, err
	}
	if isCal {
		if set["period"] {
			return limit, calendar, usagef("simulate", "-period is the calendar's with -calendar")
		}
		f.period = cal.Period
		if err := checkLimit(redlimit.FixedWindow, cal); err != nil {
			return limit, calendar, err
		}
		calendar = cal
	}
	limit = redlimit.Limit{Rate: f.rate, Period: f.period, Burst: f.burst, WarmUp: f.warmUp, SubWindows: f.sub}
	for _, s := range redlimit.Strategies() {
		if err := checkLimit(s, limitOf(limit, s)); err != nil {
			return limit, calendar, err // dispatch makes an invalid limit a usage error
		}
	}
	return limit, calendar, nil
}

// setDefaults fills in the flags whose zero value means a default that
// depends on the limit: -offered and -step.
func (f *simFlags) setDefaults() {
	if f.offered == 0 {
		f.offered = 3 * float64(f.rate) / f.period.Seconds()
	}
	if f.step == 0 {
		f.step = f.period / 10
	}
}

// checkTraffic checks the flags that describe the traffic and the chart's
// step, once their defaults are set.
func (f *simFlags) checkTraffic() error {
	switch {
	case f.offered < 0 || math.IsInf(f.offered, 0) || math.IsNaN(f.offered):
		return usagef("simulate", "-offered %v must be a positive number", f.offered)
	case f.duration <= 0:
		return usagef("simulate", "-duration %v must be positive", f.duration)
	case f.duration > redlimit.MaxPeriod:
		return usagef("simulate", "-duration %v must be at most %v", f.duration, redlimit.MaxPeriod)
	case f.step < time.Microsecond:
		return usagef("simulate", "-step %v must be at least 1µs", f.step)
	case f.step > redlimit.MaxPeriod:
		return usagef("simulate", "-step %v must be at most %v", f.step, redlimit.MaxPeriod)
	case f.pattern == "file" && f.file == "":
		return usagef("simulate", "-pattern file needs -file")
	case f.pattern != "file" && f.file != "":
		return usagef("simulate", "-file is only for -pattern file, not %s", f.pattern)
	}
	return nil
}

// arrivals returns the arrival times of the traffic pattern: read from
// -file, keeping those before -duration (which, unless set, runs to the
// last arrival rounded up to whole periods), or generated at -offered for
// -duration, refusing more than maxArrivals.
func (f *simFlags) arrivals(set map[string]bool) ([]time.Duration, error) {
	if f.pattern == "file" {
		arrivals, err := readArrivals(f.file)
		if err != nil {
			return nil, err
		}
		if !set["duration"] {
			f.duration = coverPeriods(arrivals, f.period)
		}
		return before(arrivals, f.duration), nil
	}
	gen, ok := patterns[f.pattern]
	if !ok {
		return nil, usagef("simulate", "unknown pattern %q (want steady, bursty, ramp, onoff or file)", f.pattern)
	}
	if n := f.offered * f.duration.Seconds(); n > maxArrivals {
		return nil, usagef("simulate", "-offered %v for %v is %.0f requests, more than the %d a simulation can take", f.offered, f.duration, n, maxArrivals)
	}
	return gen(f.offered, f.period, f.duration), nil
}

// parseShares parses -shares, "sheddable,normal", into the two shares; it
// returns nil for "", without priorities.
func parseShares(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var sh, no float64
	if n, err := fmt.Sscanf(s, "%g,%g", &sh, &no); err != nil || n != 2 || !(0 < sh && sh <= no && no <= 1) {
		return nil, usagef("simulate", "-shares %q: want sheddable,normal with 0 < sheddable <= normal <= 1, such as 0.5,0.8", s)
	}
	return []float64{sh, no}, nil
}

// checkChartPoints checks that the chart has at most maxBuckets points per
// line. It runs to the end of the traffic, and maybe on for a leaky
// bucket's delays (checked again after the run, see chartSteps): divided
// before adding, as duration + period can overflow.
func (f *simFlags) checkChartPoints() error {
	if n := f.duration/f.step + f.period/f.step + 2; n > maxBuckets {
		return usagef("simulate", "-step %v makes %d chart points; use a longer step", f.step, n)
	}
	return nil
}

// limitOf returns the limit strategy s simulates: l, without its WarmUp
// unless s is a bucket, and without its SubWindows unless s is the
// sub-window counter.
func limitOf(l redlimit.Limit, s redlimit.Strategy) redlimit.Limit {
	if s != redlimit.TokenBucket && s != redlimit.LeakyBucket {
		l.WarmUp = 0
	}
	if s != redlimit.SubWindowCounter {
		l.SubWindows = 0
	}
	return l
}

// simulation is one run of the same traffic through every strategy.
type simulation struct {
	limit redlimit.Limit // with the buckets' WarmUp and the sub-window counter's SubWindows (see limitOf)
	// calendar, with -calendar, is the fixed window's limit (a calendar
	// quota); the other strategies then have limit, of the calendar's
	// nominal Period. The clock starts at the calendar window's start.
	calendar redlimit.Limit
	pattern  string          // name, for titles
	arrivals []time.Duration // request times since the start, sorted, whole µs
	duration time.Duration   // length of the traffic
	step     time.Duration   // chart resolution
	shares   []float64       // -shares: sheddable, normal; nil without priorities
}

// priorities are the priorities that arrivals take in turn with -shares.
var priorities = []redlimit.Priority{redlimit.Sheddable, redlimit.Normal, redlimit.Critical}

// outcome is what one strategy admitted.
type outcome struct {
	strategy redlimit.Strategy
	admitted []time.Duration    // when admitted requests happen (arrival + Delay), sorted
	delay    time.Duration      // sum of the Delays of the admitted requests
	byPrio   [3][]time.Duration // with -shares: admitted, by priority (as in priorities)
}

// meanDelay returns the mean Delay of the admitted requests.
func (o *outcome) meanDelay() time.Duration {
	if len(o.admitted) == 0 {
		return 0
	}
	return o.delay / time.Duration(len(o.admitted))
}

// maxIn returns the most admitted requests in any interval [t, t+w).
func (o *outcome) maxIn(w time.Duration) int {
	return maxInWindow(o.admitted, w)
}

// maxInWindow returns the most times of ts, which is sorted, that fall in
// any interval [t, t+w). Such an interval holding the most times can start
// at one of them, so it is enough to try those.
func maxInWindow(ts []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i, t := range ts {
		for j < len(ts) && ts[j] < t+w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// simEpoch is when the virtual clock starts: 2030-01-01 UTC, moved back to
// a multiple of the period, where the windows of fixed-window and
// sliding-counter start.
func simEpoch(period time.Duration) time.Time {
	us := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	p := int64(period / time.Microsecond)
	return time.UnixMicro(us - us%p).UTC()
}

// runSimulation replays sim's arrivals through one limiter of each strategy,
// on an embedded miniredis whose clock is set to each arrival in turn.
func runSimulation(ctx context.Context, sim *simulation) ([]*outcome, error) {
	m := miniredis.NewMiniRedis()
	defer m.Close()
	m.ClockTTL(true)
	rdb := newPipeClient(m)
	defer rdb.Close()

	lanes, err := newLanes(rdb, sim)
	if err != nil {
		return nil, err
	}
	defer closeLanes(lanes)
	if err := replay(m, sim, priorityContexts(ctx, sim), lanes); err != nil {
		return nil, err
	}
	outs := make([]*outcome, len(lanes))
	for i, ln := range lanes {
		slices.Sort(ln.out.admitted)
		for _, ts := range ln.out.byPrio {
			slices.Sort(ts)
		}
		outs[i] = ln.out
	}
	return outs, nil
}

// lane is one strategy's limiter in a simulation, the key it decides on,
// and what it admitted.
type lane struct {
	lim *redlimit.RateLimiter
	key string
	out *outcome
}

// newLanes returns a lane for each strategy, in the order of
// redlimit.Strategies, each with sim's limit (the fixed window with the
// calendar quota with -calendar) and sim's priority shares. The caller
// closes them with closeLanes.
func newLanes(rdb redis.UniversalClient, sim *simulation) ([]lane, error) {
	var opts []redlimit.Option
	if sim.shares != nil {
		opts = append(opts, redlimit.WithPriorityShares(sim.shares[0], sim.shares[1]))
	}
	var lanes []lane
	for _, s := range redlimit.Strategies() {
		l := limitOf(sim.limit, s)
		if s == redlimit.FixedWindow && sim.calendar.Rate > 0 {
			l = sim.calendar
		}
		lim, err := newLimiter(rdb, s, l, opts...)
		if err != nil {
			closeLanes(lanes)
			return nil, err
		}
		lanes = append(lanes, lane{lim: lim, key: "sim-" + s.String(), out: &outcome{strategy: s}})
	}
	return lanes, nil
}

// closeLanes closes the lanes' limiters, the last one first.
func closeLanes(lanes []lane) {
	for i := len(lanes) - 1; i >= 0; i-- {
		// Its error would report settles or prefetches it could not
		// make: a simulation has neither.
		_ = lanes[i].lim.Close()
	}
}

// priorityContexts returns the contexts that arrivals take in turn: ctx
// alone, or with -shares one for each of priorities.
func priorityContexts(ctx context.Context, sim *simulation) []context.Context {
	if sim.shares == nil {
		return []context.Context{ctx}
	}
	ctxs := make([]context.Context, 0, len(priorities))
	for _, p := range priorities {
		ctxs = append(ctxs, redlimit.ContextWithPriority(ctx, p))
	}
	return ctxs
}

// simStart returns when sim's virtual clock starts: at the calendar window
// that holds 2030-01-01 00:00 UTC with -calendar, else at simEpoch.
func simStart(sim *simulation) time.Time {
	if start, _, ok := sim.calendar.Window(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)); ok {
		return start
	}
	return simEpoch(sim.limit.Period)
}

// replay sets m's clock to each of sim's arrivals in turn and asks every
// lane to allow it, the i-th arrival with ctxs[i%len(ctxs)], recording in
// the lane's outcome when the admitted ones happen.
func replay(m *miniredis.Miniredis, sim *simulation, ctxs []context.Context, lanes []lane) error {
	epoch := simStart(sim)
	for i, at := range sim.arrivals {
		at = at.Truncate(time.Microsecond) // the resolution of Redis TIME
		m.SetTime(epoch.Add(at))
		prio := i % len(ctxs)
		for _, ln := range lanes {
			res, err := ln.lim.Allow(ctxs[prio], ln.key)
			if err != nil {
				return fmt.Errorf("simulate %v at %v: %w", ln.out.strategy, at, err)
			}
			if res.Allowed {
				ln.out.admitted = append(ln.out.admitted, at+res.Delay)
				ln.out.delay += res.Delay
				if sim.shares != nil {
					ln.out.byPrio[prio] = append(ln.out.byPrio[prio], at+res.Delay)
				}
			}
		}
	}
	return nil
}

// printTable writes the comparison table.
func printTable(w io.Writer, sim *simulation, outs []*outcome) {
	fmt.Fprintf(w, "pattern %s, limit %v: %d requests offered in %v (%.1f/s)\n",
		sim.pattern, sim.limit, len(sim.arrivals), sim.duration, float64(len(sim.arrivals))/sim.duration.Seconds())
	if start, _, ok := sim.calendar.Window(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)); ok {
		fmt.Fprintf(w, "fixed-window: the calendar quota %v, from %s\n", sim.calendar, start.Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	const row = "%-18s %8v %9v %11v %11v\n"
	fmt.Fprintf(w, row, "strategy", "offered", "admitted", "max/period", "mean delay")
	for _, o := range outs {
		fmt.Fprintf(w, row, o.strategy, len(sim.arrivals), len(o.admitted), o.maxIn(sim.limit.Period), o.meanDelay().Round(time.Millisecond))
	}
	if sim.shares != nil {
		fmt.Fprintf(w, "\nadmitted by priority (shares %g and %g; offered in equal thirds):\n", sim.shares[0], sim.shares[1])
		const prow = "%-18s %9v %9v %9v\n"
		fmt.Fprintf(w, prow, "strategy", "sheddable", "normal", "critical")
		for _, o := range outs {
			fmt.Fprintf(w, prow, o.strategy, len(o.byPrio[0]), len(o.byPrio[1]), len(o.byPrio[2]))
		}
	}
	fmt.Fprintf(w, "\nmax/period: the most admitted in any interval [t, t+%v); the rate is %d.\n", sim.limit.Period, sim.limit.Rate)
	fmt.Fprintln(w, "leaky-bucket requests count at arrival + Delay; mean delay is over admitted requests.")
}
