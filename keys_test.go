package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Redis memory each strategy keeps per limited key.
func TestMemoryPerKeyRedis(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	for _, s := range Strategies() {
		lim := newLimiter(t, b.rdb, s, Limit{Rate: 1000, Period: time.Minute, Burst: 1000})
		for _, events := range []int{1, 100, 1000} {
			key := fmt.Sprintf("user:%d", 10000+events)
			require.NoError(t, lim.Reset(ctx, key))
			_, err := lim.AllowN(ctx, key, events)
			require.NoError(t, err)
			used, err := b.rdb.MemoryUsage(ctx, lim.stateKey(key), 0).Result() // SAMPLES 0: exact, not sampled
			require.NoError(t, err)
			t.Logf("%-16s key %q, %3d events: MEMORY USAGE %d bytes", s, lim.stateKey(key), events, used)
			switch s {
			case SlidingLog:
			case SubWindowCounter:
				// A hash of two fields here (the events in one sub-window);
				// a full one, TestSubWindowCounterMemoryRedis.
				assert.LessOrEqual(t, used, int64(128), "%v keeps %d bytes per key, want at most 128", s, used)
			default:
				assert.LessOrEqual(t, used, int64(100), "%v keeps %d bytes per key, want at most 100", s, used)
			}
			// A small sorted set is a listpack (about 36 bytes an event); past
			// 128 members Redis makes it a skiplist (about 118).
			if most := int64(100 + 40*min(events, 128) + 150*max(events-128, 0)); s == SlidingLog {
				assert.LessOrEqual(t, used, most, "sliding log keeps %d bytes for %d events, want at most %d", used, events, most)
			}
		}
	}
}
