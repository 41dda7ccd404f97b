package main

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestBenchEmbedded runs every strategy briefly on the embedded miniredis.
func TestBenchEmbedded(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runT(t, "bench", "-duration", "200ms", "-concurrency", "4", "-keys", "3")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, "embedded miniredis (this measures the library and the go-redis client, not Redis)") {
		t.Errorf("stdout does not say what miniredis measures:\n%s", stdout)
	}
	for _, s := range []string{"fixed-window", "sliding-log", "sliding-counter", "token-bucket", "leaky-bucket"} {
		row := rowOf(stdout, s)
		if len(row) != 7 {
			t.Errorf("no row of 7 columns for %s:\n%s", s, stdout)
			continue
		}
		if row[1] == "0" || row[6] != "0" {
			t.Errorf("%s: %s decisions, %s errors; want some and none", s, row[1], row[6])
		}
	}
}

// TestBenchRedisAddr runs one strategy against a server given by address,
// and checks that bench leaves no key behind and keeps other keys.
func TestBenchRedisAddr(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	if err := m.Set("user-data", "keep"); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runT(t, "bench", "-redis", m.Addr(), "-strategy", "sliding-log", "-duration", "200ms", "-rate", "50", "-keys", "2", "-timeout", "2s")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, "target: Redis at "+m.Addr()) {
		t.Errorf("stdout does not name the target:\n%s", stdout)
	}
	if row := rowOf(stdout, "sliding-log"); len(row) != 7 || rowOf(stdout, "token-bucket") != nil {
		t.Errorf("want one row, for sliding-log:\n%s", stdout)
	}
	if got := m.Keys(); len(got) != 1 || got[0] != "user-data" {
		t.Errorf("keys after bench = %q, want [user-data]", got)
	}
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
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("percentile(%d values, %v) = %v, want %v", len(tt.sorted), tt.p, got, tt.want)
		}
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
		if got := buf.String(); got != want {
			t.Errorf("tty=%v: got %q, want %q", tty, got, want)
		}
	}
	// A writer that is not a terminal gets plain lines.
	if isTerminal(&bytes.Buffer{}) {
		t.Error("isTerminal(buffer) = true")
	}
}
