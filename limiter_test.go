package redlimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// suiteLimit is the limit the shared suite uses for s: small, with a short
// period so that real Redis can wait it out, and a burst for the buckets.
func suiteLimit(s Strategy) Limit {
	l := Limit{Rate: 4, Period: 200 * time.Millisecond}
	if s == TokenBucket || s == LeakyBucket {
		l.Burst = 3
	}
	return l
}

// testBehaviour runs the scenarios every strategy must pass, on the Redis
// that newBackend gives (miniredis, real Redis, a real cluster).
func testBehaviour(t *testing.T, newBackend func(t *testing.T) *backend) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			t.Run("exhaust and recover", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
				c := capacity(l, s)
				ctx := context.Background()
				// The c calls that use the allowance and the one denied
				// after them; on a real clock they must not let the limit
				// refill: fit in one window (fixed window, sliding counter),
				// in one period (sliding log), in one interval (buckets). On
				// a loaded machine they may not: then again, on a new key.
				var results []Result
				key := inOneWindow(t, b, s, l, func(key string) {
					results = results[:0]
					for i := range c + 1 {
						res, err := lim.Allow(ctx, key)
						require.NoError(t, err, "Allow %d of %d: %+v, %v", i+1, c, res, err)
						results = append(results, res)
					}
				})
				var last Result
				for i, res := range results[:c] {
					require.True(t, res.Allowed, "Allow %d of %d: %+v", i+1, c, res)
					if s != SlidingCounter {
						assert.Equal(t, c-i-1, res.Remaining, "Allow %d: Remaining = %d, want %d", i+1, res.Remaining, c-i-1)
					}
					last = res
				}
				assert.Greater(t, last.ResetAfter, time.Duration(0), "ResetAfter = %v after using the whole allowance, want in (0, %v]", last.ResetAfter, 2*l.Period)
				assert.LessOrEqual(t, last.ResetAfter, 2*l.Period, "ResetAfter = %v after using the whole allowance, want in (0, %v]", last.ResetAfter, 2*l.Period)
				res := results[c]
				require.False(t, res.Allowed, "over the limit: %+v, want denied, 0 remaining, RetryAfter in (0, %v]", res, 2*l.Period)
				require.Zero(t, res.Remaining, "over the limit: %+v, want denied, 0 remaining, RetryAfter in (0, %v]", res, 2*l.Period)
				require.Greater(t, res.RetryAfter, time.Duration(0), "over the limit: %+v, want denied, 0 remaining, RetryAfter in (0, %v]", res, 2*l.Period)
				require.LessOrEqual(t, res.RetryAfter, 2*l.Period, "over the limit: %+v, want denied, 0 remaining, RetryAfter in (0, %v]", res, 2*l.Period)
				require.Zero(t, res.Delay, "over the limit: %+v, want denied, 0 remaining, RetryAfter in (0, %v]", res, 2*l.Period)
				b.advance(res.RetryAfter)
				res2, err := lim.Allow(ctx, key)
				require.NoError(t, err, "after RetryAfter %v: %+v, %v; want allowed", res.RetryAfter, res2, err)
				require.True(t, res2.Allowed, "after RetryAfter %v: %+v, %v; want allowed", res.RetryAfter, res2, err)
			})
			t.Run("n=0 reports without consuming", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				// An hour: on a real clock the key written must not expire
				// (its window end) between the two snapshots.
				l := suiteLimit(s)
				l.Period = time.Hour
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
				ctx := context.Background()
				key := lim.stateKey("k")
				res, err := lim.AllowN(ctx, "k", 0)
				require.NoError(t, err, "n=0 on a fresh key: %+v, %v", res, err)
				require.True(t, res.Allowed, "n=0 on a fresh key: %+v, %v", res, err)
				require.Equal(t, capacity(lim.limit, s), res.Remaining, "n=0 on a fresh key: %+v, %v", res, err)
				require.Zero(t, res.ResetAfter, "n=0 on a fresh key: %+v, %v", res, err)
				got := snapshot(t, b.rdb, key)
				require.Equal(t, "none", got, "n=0 wrote %s", got)
				_, err = lim.Allow(ctx, "k")
				require.NoError(t, err)
				before := snapshot(t, b.rdb, key)
				_, err = lim.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				after := snapshot(t, b.rdb, key)
				require.Equal(t, before, after, "n=0 changed the state:\nbefore %s\nafter  %s", before, after)
			})
			t.Run("denials write nothing", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				l.Period = time.Hour // no refill while the test runs
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
				ctx := context.Background()
				_, err := lim.AllowN(ctx, "k", capacity(l, s))
				require.NoError(t, err)
				before := snapshot(t, b.rdb, lim.stateKey("k"))
				for range 3 {
					res, err := lim.Allow(ctx, "k")
					require.NoError(t, err, "over the limit: %+v, %v", res, err)
					require.False(t, res.Allowed, "over the limit: %+v, %v", res, err)
				}
				after := snapshot(t, b.rdb, lim.stateKey("k"))
				require.Equal(t, before, after, "a denial changed the state:\nbefore %s\nafter  %s", before, after)
			})
			t.Run("bad arguments", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				lim := newLimiter(t, b.rdb, s, suiteLimit(s), WithPrefix(prefixFor(t)))
				ctx := context.Background()
				_, err := lim.AllowN(ctx, "k", -1)
				mustErrorIs(t, err, ErrInvalidArgument)
				_, err = lim.AllowN(ctx, "k", capacity(lim.limit, s)+1)
				mustErrorIs(t, err, ErrExceedsLimit)
				mustErrorIs(t, lim.WaitN(ctx, "k", capacity(lim.limit, s)+1), ErrExceedsLimit)
				_, err = lim.Allow(ctx, "")
				mustErrorIs(t, err, ErrInvalidArgument)
				mustErrorIs(t, lim.Reset(ctx, ""), ErrInvalidArgument)
				// Nothing was consumed by the bad calls.
				res, err := lim.AllowN(ctx, "k", capacity(lim.limit, s))
				require.NoError(t, err, "the whole allowance after bad calls: %+v, %v", res, err)
				require.True(t, res.Allowed, "the whole allowance after bad calls: %+v, %v", res, err)
			})
			t.Run("reset", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				l.Period = time.Hour
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)), WithBlock(time.Hour))
				ctx := context.Background()
				c := capacity(l, s)
				_, err := lim.AllowN(ctx, "k", c)
				require.NoError(t, err)
				res, _ := lim.Allow(ctx, "k")
				require.False(t, res.Allowed, "allowed over the limit")
				require.NoError(t, lim.Reset(ctx, "k"))
				res, err = lim.Allow(ctx, "k")
				require.NoError(t, err, "after Reset: %+v, %v; want allowed, %d remaining", res, err, c-1)
				require.True(t, res.Allowed, "after Reset: %+v, %v; want allowed, %d remaining", res, err, c-1)
				require.Equal(t, c-1, res.Remaining, "after Reset: %+v, %v; want allowed, %d remaining", res, err, c-1)
			})
			t.Run("keys of every shape", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				l.Period = time.Hour
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
				ctx := context.Background()
				c := capacity(l, s)
				seen := map[string]string{}
				for _, key := range oddKeys() {
					rk := lim.stateKey(key)
					other, dup := seen[rk]
					require.False(t, dup, "keys %q and %q share Redis key %q", key, other, rk)
					seen[rk] = key
					res, err := lim.AllowN(ctx, key, c)
					require.NoError(t, err, "key %.40q: %+v, %v", key, res, err)
					require.True(t, res.Allowed, "key %.40q: %+v, %v", key, res, err)
				}
				// Each key used its whole allowance and none took from another.
				for _, key := range oddKeys() {
					res, err := lim.Allow(ctx, key)
					require.NoError(t, err, "key %.40q over its limit: %+v, %v", key, res, err)
					require.False(t, res.Allowed, "key %.40q over its limit: %+v, %v", key, res, err)
				}
				n, err := countKeys(b.rdb, prefixFor(t)+":*")
				require.NoError(t, err)
				require.Equal(t, len(oddKeys()), n, "%d Redis keys for %d limited keys", n, len(oddKeys()))
			})
			t.Run("TTL of every key written", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)), WithBlock(300*time.Millisecond))
				ctx := context.Background()
				// The allowance used, the TTL read and the call denied after
				// it must fit in one window (and one interval of a bucket),
				// as in "exhaust and recover"; on a loaded machine they may
				// not: then again, on a new key.
				var (
					ttl time.Duration
					res Result
					err error
				)
				key := inOneWindow(t, b, s, l, func(key string) {
					_, err = lim.AllowN(ctx, key, capacity(l, s))
					require.NoError(t, err)
					ttl, err = b.rdb.PTTL(ctx, lim.stateKey(key)).Result()
					require.NoError(t, err)
					res, err = lim.Allow(ctx, key)
				})
				// How long the state matters, at most. A bucket lives at
				// least one period, so that a lowered rate finds what was used.
				// A log's expiry moves once per cell (see slidinglog.lua).
				cell := max(l.Period/64, time.Millisecond)
				most := map[Strategy]time.Duration{
					FixedWindow:      l.Period,                                           // until the window ends
					SlidingLog:       l.Period + cell + time.Millisecond,                 // until the newest event leaves, and a cell
					SlidingCounter:   2 * l.Period,                                       // until the next window ends
					TokenBucket:      max(time.Duration(l.Burst)*l.interval(), l.Period), // until full
					LeakyBucket:      max(time.Duration(l.Burst)*l.interval(), l.Period), // until empty
					SubWindowCounter: l.Period + longestSubWindow(l),                     // until its sub-window's events leave
				}[s]
				assert.Greater(t, ttl, time.Duration(0), "PTTL of %s = %v, want in (0, %v]", key, ttl, most)
				assert.LessOrEqual(t, ttl, most+time.Millisecond, "PTTL of %s = %v, want in (0, %v]", key, ttl, most)
				require.NoError(t, err, "over the limit: %+v, %v", res, err)
				require.False(t, res.Allowed, "over the limit: %+v, %v", res, err)
				checkTTL(t, b.rdb, lim.stateKey(key)+blockSuffix, 300*time.Millisecond)
			})
			t.Run("SCRIPT FLUSH is invisible", func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				l := suiteLimit(s)
				l.Period = time.Hour
				lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
				ctx := context.Background()
				for i := range capacity(l, s) {
					require.NoError(t, scriptFlush(ctx, b.rdb))
					res, err := lim.Allow(ctx, "k")
					require.NoError(t, err, "Allow %d after SCRIPT FLUSH: %+v, %v", i, res, err)
					require.True(t, res.Allowed, "Allow %d after SCRIPT FLUSH: %+v, %v", i, res, err)
					require.False(t, res.Degraded, "Allow %d after SCRIPT FLUSH: %+v, %v", i, res, err)
				}
			})
		})
	}
}

// oddKeys are user keys that could break a naive key scheme.
func oddKeys() []string {
	return []string{
		"user42", "}", "{", "{}", "{a}b", "}{x}", "a}b", "%7Ba%7Db", "%", "%%",
		"a b\nc", "\x00", "\xff\xfe\xfd", "名前", strings.Repeat("k", 10<<10),
	}
}

// clearOfHourEdge waits, when the next hour begins within need (the
// longest the test's calls can take), until it has begun, so that a test
// on a real clock with windows of an hour runs in one window. It costs a
// test at most need, once in 3600/need runs.
func clearOfHourEdge(t testing.TB, need time.Duration) {
	t.Helper()
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < need {
		t.Logf("waiting %v for the hour to begin", left.Round(time.Millisecond))
		time.Sleep(left + 100*time.Millisecond)
	}
}

// inOneWindow runs calls on key "k1", and again on "k2", "k3"... (at most
// 10 times) while they took long enough for the limit (s, l) to refill
// (refillsDuring), each run started just after a window edge
// (startAfterEdge): on a loaded machine a run may not fit. On an exact
// clock it runs once. It returns the key of the last run.
func inOneWindow(t *testing.T, b *backend, s Strategy, l Limit, calls func(key string)) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		startAfterEdge(b, l)
		key := fmt.Sprint("k", attempt)
		began := time.Now()
		calls(key)
		took := time.Since(began)
		if b.exact || !refillsDuring(s, l, began, took) || attempt == 10 {
			return key
		}
		t.Logf("attempt %d: the calls took %v, long enough for the limit to refill; again on a new key", attempt, took)
	}
}

// startAfterEdge waits, on a real clock, until just after the start of a
// window of l's period (the servers share this host's clock), so that a few
// calls fit in one window.
func startAfterEdge(b *backend, l Limit) {
	if b.exact {
		return
	}
	now := time.Duration(time.Now().UnixNano())
	time.Sleep(l.Period - now%l.Period + 5*time.Millisecond)
}

// refillsDuring reports whether calls to a limiter of strategy s and limit l
// that began at began and took took may have seen the limit refill: a window
// edge (fixed window, sliding counter), a whole period (sliding log), one
// interval (buckets).
func refillsDuring(s Strategy, l Limit, began time.Time, took time.Duration) bool {
	switch s {
	case FixedWindow, SlidingCounter:
		return began.UnixNano()/int64(l.Period) != (began.UnixNano()+int64(took))/int64(l.Period)
	case SlidingLog, SubWindowCounter:
		return took >= l.Period
	default:
		return took >= l.interval()
	}
}

// checkTTL fails unless key exists with a TTL in (0, most] (plus 1ms, as
// expiry is in whole milliseconds).
func checkTTL(t *testing.T, rdb redis.UniversalClient, key string, most time.Duration) {
	t.Helper()
	ttl, err := rdb.PTTL(context.Background(), key).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "PTTL %s = %v, want in (0, %v]", key, ttl, most)
	assert.LessOrEqual(t, ttl, most+time.Millisecond, "PTTL %s = %v, want in (0, %v]", key, ttl, most)
}

func countKeys(rdb redis.UniversalClient, pattern string) (int, error) {
	ctx := context.Background()
	n := 0
	count := func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, pattern).Result()
		n += len(keys)
		return err
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu = make(chan struct{}, 1)
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return count(ctx, m)
		})
		return n, err
	case *redis.Client:
		return n, count(ctx, c)
	}
	return 0, errors.New("unknown client type")
}

func scriptFlush(ctx context.Context, rdb redis.UniversalClient) error {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		})
	}
	return rdb.ScriptFlush(ctx).Err()
}

// prefixFor gives each test its own key prefix, so tests can share a Redis
// (also across -count runs, which find the keys earlier runs left).
func prefixFor(t *testing.T) string {
	p, _ := testPrefixes.LoadOrStore(t, fmt.Sprintf("t%d:%s", testRun.Add(1),
		strings.NewReplacer("{", "(", "}", ")", " ", "_").Replace(t.Name())))
	return p.(string)
}

var (
	testPrefixes sync.Map // *testing.T -> prefix
	testRun      atomic.Int64
)

func TestBehaviourMiniredis(t *testing.T) {
	testBehaviour(t, func(t *testing.T) *backend {
		b, _ := miniBackend(t)
		return b
	})
}

func TestConstructorValidation(t *testing.T) {
	b, _ := miniBackend(t)
	tests := []struct {
		name  string
		s     Strategy
		limit Limit
		opts  []Option
		ok    bool
	}{
		{"per second", TokenBucket, PerSecond(10), nil, true},
		{"large values", TokenBucket, Limit{Rate: 1e9, Period: 10 * 365 * 24 * time.Hour, Burst: 1e9}, nil, true},
		{"large fixed window", FixedWindow, Limit{Rate: 1e9, Period: 10 * 365 * 24 * time.Hour}, nil, true},
		{"large sliding counter", SlidingCounter, Limit{Rate: 1e9, Period: 10 * 365 * 24 * time.Hour}, nil, true},
		{"large leaky bucket", LeakyBucket, Limit{Rate: 1e9, Period: 10 * 365 * 24 * time.Hour}, nil, true},
		{"sliding log at its maximum", SlidingLog, Limit{Rate: MaxSlidingLogRate, Period: time.Hour}, nil, true},
		{"sliding log above its maximum", SlidingLog, Limit{Rate: MaxSlidingLogRate + 1, Period: time.Hour}, nil, false},
		{"zero limit", FixedWindow, Limit{}, nil, false},
		{"rate 0", FixedWindow, Limit{Rate: 0, Period: time.Second}, nil, false},
		{"negative rate", FixedWindow, Limit{Rate: -1, Period: time.Second}, nil, false},
		{"rate too large", TokenBucket, Limit{Rate: MaxRate + 1, Period: time.Second}, nil, false},
		{"period below 1ms", FixedWindow, Limit{Rate: 1, Period: 999 * time.Microsecond}, nil, false},
		{"period not whole µs", FixedWindow, Limit{Rate: 1, Period: time.Second + 1}, nil, false},
		{"period too long", FixedWindow, Limit{Rate: 1, Period: MaxPeriod + time.Hour}, nil, false},
		{"negative burst", TokenBucket, Limit{Rate: 1, Period: time.Second, Burst: -1}, nil, false},
		{"burst too large", TokenBucket, Limit{Rate: 1, Period: time.Second, Burst: MaxRate + 1}, nil, false},
		{"bucket interval 10µs", TokenBucket, Limit{Rate: 100_000, Period: time.Second}, nil, true},
		{"bucket interval below 10µs", TokenBucket, Limit{Rate: 100_001, Period: time.Second}, nil, true},
		{"leaky interval below 10µs", LeakyBucket, Limit{Rate: 200, Period: time.Millisecond}, nil, true},
		{"bucket at a trillion per second", TokenBucket, Limit{Rate: MaxRate, Period: time.Second}, nil, true},
		{"window at a billion per second", FixedWindow, Limit{Rate: 1e9, Period: time.Second}, nil, true},
		{"bucket taking 100 years to refill", TokenBucket, Limit{Rate: 1, Period: time.Hour, Burst: 876_000}, nil, true},
		{"bucket taking longer to refill", TokenBucket, Limit{Rate: 1, Period: 3 * time.Hour, Burst: 1 << 40}, nil, false},
		{"unknown strategy", Strategy(9), PerSecond(1), nil, false},
		{"empty prefix", TokenBucket, PerSecond(1), []Option{WithPrefix("")}, false},
		{"prefix with {", TokenBucket, PerSecond(1), []Option{WithPrefix("a{b")}, false},
		{"prefix with }", TokenBucket, PerSecond(1), []Option{WithPrefix("a}b")}, false},
		{"fallback share 0", TokenBucket, PerSecond(1), []Option{WithFallbackShare(0)}, false},
		{"fallback share 2", TokenBucket, PerSecond(1), []Option{WithFallbackShare(2)}, false},
		{"unknown policy", TokenBucket, PerSecond(1), []Option{WithFallback(FallbackPolicy(7))}, false},
		{"ping interval 0", TokenBucket, PerSecond(1), []Option{WithPingInterval(0)}, false},
		{"fallback keys 0", TokenBucket, PerSecond(1), []Option{WithFallbackKeys(0)}, false},
		{"block negative", TokenBucket, PerSecond(1), []Option{WithBlock(-time.Second)}, false},
		{"deny cache negative", TokenBucket, PerSecond(1), []Option{WithDenyCache(-1)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim, err := New(b.rdb, tt.s, tt.limit, tt.opts...)
			if tt.ok {
				require.NoError(t, err, "New: %v", err)
				defer lim.(*RateLimiter).Close()
				// A valid limit never fails at call time.
				res, err := lim.Allow(context.Background(), "k")
				require.NoError(t, err, "Allow: %+v, %v", res, err)
				require.True(t, res.Allowed, "Allow: %+v, %v", res, err)
				return
			}
			require.Error(t, err, "New(%v) accepted an invalid configuration", tt.limit)
			// An invalid option is an invalid argument, not an invalid limit.
			want, notWant := ErrInvalidLimit, ErrInvalidArgument
			if tt.opts != nil {
				want, notWant = ErrInvalidArgument, ErrInvalidLimit
			}
			mustErrorIs(t, err, want)
			assert.NotErrorIs(t, err, notWant)
			assert.True(t, strings.HasPrefix(err.Error(), "redlimit: "), "error %q lacks the package prefix", err)
		})
	}
	_, err := NewTokenBucket(nil, PerSecond(1))
	assert.ErrorIs(t, err, ErrInvalidArgument, "nil client: err = %v", err)
}

func TestStrategyNames(t *testing.T) {
	for _, s := range Strategies() {
		got, err := ParseStrategy(s.String())
		assert.NoError(t, err, "ParseStrategy(%q) = %v, %v", s.String(), got, err)
		assert.Equal(t, s, got, "ParseStrategy(%q) = %v, %v", s.String(), got, err)
	}
	want := "fixed-window sliding-log sliding-counter token-bucket leaky-bucket sub-window-counter"
	var names []string
	for _, s := range Strategies() {
		names = append(names, s.String())
	}
	got := strings.Join(names, " ")
	assert.Equal(t, want, got, "names = %q, want %q", got, want)
	_, err := ParseStrategy("gcra")
	assert.Error(t, err, "ParseStrategy accepted an unknown name")
	got = Strategy(0).String()
	assert.Equal(t, "Strategy(0)", got, "Strategy(0).String() = %q", got)
	got = (Limit{Rate: 10, Period: time.Second, Burst: 20}).String()
	assert.Equal(t, "10/1s burst 20", got, "Limit.String() = %q", got)
}

// Limiters with different strategies or periods never share state; limiters
// that differ only in Rate or Burst do, so a limit can change during a
// rolling deploy.
func TestStateSharing(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := context.Background()
	perSecond := newLimiter(t, b.rdb, TokenBucket, PerSecond(2))
	perHour := newLimiter(t, b.rdb, TokenBucket, PerHour(2))
	window := newLimiter(t, b.rdb, FixedWindow, PerSecond(2))
	_, err := perSecond.AllowN(ctx, "user", 2)
	require.NoError(t, err)
	for _, other := range []*RateLimiter{perHour, window} {
		res, err := other.AllowN(ctx, "user", 2)
		assert.NoError(t, err, "%v %v was affected by another limiter: %+v, %v", other.Strategy(), other.Limit(), res, err)
		assert.True(t, res.Allowed, "%v %v was affected by another limiter: %+v, %v", other.Strategy(), other.Limit(), res, err)
	}
	// A new Rate and Burst for the same strategy and period: same state.
	raised := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 2, Period: time.Second, Burst: 4})
	res, err := raised.AllowN(ctx, "user", 0)
	assert.NoError(t, err, "raised burst sees %+v, %v; want the 2 tokens used by the old limit counted (2 left)", res, err)
	assert.Equal(t, 2, res.Remaining, "raised burst sees %+v, %v; want the 2 tokens used by the old limit counted (2 left)", res, err)
}

// The server clock going backwards (after a failover, or an NTP step) must
// not make state negative or admit more than the limit; a jump forward
// refills to the limit, never past it. The steps back cover every distance
// in windows modulo 10 (a window's key tells its window by the index's last
// digit, and its expiry beyond that), but a sliding counter's 9 (see
// docs/clock.md).
func TestClockSteps(t *testing.T) {
	backs := []time.Duration{time.Hour, time.Hour + 7*time.Second}
	for w := 1; w <= 10; w++ { // 1 to 10 windows of a second
		backs = append(backs, time.Duration(w)*time.Second)
	}
	for _, s := range Strategies() {
		for _, back := range backs {
			if s == SlidingCounter && back == 9*time.Second {
				continue // weighed as its previous window's (docs/clock.md)
			}
			t.Run(s.String()+"/back "+back.String(), func(t *testing.T) {
				b, m := miniBackend(t)
				l := Limit{Rate: 5, Period: time.Second, Burst: 5}
				lim := newLimiter(t, b.rdb, s, l)
				ctx := context.Background()
				b.setClock(2*time.Hour + 500*time.Millisecond)
				res, err := lim.AllowN(ctx, "k", 5)
				require.NoError(t, err, "AllowN(5): %+v, %v", res, err)
				require.True(t, res.Allowed, "AllowN(5): %+v, %v", res, err)
				b.setClock(2*time.Hour + 500*time.Millisecond - back)
				moveExpiries(m, back)
				admitted := 0
				for i := range 10 {
					res, err := lim.Allow(ctx, "k")
					require.NoError(t, err, "Allow %d after the clock went back: %v", i, err)
					require.GreaterOrEqual(t, res.Remaining, 0, "negative state: %+v", res)
					require.GreaterOrEqual(t, res.RetryAfter, time.Duration(0), "negative state: %+v", res)
					require.GreaterOrEqual(t, res.ResetAfter, time.Duration(0), "negative state: %+v", res)
					require.GreaterOrEqual(t, res.Delay, time.Duration(0), "negative state: %+v", res)
					if res.Allowed {
						admitted++
					}
					b.advance(50 * time.Millisecond)
				}
				require.LessOrEqual(t, admitted, 0, "admitted %d more within the same real second after the clock went back %v", admitted, back)
			})
		}
		t.Run(s.String()+"/forward", func(t *testing.T) {
			b, _ := miniBackend(t)
			l := Limit{Rate: 5, Period: time.Second, Burst: 5}
			lim := newLimiter(t, b.rdb, s, l)
			ctx := context.Background()
			_, err := lim.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			b.advance(time.Hour)
			res, err := lim.AllowN(ctx, "k", 0)
			require.NoError(t, err, "an hour later: %+v, %v; want exactly 5 remaining", res, err)
			require.Equal(t, 5, res.Remaining, "an hour later: %+v, %v; want exactly 5 remaining", res, err)
			_, err = lim.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			res, _ = lim.Allow(ctx, "k")
			require.False(t, res.Allowed, "admitted a 6th event in the same instant")
		})
	}
}

// realBackend runs the shared suite on a real redis-server: time passes by
// sleeping. Its client is steadyOptions's.
func realBackend(t *testing.T) *backend {
	s := realServer(t)
	rdb := redis.NewClient(steadyOptions(s.Addr))
	t.Cleanup(func() { rdb.Close() })
	return &backend{name: "redis", rdb: rdb, advance: time.Sleep}
}

// steadyTimeout is the dial, pool, read and write timeout of the clients of
// the tests that run on a healthy Redis.
const steadyTimeout = 2 * time.Second

// steadyOptions are redistest.TunedOptions with room for a loaded machine,
// for the tests that check decisions on a healthy Redis (not how soon a
// failure is seen: the fault tests do, with the tuned options): on 2 busy
// cores under -race a dial or a reply can take more than the tuned 100 ms,
// and a timeout there is a fallback decision that fails such a test for
// nothing the library did. The pool holds 64 connections, the most
// goroutines one of these tests runs, so that no call waits for a
// connection, and every timeout is 2 s.
func steadyOptions(addr string) *redis.Options {
	opts := redistest.TunedOptions(addr)
	opts.PoolSize = 64
	opts.DialTimeout, opts.PoolTimeout = steadyTimeout, steadyTimeout
	opts.ReadTimeout, opts.WriteTimeout = steadyTimeout, steadyTimeout
	return opts
}

func TestBehaviourRedis(t *testing.T) {
	clearOfHourEdge(t, time.Minute) // the suite's hour-long windows, on a real clock
	testBehaviour(t, realBackend)
}
