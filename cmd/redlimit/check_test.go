package main

import (
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// TestCheckRedis runs "redlimit check" on real servers started with each
// policy, and on miniredis, which has no CONFIG command.
func TestCheckRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // the start of stdout
	}{
		{"noeviction", []string{"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"}, 0, "ok: no server at "},
		{"maxmemory 0", []string{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"}, 0, "ok: no server at "},
		{"allkeys-lru", []string{"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"}, 1, "evicts: Redis "},
		{"volatile-lru", []string{"--maxmemory", "2mb", "--maxmemory-policy", "volatile-lru"}, 1, "evicts: Redis "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.Start(t, tc.args...)
			code, stdout, stderr := runT(t, "check", "-redis", s.Addr)
			require.Equal(t, tc.code, code, "stdout %q, stderr %q", stdout, stderr)
			assert.True(t, strings.HasPrefix(stdout, tc.stdout), "stdout %q, want it to start %q", stdout, tc.stdout)
			if tc.code == 1 {
				assert.Contains(t, stdout, s.Addr+" has maxmemory 2097152 and maxmemory-policy "+tc.name)
				assert.Equal(t, "redlimit: 1 server(s) at "+s.Addr+" may evict limiter keys, which then come back with a full allowance\n", stderr)
			}
		})
	}
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		code, stdout, stderr := runT(t, "check", "-redis", m.Addr())
		require.Zero(t, code, "stderr %q", stderr)
		assert.True(t, strings.HasPrefix(stdout, "ok: "), "stdout %q", stdout)
	})
	t.Run("unreachable", func(t *testing.T) {
		code, _, stderr := runT(t, "check", "-redis", "127.0.0.1:1")
		assert.Equal(t, 1, code)
		assert.True(t, strings.HasPrefix(stderr, "redlimit: cannot reach Redis at 127.0.0.1:1: "), "stderr %q", stderr)
	})
}
