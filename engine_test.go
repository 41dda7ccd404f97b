package redlimit

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A script's µs become a Duration that is never negative and saturates
// instead of wrapping (a wait past 292 years read as negative, and Wait
// then polled Redis every millisecond).
func TestMicrosSaturates(t *testing.T) {
	for _, tc := range []struct {
		us   int64
		want time.Duration
	}{
		{-1, 0},
		{0, 0},
		{1, time.Microsecond},
		{math.MaxInt64 / 1000, time.Duration(math.MaxInt64/1000) * time.Microsecond},
		{math.MaxInt64/1000 + 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		assert.Equal(t, tc.want, micros(tc.us), "micros(%d)", tc.us)
	}
}
