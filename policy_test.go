package redlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testlane"
)

func newPolicy(t testing.TB, rdb redis.UniversalClient, rules []Rule, opts ...Option) *Policy {
	t.Helper()
	p, err := NewPolicy(rdb, rules, opts...)
	require.NoError(t, err, "NewPolicy(%v)", rules)
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPolicyValidation(t *testing.T) {
	b, _ := miniBackend(t)
	tb := Rule{Strategy: TokenBucket, Limit: PerSecond(10)}
	many := make([]Rule, MaxRules+1)
	for i := range many {
		many[i] = Rule{Strategy: FixedWindow, Limit: Limit{Rate: 10, Period: time.Duration(i+1) * time.Second}}
	}
	tests := []struct {
		name  string
		rules []Rule
		opts  []Option
	}{
		{"no rules", nil, nil},
		{"too many rules", many, nil},
		{"same strategy and period", []Rule{tb, {Name: "other", Strategy: TokenBucket, Limit: PerSecond(20)}}, nil},
		{"same name", []Rule{{Name: "a", Strategy: TokenBucket, Limit: PerSecond(1)}, {Name: "a", Strategy: FixedWindow, Limit: PerMinute(5)}}, nil},
		{"invalid limit", []Rule{tb, {Strategy: FixedWindow, Limit: Limit{Rate: 0, Period: time.Second}}}, nil},
		{"unknown strategy", []Rule{{Strategy: Strategy(42), Limit: PerSecond(1)}}, nil},
		{"limit func on a policy", []Rule{tb}, []Option{WithLimitFunc(func(context.Context, string) (Limit, error) { return Limit{}, nil })}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(b.rdb, tt.rules, tt.opts...)
			want := ErrInvalidLimit
			if tt.opts != nil {
				want = ErrInvalidArgument // an option that does not apply to a policy
			}
			require.ErrorIs(t, err, want)
			assert.Regexp(t, "^redlimit: ", err.Error())
		})
	}
	// MaxRules rules are fine; default names are unique and readable.
	p := newPolicy(t, b.rdb, many[:MaxRules])
	assert.Equal(t, "fixed-window-1s", p.Rules()[0].Name)
	assert.Equal(t, "fixed-window-16s", p.Rules()[MaxRules-1].Name)
	p2 := newPolicy(t, b.rdb, []Rule{tb, {Strategy: SlidingLog, Limit: Limit{Rate: 5, Period: 250 * time.Millisecond}}})
	assert.Equal(t, []Rule{
		{Name: "token-bucket-1s", Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Second, Burst: 10}},
		{Name: "sliding-log-250ms", Strategy: SlidingLog, Limit: Limit{Rate: 5, Period: 250 * time.Millisecond, Burst: 5}},
	}, p2.Rules())
	// n above the smallest capacity can never be allowed.
	_, err := p2.AllowN(t.Context(), "k", 6)
	require.ErrorIs(t, err, ErrExceedsLimit)
	_, err = p2.AllowN(t.Context(), "k", -1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = p2.AllowN(t.Context(), "", 1)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// The Result of a policy: Remaining the least, RetryAfter the longest among
// the denying rules, ResetAfter the longest, Rule, Limit and RuleResetAfter
// the deciding rule's; RetryAfter exact to the µs.
func TestPolicyResult(t *testing.T) {
	b, _ := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "second", Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Second, Burst: 5}},
		{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(8)},
	})
	ctx := t.Context()
	res, err := p.AllowN(ctx, "k", 4)
	require.NoError(t, err)
	// Allowed: the rule with the fewest remaining decides (1 token < 4 in the window).
	assert.Equal(t, Result{Allowed: true, Limit: Limit{Rate: 10, Period: time.Second, Burst: 5}, Remaining: 1,
		ResetAfter: time.Minute, Rule: "second", RuleResetAfter: 400 * time.Millisecond}, res)
	res, err = p.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	// Denied by the bucket only (the window has 4 left): retry when 2 more tokens are there.
	assert.Equal(t, Result{Limit: Limit{Rate: 10, Period: time.Second, Burst: 5}, Remaining: 1,
		RetryAfter: 200 * time.Millisecond, ResetAfter: time.Minute, Rule: "second", RuleResetAfter: 400 * time.Millisecond}, res)
	b.advance(200*time.Millisecond - time.Microsecond)
	res, err = p.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	assert.False(t, res.Allowed, "1µs before RetryAfter: %+v", res)
	b.advance(time.Microsecond)
	res, err = p.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	assert.True(t, res.Allowed, "at RetryAfter: %+v", res)
	// Now the window has 1 left and the bucket is empty: both deny 2; the
	// window's retry (until the minute ends) is the longer one.
	res, err = p.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: PerMinute(8), Remaining: 0, RetryAfter: time.Minute - 200*time.Millisecond,
		ResetAfter: time.Minute - 200*time.Millisecond, Rule: "minute", RuleResetAfter: time.Minute - 200*time.Millisecond}, fill(res))
}

// fill puts Burst into a result's fixed-window limit, as the engine does.
func fill(r Result) Result {
	if r.Limit.Burst == r.Limit.Rate {
		r.Limit.Burst = 0
	}
	return r
}

// 10 per second AND 100 per minute admits exactly what the tighter of the
// two allows at each moment: each call is compared with two single-strategy
// limiters asked first with n = 0 (which consumes nothing).
func TestPolicyTighterOfTwo(t *testing.T) {
	testlane.MarkHeavy(t)
	t.Parallel() // its own miniredis and clock: the heavy lane runs its tests on both cores
	b, _ := miniBackend(t)
	rules := []Rule{
		{Strategy: TokenBucket, Limit: PerSecond(10)},
		{Strategy: SlidingCounter, Limit: PerMinute(100)},
	}
	p := newPolicy(t, b.rdb, rules)
	tb := newLimiter(t, b.rdb, TokenBucket, PerSecond(10), WithPrefix("ref"))
	sc := newLimiter(t, b.rdb, SlidingCounter, PerMinute(100), WithPrefix("ref"))
	ctx := t.Context()
	admitted := 0
	for i := range 3000 { // 150 s, a call every 50ms: twice the bucket's rate
		b.advance(50 * time.Millisecond)
		a, err := tb.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		c, err := sc.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		want := a.Remaining >= 1 && c.Remaining >= 1
		res, err := p.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, want, res.Allowed, "call %d at %v: policy %+v, bucket %+v, counter %+v", i, time.Duration(i+1)*50*time.Millisecond, res, a, c)
		require.Equal(t, min(a.Remaining, c.Remaining)-btoi(want), res.Remaining, "call %d: remaining", i)
		if want {
			admitted++
			_, err = tb.Allow(ctx, "k")
			require.NoError(t, err)
			_, err = sc.Allow(ctx, "k")
			require.NoError(t, err)
		}
	}
	// 150 s at 100 per minute, the tighter in the long run.
	assert.InDelta(t, 250, admitted, 10, "admitted in 150 s")
}

// A rule and a single-strategy limiter of the same strategy and period
// share state.
func TestPolicySharesStateWithLimiter(t *testing.T) {
	b, _ := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "fw", Strategy: FixedWindow, Limit: PerMinute(5)},
		{Name: "tb", Strategy: TokenBucket, Limit: PerSecond(100)},
	})
	single := newLimiter(t, b.rdb, FixedWindow, PerMinute(5))
	ctx := t.Context()
	_, err := single.AllowN(ctx, "k", 4)
	require.NoError(t, err)
	res, err := p.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, "fw", res.Rule)
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed)
	res, err = single.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Remaining)
	require.NoError(t, p.Reset(ctx, "k"))
	res, err = single.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 5, res.Remaining, "Reset of the policy forgets the shared state")
}

// Options work on a policy: block, shadow, deny cache, observer; the
// leaky-bucket rule's delay is the result's.
func TestPolicyOptions(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	rules := []Rule{
		{Name: "pace", Strategy: LeakyBucket, Limit: Limit{Rate: 10, Period: time.Second, Burst: 3}},
		{Name: "hour", Strategy: SlidingLog, Limit: PerHour(4)},
	}
	var seen []Decision
	var mu sync.Mutex
	p := newPolicy(t, b.rdb, rules, WithBlock(time.Minute), WithObserver(func(d Decision) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	}))
	for i, delay := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond} {
		res, err := p.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed, "call %d", i)
		assert.Equal(t, delay, res.Delay, "call %d", i)
	}
	res, err := p.Allow(ctx, "k") // the queue is full
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, "pace", res.Rule)
	// The block: everything denied for a minute, RetryAfter the block's.
	b.advance(time.Second)
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, time.Minute-time.Second, res.RetryAfter)
	mu.Lock()
	require.Len(t, seen, 5)
	assert.Equal(t, DeniedByLimit, seen[3].DeniedBy)
	assert.Equal(t, "pace", seen[3].Rule)
	assert.Equal(t, LeakyBucket, seen[3].Strategy)
	assert.Equal(t, DeniedByBlock, seen[4].DeniedBy)
	mu.Unlock()
	require.NoError(t, p.Reset(ctx, "k"))
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "Reset lifts the block: %+v", res)

	shadow := newPolicy(t, b.rdb, []Rule{{Strategy: FixedWindow, Limit: PerHour(1)}, {Strategy: TokenBucket, Limit: PerSecond(5)}},
		WithShadow(), WithPrefix("shadow"))
	for i := range 3 {
		res, err := shadow.Allow(ctx, "k")
		require.NoError(t, err)
		assert.True(t, res.Allowed)
		assert.Equal(t, i > 0, res.Shadowed, "call %d", i)
	}

	var by []DeniedBy
	cached := newPolicy(t, b.rdb, []Rule{{Strategy: FixedWindow, Limit: PerHour(1)}, {Strategy: TokenBucket, Limit: PerSecond(5)}},
		WithDenyCache(100), WithPrefix("cache"), WithObserver(func(d Decision) { by = append(by, d.DeniedBy) }))
	for range 3 {
		_, err := cached.Allow(ctx, "k")
		require.NoError(t, err)
	}
	assert.Equal(t, []DeniedBy{NotDenied, DeniedByLimit, DeniedByDenyCache}, by)
}

// A denied call leaves every Redis key of the policy byte for byte as it
// was (DUMP and expiry), under 64 goroutines; and the tight rule admits
// exactly its quota while the loose one is charged exactly that.
func testPolicyAllOrNothing(t *testing.T, b *backend) {
	ctx := context.Background()
	if !b.exact {
		// On a real clock, start clear of an hour's edge: the tight rule's
		// window is the hour, and a new one mid-test admits again (it
		// failed once so, at 14:00).
		clearOfHourEdge(t, 10*time.Second)
	}
	rules := []Rule{
		// One token an hour: on a real clock no refill moves its count
		// during the test (at 1000 an hour one did every 3.6 s).
		{Name: "loose", Strategy: TokenBucket, Limit: Limit{Rate: 1, Period: time.Hour, Burst: 1000}},
		{Name: "tight", Strategy: FixedWindow, Limit: PerHour(50)},
		{Name: "log", Strategy: SlidingLog, Limit: PerHour(500)},
		{Name: "counter", Strategy: SlidingCounter, Limit: PerHour(500)},
	}
	p := newPolicy(t, b.rdb, rules, WithPrefix(prefixFor(t)))
	keys := func(key string) []string {
		out := make([]string, len(p.own.rules))
		first := p.stateKey(key, &p.own.rules[0])
		for i := range out {
			out[i] = ruleKey(first, p.own, i)
		}
		return out
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 20 {
				res, err := p.Allow(ctx, "k")
				if !assert.NoError(t, err) {
					return
				}
				assert.False(t, res.Degraded)
				if res.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(50), admitted.Load(), "the tight rule admits exactly its quota")
	res, err := p.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Remaining)
	// Every rule was charged exactly the 50 admitted events.
	for _, c := range []struct {
		s     Strategy
		limit Limit
		left  int
	}{{TokenBucket, rules[0].Limit, 950}, {SlidingLog, rules[2].Limit, 450}, {SlidingCounter, rules[3].Limit, 450}} {
		l := newLimiter(t, b.rdb, c.s, c.limit, WithPrefix(prefixFor(t)))
		res, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, c.left, res.Remaining, "%v after 50 admitted of %d calls", c.s, 64*20)
	}
	// Denied calls, 64 goroutines: nothing changes.
	before := make([]string, 0, 4)
	for _, k := range keys("k") {
		before = append(before, dumpKey(t, b.rdb, k))
	}
	for range 64 {
		wg.Go(func() {
			for range 10 {
				res, err := p.Allow(ctx, "k")
				if assert.NoError(t, err) {
					assert.False(t, res.Allowed)
				}
			}
		})
	}
	wg.Wait()
	for i, k := range keys("k") {
		assert.Equal(t, before[i], dumpKey(t, b.rdb, k), "rule %s: a denied call changed its key", rules[i].Name)
	}
}

// dumpKey returns a key's DUMP and its absolute expiry.
func dumpKey(t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	d, err := rdb.Dump(context.Background(), key).Result()
	if err != nil && redis.HasErrorPrefix(err, "WRONGTYPE") {
		return snapshot(t, rdb, key) // miniredis dumps strings only
	}
	require.NoError(t, err, "DUMP %s", key)
	return fmt.Sprintf("%x expires %d", d, expireTime(t, rdb, key))
}

func TestPolicyAllOrNothingMiniredis(t *testing.T) {
	b, _ := miniBackend(t)
	testPolicyAllOrNothing(t, b)
}

func TestPolicyAllOrNothingRedis(t *testing.T) {
	testPolicyAllOrNothing(t, realBackend(t))
}

func TestPolicyAllOrNothingCluster(t *testing.T) {
	rdb := clusterClient(t, realCluster(t), time.Second)
	testPolicyAllOrNothing(t, &backend{name: "cluster", rdb: rdb, advance: time.Sleep})
}

// The fallback is all or nothing too: a denial by one stand-in takes
// nothing from the others.
func TestPolicyFallbackAllOrNothing(t *testing.T) {
	b, m := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "bucket", Strategy: TokenBucket, Limit: Limit{Rate: 1, Period: time.Hour, Burst: 5}},
		{Name: "window", Strategy: FixedWindow, Limit: PerHour(3)},
	}, WithPingInterval(time.Hour))
	m.Close()
	ctx := t.Context()
	for i := range 10 {
		res, err := p.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Degraded)
		assert.Equal(t, i < 3, res.Allowed, "call %d: %+v", i, res)
		if !res.Allowed {
			assert.Equal(t, "window", res.Rule)
		}
	}
	set := p.rescue.locals.GetOrAdd(p.stateKey("k", &p.own.rules[0]), func() *localSet { t.Fatal("no stand-in"); return nil })
	set.mu.Lock()
	defer set.mu.Unlock()
	assert.InDelta(t, 2, set.lims[0].lim.TokensAt(time.Now()), 0.01, "the bucket's stand-in gave only what the policy admitted")
}

// A per-call rule counts each call as one event whatever its n: requests
// per second beside tokens per minute, in one policy, reserved and settled.
func TestPolicyPerCallRule(t *testing.T) {
	b, m := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "rps", Strategy: TokenBucket, Limit: PerSecond(3), PerCall: true},
		{Name: "tpm", Strategy: FixedWindow, Limit: PerMinute(10_000)},
	}, WithPingInterval(time.Hour))
	assert.True(t, p.Rules()[0].PerCall)
	ctx := t.Context()
	rps := newLimiter(t, b.rdb, TokenBucket, PerSecond(3))
	tpm := newLimiter(t, b.rdb, FixedWindow, PerMinute(10_000))
	res, err := p.AllowN(ctx, "k", 4000) // far above the rps rule's 3
	require.NoError(t, err)
	require.True(t, res.Allowed)
	assert.Equal(t, 6000, res.Remaining, "Remaining counts tokens; the per-call rule has calls left")
	assert.Equal(t, "tpm", res.Rule)
	assert.Equal(t, 2, remaining(t, rps, "k"), "one call")
	assert.Equal(t, 6000, remaining(t, tpm, "k"), "4000 tokens")
	rv, err := p.Reserve(ctx, "k", 3000)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	_, err = rv.Settle(ctx, 1000)
	require.NoError(t, err)
	assert.Equal(t, 1, remaining(t, rps, "k"), "a settled call keeps its one event")
	assert.Equal(t, 5000, remaining(t, tpm, "k"))
	rv, err = p.Reserve(ctx, "k", 500)
	require.NoError(t, err)
	require.NoError(t, rv.Cancel(ctx))
	assert.Equal(t, 1, remaining(t, rps, "k"), "a cancelled call gives its event back")
	assert.Equal(t, 5000, remaining(t, tpm, "k"))
	res, err = p.AllowN(ctx, "k", 100)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = p.AllowN(ctx, "k", 100) // the fourth call this second
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, "rps", res.Rule)
	assert.Equal(t, 4900, remaining(t, tpm, "k"), "the denial took no tokens")
	_, err = p.AllowN(ctx, "k", 10_001)
	require.ErrorIs(t, err, ErrExceedsLimit, "n is bounded by the counting rules only")

	// The fallback counts the same way.
	m.Close()
	b.advance(time.Second)
	fb := newPolicy(t, b.rdb, p.Rules(), WithPingInterval(time.Hour), WithPrefix("fb"))
	for i, want := range []bool{true, true, true, false} {
		res, err := fb.AllowN(ctx, "k", 2000)
		require.NoError(t, err)
		require.True(t, res.Degraded)
		assert.Equal(t, want, res.Allowed, "fallback call %d", i)
	}
}

// The penalty block is the rule set's, whatever the rules' order: a policy
// built from a map (WithRulesFunc) lists the same rules in any order, and
// each order must see the block that another set. A single-rule limiter
// keeps its block key, the state key's.
func TestPolicyBlockFollowsRuleSet(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	sec := Rule{Name: "sec", Strategy: TokenBucket, Limit: PerSecond(5)}
	hour := Rule{Name: "hour", Strategy: FixedWindow, Limit: PerHour(1000)}
	secHour := newPolicy(t, b.rdb, []Rule{sec, hour}, WithBlock(10*time.Second))
	hourSec := newPolicy(t, b.rdb, []Rule{hour, sec}, WithBlock(10*time.Second))
	res, err := secHour.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = secHour.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed, "over sec: blocked for 10s")

	b.advance(2 * time.Second) // sec is full again; the block has 8s left
	for _, p := range []*Policy{hourSec, secHour} {
		res, err = p.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		assert.False(t, res.Allowed, "%v: 5 admitted during the block", p.Rules())
		assert.Equal(t, 8*time.Second, res.RetryAfter, "%v", p.Rules())
	}
	require.NoError(t, hourSec.Reset(ctx, "k"))
	res, err = secHour.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	assert.True(t, res.Allowed, "a Reset in either order lifts the block")

	// The block key: in the key's slot, the same for both orders, and a
	// single-rule limiter's is its state key's.
	a, z := secHour.blockKey("k", secHour.own), hourSec.blockKey("k", hourSec.own)
	assert.Equal(t, a, z)
	assert.Contains(t, a, ":{k}:")
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(1000), WithBlock(time.Second))
	assert.Equal(t, lim.stateKey("k")+blockSuffix, lim.blockKey("k", lim.own))
}

// A policy's leaky buckets each take their slot at the policy's Delay: one
// call per 100 ms beside 10 per 10 ms, after 500 events in the fast queue,
// lets calls out 100 ms apart (the slow rule's spacing), not 1 ms apart
// behind the fast queue (500, 501, 502 ms). Both ways the rules come: as
// arguments and written in.
func TestPolicyLeakySlots(t *testing.T) {
	rules := []Rule{
		{Name: "slow", Strategy: LeakyBucket, Limit: Limit{Rate: 1, Period: 100 * time.Millisecond, Burst: 10}, PerCall: true},
		{Name: "fast", Strategy: LeakyBucket, Limit: Limit{Rate: 10, Period: 10 * time.Millisecond, Burst: 1000}},
	}
	for _, baked := range []bool{false, true} {
		t.Run(fmt.Sprintf("baked=%v", baked), func(t *testing.T) {
			b, _ := miniBackend(t)
			var opts []Option
			if !baked {
				// A limit function makes the rules come as arguments.
				opts = append(opts, WithRulesFunc(func(context.Context, string) ([]Rule, error) { return rules, nil }))
			}
			p := newPolicy(t, b.rdb, rules, opts...)
			ctx := t.Context()
			var delays []time.Duration
			for _, n := range []int{500, 1, 1, 1} {
				res, err := p.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.True(t, res.Allowed)
				delays = append(delays, res.Delay)
			}
			assert.Equal(t, []time.Duration{0, 500 * time.Millisecond, 600 * time.Millisecond, 700 * time.Millisecond}, delays)
			// The slow queue holds 1 s (Burst 10 at 100 ms): two slots
			// more, at 800 and 900 ms (those it skipped are gone).
			for i, want := range []time.Duration{800 * time.Millisecond, 900 * time.Millisecond} {
				res, err := p.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed, "call %d", 5+i)
				assert.Equal(t, want, res.Delay, "call %d", 5+i)
			}
			res, err := p.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "the slow queue is full")
			assert.Equal(t, "slow", res.Rule)
			assert.Equal(t, 100*time.Millisecond, res.RetryAfter, "its next slot")
		})
	}
}

// A leaky rule whose queue cannot hold the wait another rule makes denies
// the call, told to retry when it can.
func TestPolicyLeakySlotsQueueFull(t *testing.T) {
	b, _ := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "slow", Strategy: LeakyBucket, Limit: Limit{Rate: 1, Period: 100 * time.Millisecond, Burst: 3}, PerCall: true},
		{Name: "fast", Strategy: LeakyBucket, Limit: Limit{Rate: 10, Period: 10 * time.Millisecond, Burst: 1000}},
	})
	ctx := t.Context()
	res, err := p.AllowN(ctx, "k", 500)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = p.Allow(ctx, "k") // 500 ms out: the slow queue holds 300 ms
	require.NoError(t, err)
	require.False(t, res.Allowed)
	assert.Equal(t, "slow", res.Rule)
	assert.Equal(t, 300*time.Millisecond, res.RetryAfter)
	b.advance(res.RetryAfter)
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed, "after its RetryAfter")
	assert.Equal(t, 200*time.Millisecond, res.Delay)
}
