package main

import (
	"bytes"
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
