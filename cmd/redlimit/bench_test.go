package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
)

// TestBenchEmbedded runs every strategy briefly on the embedded miniredis.
func TestBenchEmbedded(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runT(t, "bench", "-duration", "200ms", "-concurrency", "4", "-keys", "3")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	assert.Contains(t, stdout, "embedded miniredis (this measures the library and the go-redis client, not Redis)", "stdout does not say what miniredis measures:\n%s", stdout)
	for _, s := range []string{"fixed-window", "sliding-log", "sliding-counter", "token-bucket", "leaky-bucket"} {
		row := rowOf(stdout, s)
		if !assert.Len(t, row, 7, "no row of 7 columns for %s:\n%s", s, stdout) {
			continue
		}
		assert.NotEqual(t, "0", row[1], "%s: %s decisions, %s errors; want some and none", s, row[1], row[6])
		assert.Equal(t, "0", row[6], "%s: %s decisions, %s errors; want some and none", s, row[1], row[6])
	}
}

// TestBenchRedisAddr runs one strategy against a server given by address,
// and checks that bench leaves no key behind and keeps other keys.
func TestBenchRedisAddr(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	require.NoError(t, m.Set("user-data", "keep"))
	code, stdout, stderr := runT(t, "bench", "-redis", m.Addr(), "-strategy", "sliding-log", "-duration", "200ms", "-rate", "50", "-keys", "2", "-timeout", "2s")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	assert.Contains(t, stdout, "target: Redis at "+m.Addr(), "stdout does not name the target:\n%s", stdout)
	assert.Len(t, rowOf(stdout, "sliding-log"), 7, "want one row, for sliding-log:\n%s", stdout)
	assert.Nil(t, rowOf(stdout, "token-bucket"), "want one row, for sliding-log:\n%s", stdout)
	got := m.Keys()
	assert.Equal(t, []string{"user-data"}, got, "keys after bench = %q, want [user-data]", got)
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var lat []time.Duration
	for i := 1; i <= 200; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{lat[:1], 99, time.Millisecond},
		{lat, 50, 100 * time.Millisecond},
		{lat, 99, 198 * time.Millisecond},
		{lat, 100, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		got := percentile(tt.sorted, tt.p)
		assert.Equal(t, tt.want, got, "percentile(%d values, %v) = %v, want %v", len(tt.sorted), tt.p, got, tt.want)
	}
}

// TestProgress checks both forms of the progress display.
func TestProgress(t *testing.T) {
	t.Parallel()
	var ops atomic.Int64
	ops.Store(1234)
	for _, tty := range []bool{false, true} {
		var buf bytes.Buffer
		p := &progress{w: &buf, tty: tty, total: 3 * time.Second}
		p.show("token-bucket", 1500*time.Millisecond, ops.Load())
		want := "bench token-bucket: 1.5s of 3s, 1234 decisions\n"
		if tty {
			want = "\r\033[Kbench token-bucket: 1.5s of 3s, 1234 decisions"
		}
		got := buf.String()
		assert.Equal(t, want, got, "tty=%v: got %q, want %q", tty, got, want)
	}
	// A writer that is not a terminal gets plain lines.
	assert.False(t, isTerminal(&bytes.Buffer{}), "isTerminal(buffer) = true")
}

// TestBenchBounds checks that -concurrency and -keys past their maxima are
// usage errors, before any connection or allocation: they used to run out
// of memory in the client's pool, the goroutines or the slice of keys.
func TestBenchBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		flag, value, want string
	}{
		{"-concurrency", "10001", "redlimit: bench: -concurrency 10001 must be at most 10000"},
		{"-concurrency", "3000000", "redlimit: bench: -concurrency 3000000 must be at most 10000"},
		{"-concurrency", "100000000", "redlimit: bench: -concurrency 100000000 must be at most 10000"},
		{"-concurrency", "9223372036854775807", "redlimit: bench: -concurrency 9223372036854775807 must be at most 10000"},
		{"-keys", "10000001", "redlimit: bench: -keys 10000001 must be at most 10000000"},
		{"-keys", "3000000000", "redlimit: bench: -keys 3000000000 must be at most 10000000"},
	}
	for _, tt := range tests {
		t.Run(tt.flag+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			// Port 1 of the loopback: nothing listens there, and bench
			// must not get as far as trying.
			for _, redis := range []string{"127.0.0.1:1", ""} {
				code, stdout, stderr := runT(t, "bench", "-redis", redis, "-duration", "10ms", tt.flag, tt.value)
				first, _, _ := strings.Cut(stderr, "\n")
				assert.Equal(t, 2, code, "-redis %q: exit %d, want 2; stderr %q", redis, code, stderr)
				assert.Equal(t, tt.want, first, "-redis %q: stderr %q", redis, stderr)
				assert.Empty(t, stdout, "-redis %q: stdout", redis)
			}
		})
	}

	// The maxima themselves are accepted (running with them would take
	// too long, and too many goroutines for the race detector).
	f := &benchFlags{strategy: strategyValue{all: true, allowAll: true}, duration: time.Second,
		concurrency: maxBenchConcurrency, keys: maxBenchKeys, rate: 10, period: time.Second, timeout: time.Second}
	assert.NoError(t, f.check(), "check with -concurrency %d -keys %d", f.concurrency, f.keys)
	// The help says them.
	code, stdout, _ := runT(t, "help", "bench")
	require.Zero(t, code)
	assert.Contains(t, stdout, "goroutines calling Allow, at most 10000", "help bench:\n%s", stdout)
	assert.Contains(t, stdout, "distinct keys the calls spread over, at most 10000000", "help bench:\n%s", stdout)
}

// TestBenchLimitFirst checks that bench rejects a bad limit as inspect and
// reset do: a usage error about the limit, before it connects to Redis (or
// starts miniredis), not a failure to reach Redis.
func TestBenchLimitFirst(t *testing.T) {
	t.Parallel()
	// A loopback listener that counts the connections it gets and answers
	// none of them.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()

	tests := []struct {
		args []string
		want string // the first line of stderr
	}{
		{[]string{"-rate", "-1"}, "redlimit: bench: fixed-window: limit -1/1s: Rate must be at least 1: invalid limit"},
		{[]string{"-period", "1ns"}, "redlimit: bench: fixed-window: limit 1000/1ns: Period must be at least 1ms: invalid limit"},
		{[]string{"-strategy", "token-bucket", "-burst", "-3"}, "redlimit: bench: token-bucket: limit 1000/1s burst -3: Burst must not be negative: invalid limit"},
	}
	for _, tt := range tests {
		for _, redis := range []string{ln.Addr().String(), ""} {
			args := append([]string{"bench", "-redis", redis, "-duration", "10ms"}, tt.args...)
			code, stdout, stderr := runT(t, args...)
			first, _, _ := strings.Cut(stderr, "\n")
			assert.Equal(t, 2, code, "%q: exit %d, want 2; stderr %q", args, code, stderr)
			assert.Equal(t, tt.want, first, "%q: stderr %q", args, stderr)
			assert.NotContains(t, stderr, "Redis", "%q: stderr %q is about Redis, not the limit", args, stderr)
			assert.Empty(t, stdout, "%q: stdout", args)
		}
	}
	assert.Zero(t, conns.Load(), "bench connected to Redis before it checked the limit")
}

// TestBenchTimeoutBound checks that -timeout past a minute is a usage
// error: 1000000h made the dial timeout (2.5 × -timeout) overflow to a
// negative duration, and every dial failed at once with an i/o timeout.
// newClient saturates the dial timeout anyway.
func TestBenchTimeoutBound(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ value, want string }{
		{"1000000h", "redlimit: bench: -timeout 1000000h0m0s must be at most 1m0s"},
		{"61s", "redlimit: bench: -timeout 1m1s must be at most 1m0s"},
	} {
		for _, redis := range []string{"127.0.0.1:1", ""} {
			code, stdout, stderr := runT(t, "bench", "-redis", redis, "-duration", "10ms", "-timeout", tt.value)
			first, _, _ := strings.Cut(stderr, "\n")
			assert.Equal(t, 2, code, "-timeout %s -redis %q: exit %d, want 2; stderr %q", tt.value, redis, code, stderr)
			assert.Equal(t, tt.want, first, "-timeout %s -redis %q: stderr %q", tt.value, redis, stderr)
			assert.Empty(t, stdout, "-timeout %s -redis %q: stdout", tt.value, redis)
		}
	}
	f := &benchFlags{strategy: strategyValue{all: true, allowAll: true}, duration: time.Second,
		concurrency: 1, keys: 1, rate: 10, period: time.Second, timeout: time.Minute}
	assert.NoError(t, f.check(), "check with -timeout 1m")

	for _, tt := range []struct{ timeout, want time.Duration }{
		{defaultTimeout, 250 * time.Millisecond},
		{time.Minute, 150 * time.Second},
		{1000000 * time.Hour, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		rdb := newClient("127.0.0.1:1", 1, tt.timeout)
		got := rdb.Options().DialTimeout
		rdb.Close()
		assert.Equal(t, tt.want, got, "newClient with timeout %v: dial timeout %v, want %v", tt.timeout, got, tt.want)
	}
}

// TestBenchInterrupted checks that bench deletes its keys when it is
// interrupted (Ctrl-C cancels its context), as it does when it ends: it
// used to return at once and leave them in the user's Redis.
func TestBenchInterrupted(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	require.NoError(t, m.Set("user-data", "keep"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var code int
	var stdout, stderr bytes.Buffer
	go func() {
		defer close(done)
		code = run(ctx, []string{"bench", "-redis", m.Addr(), "-strategy", "token-bucket", "-duration", "1m", "-keys", "50", "-timeout", "2s"}, &stdout, &stderr)
	}()
	// Interrupt it once it has written state.
	require.Eventually(t, func() bool { return len(m.Keys()) > 20 }, 30*time.Second, time.Millisecond, "bench wrote no state")
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "bench did not end when interrupted")
	}
	assert.Equal(t, 1, code, "exit %d, stderr %q", code, stderr.String())
	last := strings.TrimSuffix(stderr.String(), "\n")
	last = last[strings.LastIndex(last, "\n")+1:] // after any progress lines
	assert.Equal(t, "redlimit: context canceled", last, "stderr %q", stderr.String())
	got := m.Keys()
	assert.Equal(t, []string{"user-data"}, got, "keys after an interrupted bench = %d keys %.200q, want [user-data]", len(got), got)
}

// TestBenchResetAll checks that resetAll deletes the state, block and
// reservation keys of every key, over several pipelines and a partial
// last command, and nothing else.
func TestBenchResetAll(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	require.NoError(t, m.Set("user-data", "keep"))
	rdb := newClient(m.Addr(), 2, 2*time.Second)
	defer rdb.Close()
	lim, err := newLimiter(rdb, redlimit.SlidingLog, redlimit.PerSecond(10), redlimit.WithPrefix(benchPrefix))
	require.NoError(t, err)
	defer lim.Close()
	keys := make([]string, 2345)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		for j, name := range stateKeys(benchPrefix, redlimit.SlidingLog, redlimit.PerSecond(1), keys[i]) {
			if i%(j+1) == 0 { // every state, every other block, every third reservation set
				require.NoError(t, m.Set(name, "x"))
			}
		}
	}
	require.NoError(t, m.Set(stateKey(benchPrefix, redlimit.TokenBucket, redlimit.PerSecond(1), "k1"), "other strategy"))
	require.NoError(t, resetAll(context.Background(), rdb, lim, keys))
	got := m.Keys()
	want := []string{"redlimit-bench:{k1}:tb1000000", "user-data"}
	assert.Equal(t, want, got, "keys after resetAll: %d keys %.200q, want %q", len(got), got, want)
}

// TestBenchWorkloads checks what each workload measures, by the allowed
// share that bench prints: by default every call allowed (the defaults were
// 1 key at 1000/s, which measured 2.4% allowed, mostly denials), with
// -workload denied every call but the first denied, and a note when flags
// change the workload's intent. The line that says what was measured
// needs 10 decisions or more to be mostly denials (the first call is
// allowed), which a loaded machine may not make: it is checked then.
func TestBenchWorkloads(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		args     []string
		allowed  func(ops int) int
		measured string
		note     bool
	}{
		{"default", nil, func(ops int) int { return ops }, "measured: mostly allowed decisions", false},
		{"denied", []string{"-workload", "denied"}, func(int) int { return 1 }, "measured: mostly denials", false},
		{"changed", []string{"-keys", "1", "-rate", "1", "-period", "1h"}, func(int) int { return 1 }, "measured: mostly denials", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"bench", "-strategy", "token-bucket", "-duration", "1s", "-concurrency", "2"}, tt.args...)
			code, stdout, stderr := runT(t, args...)
			require.Zero(t, code, "exit %d, stderr %q", code, stderr)
			row := rowOf(stdout, "token-bucket")
			require.Len(t, row, 7, "no row for token-bucket:\n%s", stdout)
			ops, err := strconv.Atoi(row[1])
			require.NoError(t, err, "decisions column %q", row[1])
			share, err := strconv.ParseFloat(strings.TrimSuffix(row[3], "%"), 64)
			require.NoError(t, err, "allowed column %q", row[3])
			// The share is printed to 0.1%: the count it gives is off by up
			// to 0.05% of the decisions.
			got, want := share*float64(ops)/100, tt.allowed(ops)
			assert.InDelta(t, want, got, 0.0005*float64(ops)+0.5, "%s: %v%% of %d allowed: got %.1f, want %d\n%s", tt.name, share, ops, got, want, stdout)
			assert.Contains(t, stdout, fmt.Sprintf("%% of %d decisions allowed)", ops), "%s", stdout)
			if ops < 10 {
				t.Logf("%d decisions: too few to check the measured line", ops)
				return
			}
			assert.Contains(t, stdout, tt.measured, "%s", stdout)
			assert.Equal(t, tt.note, strings.Contains(stdout, "is meant to measure"), "%s", stdout)
		})
	}
	code, _, stderr := runT(t, "bench", "-workload", "mixed")
	assert.Equal(t, 2, code, "an unknown workload: exit %d, stderr %q", code, stderr)
}
