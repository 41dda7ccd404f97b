package redlimit

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is aligned to every period the tests use, so windows start at t0.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// backend is a Redis the shared tests run against.
type backend struct {
	name string
	rdb  redis.UniversalClient
	// advance moves the server clock forward by d (miniredis: exactly and
	// instantly; real Redis: by sleeping).
	advance func(d time.Duration)
	// setClock moves the server clock to t0+d; nil when the clock cannot be
	// set (real Redis).
	setClock func(d time.Duration)
	// exact tells whether time stands still between calls, so that
	// RetryAfter and ResetAfter can be compared exactly.
	exact bool
}

// miniBackend starts a miniredis whose TIME and TTLs follow a controlled
// clock that starts at t0.
func miniBackend(t testing.TB) (*backend, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	now := t0
	m.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return &backend{
		name:     "miniredis",
		rdb:      rdb,
		advance:  func(d time.Duration) { now = now.Add(d); m.SetTime(now) },
		setClock: func(d time.Duration) { now = t0.Add(d); m.SetTime(now) },
		exact:    true,
	}, m
}

// moveExpiries moves the expiry of every key on m d later: what a step
// back of the server's clock by d does to Redis, which keeps expiries as
// times, where miniredis keeps what is left of them.
func moveExpiries(m *miniredis.Miniredis, d time.Duration) {
	for _, k := range m.Keys() {
		m.SetTTL(k, m.TTL(k)+d)
	}
}

// newLimiter builds a limiter and closes it at the end of the test.
func newLimiter(t testing.TB, rdb redis.UniversalClient, s Strategy, l Limit, opts ...Option) *RateLimiter {
	t.Helper()
	lim, err := New(rdb, s, l, opts...)
	require.NoError(t, err, "New(%v, %v): %v", s, l, err)
	rl := lim.(*RateLimiter)
	t.Cleanup(func() { rl.Close() })
	return rl
}

// step is one call in a table: move the clock, ask for n, check the result.
type step struct {
	advance   time.Duration
	n         int
	allowed   bool
	remaining int
	retry     time.Duration
	reset     time.Duration
	delay     time.Duration
}

// run plays steps against lim on b, checking every field of every result.
func run(t *testing.T, b *backend, lim Limiter, key string, steps []step) {
	t.Helper()
	ctx := context.Background()
	var at time.Duration
	for i, s := range steps {
		if s.advance > 0 {
			b.advance(s.advance)
			at += s.advance
		}
		res, err := lim.AllowN(ctx, key, s.n)
		require.NoError(t, err, "step %d (t=%v, n=%d): %v", i, at, s.n, err)
		got := fmt.Sprintf("allowed=%v remaining=%d retry=%v reset=%v delay=%v",
			res.Allowed, res.Remaining, res.RetryAfter, res.ResetAfter, res.Delay)
		want := fmt.Sprintf("allowed=%v remaining=%d retry=%v reset=%v delay=%v",
			s.allowed, s.remaining, s.retry, s.reset, s.delay)
		assert.Equal(t, want, got, "step %d (t=%v, n=%d):\n got %s\nwant %s", i, at, s.n, got, want)
		assert.False(t, res.Degraded, "step %d: Degraded result from a healthy Redis", i)
	}
}

// snapshot returns a printable copy of a key's value and expiry time, to
// check that a call wrote nothing.
func snapshot(t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := rdb.Type(ctx, key).Result()
	require.NoError(t, err, "TYPE %s: %v", key, err)
	var val string
	switch typ {
	case "none":
		return "none"
	case "string":
		val, err = rdb.Get(ctx, key).Result()
	case "hash":
		var m map[string]string
		m, err = rdb.HGetAll(ctx, key).Result()
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k+"="+m[k])
		}
		sort.Strings(keys)
		val = strings.Join(keys, ",")
	case "zset":
		var z []redis.Z
		z, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		val = fmt.Sprint(z)
	default:
		require.FailNow(t, "unexpected key type", "key %s has unexpected type %s", key, typ)
	}
	require.NoError(t, err, "read %s: %v", key, err)
	return fmt.Sprintf("%s %s expires %v", typ, val, expireTime(t, rdb, key))
}

// expireTime returns key's absolute expiry in ms: PEXPIRETIME, or on
// servers before 7.0 the server's TIME plus PTTL, read in one script that
// reads TIME before and after PTTL until both fall in one millisecond (else
// a millisecond edge, or a loaded machine descheduling the server, between
// the two reads would make the sum off by one or more).
func expireTime(t *testing.T, rdb redis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	exp, err := rdb.PExpireTime(ctx, key).Result()
	if err == nil {
		return int64(exp / time.Millisecond)
	}
	require.Contains(t, strings.ToLower(err.Error()), "unknown command", "PEXPIRETIME %s", key)
	v, err := expireScript.Run(ctx, rdb, []string{key}).Int64Slice()
	require.NoError(t, err, "TIME and PTTL %s", key)
	require.Len(t, v, 2, "TIME and PTTL %s", key)
	if v[1] < 0 {
		return v[1]
	}
	return v[0] + v[1]
}

var expireScript = redis.NewScript(`local function ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
while true do
  local before = ms()
  local pttl = redis.call('PTTL', KEYS[1])
  if ms() == before then return {before, pttl} end
end`)

// capacity is the most events a fresh key admits at once.
func capacity(l Limit, s Strategy) int {
	if s == TokenBucket || s == LeakyBucket {
		if l.Burst > 0 {
			return l.Burst
		}
	}
	return l.Rate
}

func mustErrorIs(t *testing.T, err, target error) {
	t.Helper()
	require.ErrorIs(t, err, target, "err = %v, want one wrapping %v", err, target)
}

// interval is the time one event is worth: Period/Rate, rounded up.
func (l Limit) interval() time.Duration {
	return time.Duration(math.Ceil(float64(l.Period) / float64(l.Rate)))
}

// passHooks is what a test's redis.Hook embeds when only its ProcessHook
// does something: dial and pipeline hooks that pass through.
type passHooks struct{}

func (passHooks) DialHook(next redis.DialHook) redis.DialHook { return next }
func (passHooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// allowedOf makes calls Allow calls for key and returns how many were
// allowed.
func allowedOf(t *testing.T, lim Limiter, key string, calls int) int {
	t.Helper()
	allowed := 0
	for range calls {
		res, err := lim.Allow(t.Context(), key)
		require.NoError(t, err)
		allowed += btoi(res.Allowed)
	}
	return allowed
}

// withClock sets the clock a client-clock limiter reads.
func withClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}
