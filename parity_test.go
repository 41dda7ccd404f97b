package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A sliding log never asks Redis for PEXPIRE 1, which Redis before 7.2 can
// turn into an immediate delete (see slidinglog.lua): with a 1 ms Period the
// log lives 2 ms.
func TestSlidingLogTTLAtLeast2ms(t *testing.T) {
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, Limit{Rate: 5, Period: time.Millisecond}, WithPrefix("ttl2"))
	res, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Equal(t, 2*time.Millisecond, m.TTL(lim.stateKey("k")))
}
