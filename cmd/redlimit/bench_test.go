package main

import (
	"bytes"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
