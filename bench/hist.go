package bench

import (
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram in nanoseconds, in the manner of
// HdrHistogram: values below 128 ns are exact, above that each power of two
// is split in 64 buckets, so a reported percentile is within 1/64 (1.6 %) of
// the true value. Recording is a few instructions and never allocates; each
// worker goroutine owns one, and they are merged after the run.
type hist struct {
	counts [histBuckets]uint32
	n      uint64
}

const (
	histLinear  = 128 // values below this have a bucket each
	histSub     = 64  // buckets per power of two above histLinear
	histShifts  = 40  // covers up to 2^47 ns (39 hours)
	histBuckets = histLinear + histShifts*histSub
)

func histIndex(v uint64) int {
	if v < histLinear {
		return int(v)
	}
	shift := bits.Len64(v) - 7 // v>>shift is in [64, 128)
	i := histLinear + (shift-1)*histSub + int(v>>uint(shift)) - histSub
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// histValue returns the middle of bucket i.
func histValue(i int) uint64 {
	if i < histLinear {
		return uint64(i)
	}
	k := i - histLinear
	shift := uint(k/histSub + 1)
	sub := uint64(k%histSub + histSub)
	return sub<<shift + (1<<shift)/2
}

func (h *hist) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(uint64(d))]++
	h.n++
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the latency at quantile q in [0, 1].
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += uint64(c)
		if seen >= rank {
			return time.Duration(histValue(i))
		}
	}
	return time.Duration(histValue(histBuckets - 1))
}
