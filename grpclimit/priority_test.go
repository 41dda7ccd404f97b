package grpclimit_test

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
)

// WithPriority puts each call's priority on the limiter's call: with
// shares 0.5 and 0.8 of 10, Watch streams (Sheddable) get 5, Check calls
// (Critical) the other 5.
func TestWithPriority(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(windowStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10), redlimit.WithPriorityShares(0.5, 0.8))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	s := newServer(t, lim, grpclimit.WithPriority(func(_ context.Context, fullMethod string) redlimit.Priority {
		if fullMethod == "/grpc.health.v1.Health/Watch" {
			return redlimit.Sheddable
		}
		return redlimit.Critical
	}))
	count := func(call func() error) int {
		n := 0
		for range 20 {
			err := call()
			if err == nil {
				n++
				continue
			}
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		}
		return n
	}
	assert.Equal(t, 5, count(func() error { return s.watch(t) }), "Sheddable: half of 10")
	assert.Equal(t, 5, count(func() error { _, err := s.check(t); return err }), "Critical: the rest")
}
