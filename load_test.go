package redlimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Load tests of the rate limiters: goroutines hammer one key, and the
// admitted events are held to each strategy's bound (TestConcurrencyRedis
// here, TestConcurrencyCluster in cluster_test.go).

// concurrencyCase is a limit to hammer, and the bound on admissions that
// the strategy guarantees for any interval of client time.
type concurrencyCase struct {
	s     Strategy
	limit Limit
}

// TestConcurrencyRedis runs 64 goroutines on one key for 2 s per strategy
// on a real Redis, and checks every interval of the admitted events
// (timestamps taken after each call returns): never more than the strategy
// allows, and not fewer than it should.
func TestConcurrencyRedis(t *testing.T) {
	testConcurrency(t, func(t *testing.T) redis.UniversalClient { return realBackend(t).rdb }, 2*time.Second)
}

func testConcurrency(t *testing.T, client func(t *testing.T) redis.UniversalClient, runFor time.Duration) {
	// Periods of half a second: many windows in the run, and a rate (200/s)
	// far below what 64 goroutines offer even under -race on 2 busy cores.
	cases := []concurrencyCase{
		{FixedWindow, Limit{Rate: 100, Period: 500 * time.Millisecond}},
		{SlidingLog, Limit{Rate: 100, Period: 500 * time.Millisecond}},
		{SlidingCounter, Limit{Rate: 100, Period: 500 * time.Millisecond}},
		{TokenBucket, Limit{Rate: 100, Period: 500 * time.Millisecond, Burst: 50}},
		{LeakyBucket, Limit{Rate: 100, Period: 500 * time.Millisecond, Burst: 50}},
		{SubWindowCounter, Limit{Rate: 100, Period: 500 * time.Millisecond, SubWindows: 10}},
	}
	for _, tc := range cases {
		t.Run(tc.s.String(), func(t *testing.T) {
			rdb := client(t)
			lim := newLimiter(t, rdb, tc.s, tc.limit, WithPrefix(prefixFor(t)))
			admitted, done, maxCall := hammer(t, lim, "hot", 64, runFor)
			checkAdmissions(t, tc, admitted, done, maxCall, runFor)
		})
	}
}

// hammer calls Allow from g goroutines until d has passed, and returns the
// times (after each call returned) of the admitted calls and of all calls,
// sorted, and the longest call.
func hammer(t *testing.T, lim Limiter, key string, g int, d time.Duration) (admitted, done []time.Duration, maxCall time.Duration) {
	t.Helper()
	start := time.Now()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for range g {
		wg.Go(func() {
			var mine, all []time.Duration
			var longest time.Duration
			for time.Since(start) < d {
				before := time.Now()
				res, err := lim.Allow(context.Background(), key)
				after := time.Since(start)
				all = append(all, after)
				if err != nil || res.Degraded {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%+v, %v", res, err)
					}
					mu.Unlock()
					return
				}
				longest = max(longest, time.Since(before))
				if res.Allowed {
					mine = append(mine, after)
				}
			}
			mu.Lock()
			admitted = append(admitted, mine...)
			done = append(done, all...)
			maxCall = max(maxCall, longest)
			mu.Unlock()
		})
	}
	wg.Wait()
	require.NoError(t, firstErr, "a call failed or fell back: %v", firstErr)
	slices.Sort(admitted)
	slices.Sort(done)
	return admitted, done, maxCall
}

// stalled returns, for the sorted times done at which calls returned, how
// long no call returned in [from, to] beyond fill each time: a bucket that
// nobody calls for longer than it takes to fill (Burst/Rate) loses the
// excess, through no fault of the limiter. Calls on a machine shared with
// other work, under -race, can all wait hundreds of ms to run; on a quiet
// machine the gaps are far below fill and stalled is 0.
func stalled(done []time.Duration, from, to, fill time.Duration) time.Duration {
	var lost time.Duration
	prev := from
	for _, d := range done {
		if d < from || d > to {
			continue
		}
		lost += max(0, d-prev-fill)
		prev = d
	}
	return lost + max(0, to-prev-fill)
}

// checkAdmissions checks the admitted times against the strategy's bound.
// A call admitted at server time s is stamped at client time c in
// [s, s+maxCall], so an interval of client time [a, b] holds only events of
// server time [a-maxCall, b]: each bound below is taken over an interval
// stretched by maxCall.
func checkAdmissions(t *testing.T, tc concurrencyCase, admitted, done []time.Duration, maxCall time.Duration, runFor time.Duration) {
	t.Helper()
	l := tc.limit
	burst := l.Burst
	if burst == 0 {
		burst = l.Rate
	}
	// most is the most events the strategy may admit in server time of
	// length span.
	most := func(span time.Duration) float64 {
		periods := float64(span) / float64(l.Period)
		switch tc.s {
		case SlidingLog, SubWindowCounter:
			// Rate in any Period: an interval of k periods and a bit holds
			// at most Rate per started period.
			return float64(l.Rate) * float64(int(periods)+1)
		case FixedWindow, SlidingCounter:
			// At most Rate per aligned window (the counter's current count
			// never passes Rate); an interval touches ceil(periods)+1 windows.
			return float64(l.Rate) * float64(int(periods)+2)
		default: // token and leaky bucket: Burst, then Rate per Period
			return float64(burst) + float64(l.Rate)*periods
		}
	}
	violations := 0
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			span := admitted[j] - admitted[i] + maxCall
			if float64(j-i+1) > most(span)+0.5 {
				violations++
				if violations < 4 {
					assert.LessOrEqual(t, float64(j-i+1), most(span)+0.5, "%d events admitted within %v of client time (+%v max call): more than %v allows (%.1f)",
						j-i+1, admitted[j]-admitted[i], maxCall, tc.s, most(span))
				}
				break
			}
			if span > 3*l.Period {
				break
			}
		}
	}
	// What should be admitted from the first admission to the last (the
	// goroutines take a moment to start, and calls are slow under -race),
	// and at most over the whole run.
	require.NotEmpty(t, admitted, "nothing admitted")
	span := admitted[len(admitted)-1] - admitted[0]
	expect := func(d time.Duration) float64 {
		periods := float64(d) / float64(l.Period)
		if tc.s == TokenBucket || tc.s == LeakyBucket {
			return float64(burst) + float64(l.Rate)*periods
		}
		return float64(l.Rate) * periods
	}
	// The times are the client's, when each call returned: the server
	// decided the first admission up to maxCall before it was stamped and
	// the last one up to maxCall before, so the span of server time is at
	// least span-maxCall.
	serverSpan := span - maxCall
	var lost time.Duration
	if tc.s == TokenBucket || tc.s == LeakyBucket {
		// What the buckets could not admit because no call came (see stalled).
		lost = stalled(done, admitted[0], admitted[len(admitted)-1], time.Duration(burst)*l.interval())
		serverSpan -= lost
	}
	ideal := expect(serverSpan)
	if tc.s == FixedWindow || tc.s == SlidingLog {
		// Each window (or each Period after the first admission) admits Rate
		// at once: the span holds at least its whole periods' worth (the
		// batch at its end may be cut short by the end of the run).
		ideal = float64(l.Rate) * float64(int(serverSpan/l.Period))
	}
	got := float64(len(admitted))
	// Tolerance: the counter's estimate weighs the previous window as if its
	// events were even; when they came in a burst at the start, it admits
	// less (down to about half the rate in steady hammering).
	low := 0.95
	switch tc.s {
	case SlidingCounter:
		low = 0.5
	case SubWindowCounter:
		// An event counts until a Period after its sub-window ends: up to
		// Period plus one sub-window (here 10% more), Rate per 550 ms.
		low = 0.85
	}
	t.Logf("%v %v: %d calls, %d admitted in %v (ideal %.0f, %.0f%%), longest call %v, %v without calls beyond the time to fill",
		tc.s, l, len(done), len(admitted), span.Round(time.Millisecond), ideal, 100*got/ideal, maxCall, lost.Round(time.Millisecond))
	assert.GreaterOrEqual(t, got, low*ideal, "admitted %d, fewer than %.0f%% of the %.0f the limit allows", len(admitted), low*100, ideal)
	ideal = expect(runFor)
	assert.LessOrEqual(t, got, ideal+float64(burst)+float64(l.Rate), "admitted %d, more than the %.0f the limit allows over the run", len(admitted), ideal)
}
