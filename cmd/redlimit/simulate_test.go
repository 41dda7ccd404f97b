package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redlimit/redlimit"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simulateT runs a simulation of pattern and returns the outcomes by
// strategy.
func simulateT(t *testing.T, name string, limit redlimit.Limit, offered float64, d time.Duration, seed int64) map[redlimit.Strategy]*outcome {
	t.Helper()
	arrivals := patterns[name](offered, limit.Period, d)
	if seed != 0 {
		arrivals = jitter(arrivals, seed, d)
	}
	sim := &simulation{limit: limit, pattern: name, arrivals: arrivals, duration: d, step: limit.Period / 10}
	outs, err := runSimulation(context.Background(), sim)
	require.NoError(t, err, "runSimulation: %v", err)
	by := make(map[redlimit.Strategy]*outcome)
	for _, o := range outs {
		by[o.strategy] = o
	}
	require.Len(t, by, len(redlimit.Strategies()), "got %d strategies, want %d", len(by), len(redlimit.Strategies()))
	return by
}

// TestSimulateBursty checks the differences the bursty pattern is made to
// show: bursts of 60 requests in 100ms centred on the window boundaries at
// 1s, 3s and 5s, against 10/1s.
func TestSimulateBursty(t *testing.T) {
	t.Parallel()
	const rate = 10
	limit := redlimit.Limit{Rate: rate, Period: time.Second}
	by := simulateT(t, "bursty", limit, 3*rate, 6*time.Second, 0)

	// A fixed window admits its rate on each side of a boundary: 2×rate
	// within 100ms, but it never holds more than rate in each of the two
	// windows an interval of one period can overlap.
	fw := by[redlimit.FixedWindow].maxIn(time.Second)
	assert.Greater(t, fw, rate, "fixed-window: max in any period = %d, want in (%d, %d]", fw, rate, 2*rate)
	assert.LessOrEqual(t, fw, 2*rate, "fixed-window: max in any period = %d, want in (%d, %d]", fw, rate, 2*rate)
	// The exact log never admits more than rate in [t, t+period).
	got := by[redlimit.SlidingLog].maxIn(time.Second)
	assert.LessOrEqual(t, got, rate, "sliding-log: max in any period = %d, want <= %d", got, rate)
	// A token bucket holds burst tokens and refills fewer than rate in less
	// than a period, T = period/rate apart: at most burst + rate - 1.
	got, bound := by[redlimit.TokenBucket].maxIn(time.Second), rate+rate-1
	assert.LessOrEqual(t, got, bound, "token-bucket: max in any period = %d, want <= %d", got, bound)
	// The queue holds bursts back.
	delay := by[redlimit.LeakyBucket].meanDelay()
	assert.Greater(t, delay, time.Duration(0), "leaky-bucket: mean delay = %v, want > 0", delay)

	// The run is deterministic, so its numbers are exact. Each burst of 60
	// gets rate from each strategy (2×rate from the fixed window, one
	// window on each side); the leaky bucket's burst of 10 gets delays 0,
	// 100ms, ..., 900ms, minus how late in the burst each arrived.
	want := []struct {
		s        redlimit.Strategy
		admitted int
		maxIn    int
	}{
		{redlimit.FixedWindow, 60, 20},
		{redlimit.SlidingLog, 30, 10},
		{redlimit.SlidingCounter, 30, 10},
		{redlimit.TokenBucket, 30, 10},
		{redlimit.LeakyBucket, 30, 10},
	}
	for _, w := range want {
		o := by[w.s]
		got := len(o.admitted)
		assert.Equal(t, w.admitted, got, "%v: admitted %d, want %d", w.s, got, w.admitted)
		got = o.maxIn(time.Second)
		assert.Equal(t, w.maxIn, got, "%v: max in any period %d, want %d", w.s, got, w.maxIn)
	}
}

// TestSimulateBounds checks, for many patterns and limits, the most each
// strategy can admit in any interval [t, t+period).
func TestSimulateBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		limit   redlimit.Limit
		offered float64
		seed    int64
	}{
		{"steady", redlimit.Limit{Rate: 10, Period: time.Second}, 30, 0},
		{"steady", redlimit.Limit{Rate: 10, Period: time.Second}, 9, 0},
		{"bursty", redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 30, 0},
		{"bursty", redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 30, 7},
		{"ramp", redlimit.Limit{Rate: 10, Period: time.Second}, 30, 0},
		{"ramp", redlimit.Limit{Rate: 8, Period: 500 * time.Millisecond, Burst: 3}, 40, 3},
		{"onoff", redlimit.Limit{Rate: 10, Period: time.Second}, 30, 0},
		{"onoff", redlimit.Limit{Rate: 5, Period: 2 * time.Second, Burst: 1}, 12, 11},
		{"bursty", redlimit.Limit{Rate: 10, Period: time.Second, SubWindows: 3}, 30, 5},
		{"ramp", redlimit.Limit{Rate: 7, Period: 700 * time.Millisecond, SubWindows: 1}, 30, 2},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"/"+tt.limit.String(), func(t *testing.T) {
			t.Parallel()
			by := simulateT(t, tt.pattern, tt.limit, tt.offered, 8*time.Second, tt.seed)
			rate, burst := tt.limit.Rate, tt.limit.Burst
			if burst == 0 {
				burst = rate
			}
			bounds := map[redlimit.Strategy]int{
				redlimit.FixedWindow:      2 * rate, // rate in each of two windows
				redlimit.SlidingLog:       rate,
				redlimit.SlidingCounter:   2 * rate, // as documented
				redlimit.TokenBucket:      burst + rate - 1,
				redlimit.LeakyBucket:      rate, // output spaced period/rate apart
				redlimit.SubWindowCounter: rate, // as the sliding log
			}
			for s, bound := range bounds {
				o := by[s]
				got := o.maxIn(tt.limit.Period)
				assert.LessOrEqual(t, got, bound, "%v: max in any %v = %d, want <= %d", s, tt.limit.Period, got, bound)
				if s != redlimit.LeakyBucket {
					assert.Zero(t, o.delay, "%v: total delay %v, want 0", s, o.delay)
				}
			}
		})
	}
}

// TestTokenBucketBoundIsTight shows that burst + rate - 1 is reached: a
// full bucket of 10 at time 0, then one token every 100ms until 900ms.
func TestTokenBucketBoundIsTight(t *testing.T) {
	t.Parallel()
	by := simulateT(t, "steady", redlimit.Limit{Rate: 10, Period: time.Second}, 30, 3*time.Second, 0)
	got, want := by[redlimit.TokenBucket].maxIn(time.Second), 19
	assert.Equal(t, want, got, "token-bucket: max in any period = %d, want %d", got, want)
}

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	ms := func(xs ...int) []time.Duration {
		var ts []time.Duration
		for _, x := range xs {
			ts = append(ts, time.Duration(x)*time.Millisecond)
		}
		return ts
	}
	tests := []struct {
		ts   []time.Duration
		w    time.Duration
		want int
	}{
		{nil, time.Second, 0},
		{ms(5), time.Second, 1},
		{ms(0, 999, 1000), time.Second, 2},      // [t, t+w) is half-open
		{ms(0, 500, 999, 1000), time.Second, 3}, // 0..999
		{ms(0, 1000, 1500, 1999), time.Second, 3},
		{ms(7, 7, 7), time.Millisecond, 3},
	}
	for _, tt := range tests {
		got := maxInWindow(tt.ts, tt.w)
		assert.Equal(t, tt.want, got, "maxInWindow(%v, %v) = %d, want %d", tt.ts, tt.w, got, tt.want)
	}
}

func TestPatterns(t *testing.T) {
	t.Parallel()
	const d = 8 * time.Second
	tests := []struct {
		name string
		want int // requests at 30/s over 8s, period 1s
	}{
		{"steady", 240},
		{"bursty", 240}, // 4 bursts of 60
		{"ramp", 240},
		{"onoff", 240}, // 2 cycles of 2s at 60/s
	}
	for _, tt := range tests {
		ts := patterns[tt.name](30, time.Second, d)
		got := len(ts)
		assert.Equal(t, tt.want, got, "%s: %d requests, want %d", tt.name, got, tt.want)
		checkArrivals(t, tt.name, ts, d)
		checkArrivals(t, tt.name+" jittered", jitter(ts, 42, d), d)
	}
}

// checkArrivals checks that ts is sorted, in whole µs and within [0, d).
func checkArrivals(t *testing.T, name string, ts []time.Duration, d time.Duration) {
	t.Helper()
	assert.True(t, slices.IsSorted(ts), "%s: arrivals not sorted", name)
	for _, at := range ts {
		if !assert.GreaterOrEqual(t, at, time.Duration(0), "%s: arrival %v not a whole µs in [0, %v)", name, at, d) ||
			!assert.Less(t, at, d, "%s: arrival %v not a whole µs in [0, %v)", name, at, d) ||
			!assert.Zero(t, at%time.Microsecond, "%s: arrival %v not a whole µs in [0, %v)", name, at, d) {
			return
		}
	}
}

func TestReadArrivals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		text    string
		want    []time.Duration
		wantErr string
	}{
		{"# comment\n1.25s\n\n0.5\n300ms\n", []time.Duration{300 * time.Millisecond, 500 * time.Millisecond, 1250 * time.Millisecond}, ""},
		{"0.0000004\n", []time.Duration{0}, ""},
		{"1s\nsoon\n", nil, ":2: bad time \"soon\""},
		{"-1\n", nil, ":1: negative time"},
		{"# nothing\n", nil, "no arrival times"},
	}
	for i, tt := range tests {
		path := filepath.Join(dir, "arrivals"+string(rune('a'+i)))
		require.NoError(t, os.WriteFile(path, []byte(tt.text), 0o644))
		got, err := readArrivals(path)
		switch {
		case tt.wantErr != "":
			assert.ErrorContains(t, err, tt.wantErr, "readArrivals(%q): error %v, want one containing %q", tt.text, err, tt.wantErr)
		case err != nil:
			assert.NoError(t, err, "readArrivals(%q): %v", tt.text, err)
		default:
			assert.Equal(t, tt.want, got, "readArrivals(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestSimulateCommand runs the command as a user would and checks its table
// and charts.
func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		file  string
		magic string
	}{
		{"chart.png", "\x89PNG\r\n\x1a\n"},
		{"chart.svg", "<?xml"},
	} {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			testSimulateChart(t, filepath.Join(dir, tt.file), tt.magic)
		})
	}
}

// testSimulateChart runs simulate with -out path and checks its table and
// that the chart starts with magic.
func testSimulateChart(t *testing.T, out, magic string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"simulate", "-pattern", "bursty", "-duration", "4s", "-out", out}, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	// Two bursts of 60, at 1s and 3s.
	for _, want := range [][]string{
		{"fixed-window", "120", "40", "20", "0s"},
		{"sliding-log", "120", "20", "10", "0s"},
	} {
		got := rowOf(stdout.String(), want[0])
		assert.Equal(t, want, got, "row %q, want %q\n%s", got, want, stdout.String())
	}
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(b), 1000, "%s: %d bytes starting %q, want a chart starting %q", out, len(b), b[:min(len(b), 8)], magic)
	assert.True(t, strings.HasPrefix(string(b), magic), "%s: %d bytes starting %q, want a chart starting %q", out, len(b), b[:min(len(b), 8)], magic)
	if strings.HasSuffix(out, ".svg") {
		assert.True(t, strings.Contains(string(b), "leaky-bucket: 20 of 120 admitted"), "%s: no panel title for leaky-bucket", out)
	}
}

// TestSimulateFile replays arrivals from a file: two requests on each side
// of the window boundary at 1s, with a limit of 2/1s.
func TestSimulateFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "arrivals.txt")
	require.NoError(t, os.WriteFile(path, []byte("0.9\n0.95\n1.0\n1.05\n"), 0o644))
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "-file", path, "-rate", "2", "-out", filepath.Join(dir, "c.svg")}
	code := run(context.Background(), args, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	assert.Contains(t, stdout.String(), "pattern file, limit 2/1s: 4 requests offered in 2s", "stdout lacks the summary line:\n%s", stdout.String())
	for _, want := range [][]string{
		{"fixed-window", "4", "4", "4", "0s"},
		{"sliding-log", "4", "2", "2", "0s"},
		{"token-bucket", "4", "2", "2", "0s"},
	} {
		got := rowOf(stdout.String(), want[0])
		assert.Equal(t, want, got, "row %q, want %q", got, want)
	}
}

// rowOf returns the fields of the first line of out that starts with name.
func rowOf(out, name string) []string {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	return nil
}

// runBounded runs a command line as runT does, but fails the test, instead
// of hanging or crashing it, if the command panics or takes longer than d.
func runBounded(t *testing.T, d time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
		panicked       any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			r.panicked = recover()
			done <- r
		}()
		var out, errw bytes.Buffer
		r.code = run(context.Background(), args, &out, &errw)
		r.stdout, r.stderr = out.String(), errw.String()
	}()
	select {
	case r := <-done:
		require.Nil(t, r.panicked, "%q panicked: %v", args, r.panicked)
		return r.code, r.stdout, r.stderr
	case <-time.After(d):
		require.FailNow(t, "command did not end", "%q still running after %v", args, d)
		return 0, "", ""
	}
}

// refused runs simulate with args, within d, and checks
// that it is refused as a usage error whose first line is want, with
// nothing on standard output and no chart written.
func refused(t *testing.T, d time.Duration, args []string, want string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "chart.png")
	code, stdout, stderr := runBounded(t, d, append([]string{"simulate", "-out", out}, args...)...)
	first, _, _ := strings.Cut(stderr, "\n")
	assert.Equal(t, 2, code, "%q: exit %d, want 2; stderr %q", args, code, stderr)
	assert.Equal(t, want, first, "%q: stderr %q", args, stderr)
	assert.Empty(t, stdout, "%q: stdout", args)
	assert.NoFileExists(t, out, "%q: chart written", args)
}

// TestSimulateChecksLimitFirst checks that simulate refuses a bad limit
// before it builds any traffic: the patterns step by the period, so a
// period of 0 never ended (bursty, onoff), a negative one spun for
// seconds, a file's arrivals were divided by it, and the default -offered
// became +Inf.
func TestSimulateChecksLimitFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	arrivals := filepath.Join(dir, "arrivals.txt")
	require.NoError(t, os.WriteFile(arrivals, []byte("0.5\n1.5\n"), 0o644))
	const zero = "redlimit: simulate: fixed-window: limit 10/0s: Period must be at least 1ms: invalid limit"
	tests := []struct {
		args []string
		want string // the first line of stderr
	}{
		{[]string{"-pattern", "bursty", "-period", "0", "-offered", "5", "-step", "1ms"}, zero},
		{[]string{"-pattern", "onoff", "-period", "0", "-offered", "5", "-step", "1ms"}, zero},
		{[]string{"-pattern", "file", "-file", arrivals, "-period", "0", "-offered", "1", "-step", "1ms"}, zero},
		{[]string{"-period", "0"}, zero},
		{[]string{"-period", "-1s"}, "redlimit: simulate: fixed-window: limit 10/-1s: Period must be at least 1ms: invalid limit"},
		{[]string{"-pattern", "bursty", "-rate", "0"}, "redlimit: simulate: fixed-window: limit 0/1s: Rate must be at least 1: invalid limit"},
		// Only the sliding log refuses this one: every strategy is checked.
		{[]string{"-rate", "2000000", "-offered", "1"}, "redlimit: simulate: sliding-log: limit 2000000/1s: Rate must be at most 100000: invalid limit"},
		{[]string{"-pattern", "ramp", "-burst", "-1"}, "redlimit: simulate: fixed-window: limit 10/1s burst -1: Burst must not be negative: invalid limit"},
	}
	for _, tt := range tests {
		refused(t, 5*time.Second, tt.args, tt.want)
	}
}

// TestSimulateHugeDurations checks -duration and -step at and past their
// bounds: past redlimit.MaxPeriod they are usage errors (-step 1000000h
// printed the table, then panicked making the chart, as the end of its
// axis overflowed; -duration 2000000h made duration + period overflow, so
// that the bound on chart points let it through), and at it the chart is
// drawn without overflow.
func TestSimulateHugeDurations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		args []string
		want string // the first line of stderr
	}{
		{[]string{"-step", "1000000h"}, "redlimit: simulate: -step 1000000h0m0s must be at most 876000h0m0s"},
		{[]string{"-duration", "2000000h", "-period", "876000h", "-offered", "1e-12", "-step", "1h"}, "redlimit: simulate: -duration 2000000h0m0s must be at most 876000h0m0s"},
		{[]string{"-duration", "2562047h", "-offered", "1e-12"}, "redlimit: simulate: -duration 2562047h0m0s must be at most 876000h0m0s"},
		{[]string{"-duration", "876000h", "-offered", "1e-12", "-step", "1ms"}, "redlimit: simulate: -step 1ms makes 3153600001002 chart points; use a longer step"},
	}
	for _, tt := range tests {
		refused(t, 10*time.Second, tt.args, tt.want)
	}

	// At the bounds: one step of 100 years, and bursts and on-off cycles
	// of a period of 100 years, whose next start is past what a Duration
	// holds.
	for i, args := range [][]string{
		{"-step", "876000h", "-duration", "1s"},
		{"-pattern", "bursty", "-rate", "1", "-period", "876000h", "-duration", "876000h", "-step", "876000h"},
		{"-pattern", "onoff", "-rate", "1", "-period", "876000h", "-duration", "876000h", "-step", "876000h"},
	} {
		out := filepath.Join(dir, "ok"+strconv.Itoa(i)+".svg")
		code, stdout, stderr := runBounded(t, 20*time.Second, append([]string{"simulate", "-out", out}, args...)...)
		require.Zero(t, code, "%q: exit %d, stderr %q", args, code, stderr)
		assert.Contains(t, stdout, "chart written to "+out, "%q: stdout %q", args, stdout)
		assert.FileExists(t, out, "%q: no chart", args)
	}
}

// TestSimulateLeakyBucketChart checks that a leaky bucket's delays, which
// let requests out long after the traffic, cannot make a chart of more
// than maxBuckets points: a queue of 200 at 1/s lets the last of 200
// requests out at 199s, 199,001 steps of 1ms. simulation's bound
// (2s + 1s in steps of 1ms) let it through, and the chart had a million
// points per line for a queue of 100000. It is refused before the table,
// with a step that fits.
func TestSimulateLeakyBucketChart(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "c.png")
	code, stdout, stderr := runBounded(t, 60*time.Second, "simulate", "-rate", "1", "-burst", "200", "-period", "1s",
		"-duration", "2s", "-offered", "100", "-step", "1ms", "-out", out)
	first, _, _ := strings.Cut(stderr, "\n")
	assert.Equal(t, 2, code, "exit %d, want 2; stderr %q", code, stderr)
	const want = "redlimit: simulate: leaky-bucket lets its last request out at 3m19s, after the delay of its queue: with -step 1ms the chart needs 199001 points per line, more than 100000; use a -step of at least 2ms"
	assert.Equal(t, want, first, "stderr %q", stderr)
	assert.Empty(t, stdout, "the table is printed only for a run whose chart can be drawn")
	assert.NoFileExists(t, out, "chart written")

	// The step it suggests is enough (checked without drawing its 100,000
	// points, which takes a minute with the race detector).
	limit := redlimit.Limit{Rate: 1, Period: time.Second, Burst: 200}
	sim := &simulation{limit: limit, pattern: "steady", arrivals: steady(100, time.Second, 2*time.Second), duration: 2 * time.Second, step: time.Millisecond}
	outs, err := runSimulation(context.Background(), sim)
	require.NoError(t, err)
	require.Equal(t, int64(199_001), chartSteps(sim, outs))
	err = chartTooLong(sim, outs, chartSteps(sim, outs))
	require.ErrorContains(t, err, "use a -step of at least 2ms")
	sim.step = 2 * time.Millisecond
	got := chartSteps(sim, outs)
	assert.LessOrEqual(t, got, int64(maxBuckets), "with the suggested -step 2ms: %d chart points", got)
}

// TestSimulateWarmUp checks -warmup's ramp: with a warm-up the buckets
// start at rate/3 (a cold token bucket at 10/s with a 3 s warm-up admits
// about 3 in the first second, and all 10 once warm), the other strategies
// are as without it, and a warming token bucket with a burst is refused.
func TestSimulateWarmUp(t *testing.T) {
	t.Parallel()
	limit := redlimit.Limit{Rate: 10, Period: time.Second, WarmUp: 3 * time.Second}
	warm := simulateT(t, "steady", limit, 50, 7*time.Second, 0)
	limit.WarmUp = 0
	plain := simulateT(t, "steady", limit, 50, 7*time.Second, 0)
	in := func(o *outcome, from, to time.Duration) int {
		n := 0
		for _, at := range o.admitted {
			if at >= from && at < to {
				n++
			}
		}
		return n
	}
	for _, s := range []redlimit.Strategy{redlimit.TokenBucket, redlimit.LeakyBucket} {
		first, last := in(warm[s], 0, time.Second), in(warm[s], 6*time.Second, 7*time.Second)
		assert.InDelta(t, 4, first, 1, "%v: %d admitted in the first second, cold (rate/3, rising)", s, first)
		assert.Equal(t, 10, last, "%v: %d admitted in the 7th second, warm", s, last)
		assert.Less(t, len(warm[s].admitted), len(plain[s].admitted), "%v", s)
	}
	for _, s := range []redlimit.Strategy{redlimit.FixedWindow, redlimit.SlidingLog, redlimit.SlidingCounter} {
		assert.Equal(t, plain[s].admitted, warm[s].admitted, "%v ignores -warmup", s)
	}

	var out bytes.Buffer
	code := run(context.Background(), []string{"simulate", "-warmup", "1s", "-burst", "20", "-out", filepath.Join(t.TempDir(), "c.png")}, &out, &out)
	assert.Equal(t, 2, code)
	assert.Contains(t, out.String(), "a warming token bucket never bursts: Burst must be 0")
}

// TestSimulateWritesOnlyOut runs simulate without -out in an empty working
// directory: it prints the table and writes nothing (it used to leave a
// chart.png there).
func TestSimulateWritesOnlyOut(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"simulate", "-pattern", "bursty", "-duration", "4s"}, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	assert.Equal(t, []string{"fixed-window", "120", "40", "20", "0s"}, rowOf(stdout.String(), "fixed-window"), "%s", stdout.String())
	assert.Contains(t, stdout.String(), "no chart written")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "simulate without -out wrote %v", entries)
}

// With -shares the requests take the priorities in turn, and the table
// shows what each got: a fixed window of 30/1s under 90/s of steady
// traffic, trios of sheddable, normal and critical requests, admits in
// each window 5 sheddable (the 6th would bring usage to 16, past 15), 10
// normal (usage up to 24) and 15 critical (the rest, up to 30).
func TestSimulateShares(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	out := filepath.Join(t.TempDir(), "chart.svg")
	code := run(context.Background(), []string{"simulate", "-rate", "30", "-duration", "4s", "-shares", "0.5,0.8", "-out", out}, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	table := stdout.String()[strings.Index(stdout.String(), "admitted by priority"):]
	assert.Equal(t, []string{"fixed-window", "20", "40", "60"}, rowOf(table, "fixed-window"), "%s", table)
	for _, s := range redlimit.Strategies() {
		row := rowOf(table, s.String())
		require.Len(t, row, 4, "%s", table)
		sh, _ := strconv.Atoi(row[1])
		no, _ := strconv.Atoi(row[2])
		cr, _ := strconv.Atoi(row[3])
		assert.True(t, sh <= no && no <= cr, "%v: sheddable %d, normal %d, critical %d: the lower priorities shed first", s, sh, no, cr)
	}
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(b), "critical", "the chart's legend names the priorities")

	code = run(context.Background(), []string{"simulate", "-shares", "0.9,0.5", "-out", out}, &stdout, &stderr)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr.String(), `-shares "0.9,0.5"`)
}

// The sub-window counter's panel draws its sub-window bounds: -subwindows
// of them a period, at b·Period/SubWindows rounded up to the µs; every
// k-th when there are more than maxBounds; none when fewer than one a
// period would be left.
func TestSimulateSubWindowBounds(t *testing.T) {
	sim := &simulation{limit: redlimit.Limit{Rate: 10, Period: time.Second, SubWindows: 3}, duration: 2 * time.Second, step: 100 * time.Millisecond}
	o := &outcome{strategy: redlimit.SubWindowCounter}
	b := subWindowBounds(sim, o)
	require.NotNil(t, b)
	assert.Equal(t, []float64{0, 0.333334, 0.666667, 1, 1.333334, 1.666667, 2, 2.333334, 2.666667}, b.xs)
	assert.Equal(t, "sub-window bounds (3 a period)", b.label)

	sim.limit.SubWindows = 0 // 60
	sim.duration = 20 * time.Second
	b = subWindowBounds(sim, o)
	require.NotNil(t, b)
	assert.LessOrEqual(t, len(b.xs), maxBounds)
	assert.Equal(t, "every 4 sub-window bounds (60 a period)", b.label)

	sim.duration = time.Hour
	sim.step = time.Minute
	assert.Nil(t, subWindowBounds(sim, o), "60 bounds a second over an hour")

	out := filepath.Join(t.TempDir(), "sim.svg")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"simulate", "-pattern", "bursty", "-duration", "4s", "-subwindows", "4", "-out", out}, &stdout, &stderr)
	require.Zero(t, code, "exit %d, stderr %q", code, stderr.String())
	assert.Contains(t, stdout.String(), "limit 10/1s sub-windows 4")
	got := rowOf(stdout.String(), "sub-window-counter")
	assert.Equal(t, []string{"sub-window-counter", "120", "20", "10", "0s"}, got, stdout.String())
	chart, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(chart), "sub-window bounds (4 a period)")
	assert.Contains(t, string(chart), "sub-window-counter: 20 of 120 admitted")
}
