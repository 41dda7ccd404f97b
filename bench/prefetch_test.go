package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// TestPrefetchBench runs cmd/prefetch's load for a moment on a real Redis: every
// run decides without errors, prefetches serve the hot key, and the fleet at
// 4× its limit admits no more than Burst + Rate·d.
func TestPrefetchBench(t *testing.T) {
	s := redistest.Start(t)
	rep, err := RunPrefetch(context.Background(), PrefetchConfig{
		Addr:       s.Addr,
		ClientOpts: redistest.TunedOptions(s.Addr),
		Size:       1000,
		MaxAge:     100 * time.Millisecond,
		Rounds:     1,
		Duration:   300 * time.Millisecond,
		HotRate:    20_000,
		Conc:       8,
	})
	require.NoError(t, err)
	var sb strings.Builder
	rep.Markdown(&sb)
	t.Log("\n" + sb.String())
	for _, ss := range [][]PrefetchSample{rep.PacedPrefetch, rep.PacedPlain, rep.LoopPrefetch, rep.LoopPlain, rep.FleetOver, rep.FleetUnder} {
		require.Len(t, ss, 1)
		assert.Zero(t, ss[0].Errors, ss[0].FirstErr)
		assert.Positive(t, ss[0].Decisions)
	}
	assert.Positive(t, rep.LoopPrefetch[0].Served)
	o := rep.FleetOver[0]
	bound := float64(rep.OverLimit.Burst) + float64(rep.OverLimit.Rate)*o.Elapsed.Seconds()
	assert.LessOrEqual(t, float64(o.Allowed), bound)
}
