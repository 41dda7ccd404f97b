package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
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
				redlimit.FixedWindow:    2 * rate, // rate in each of two windows
				redlimit.SlidingLog:     rate,
				redlimit.SlidingCounter: 2 * rate, // as documented
				redlimit.TokenBucket:    burst + rate - 1,
				redlimit.LeakyBucket:    rate, // output spaced period/rate apart
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
