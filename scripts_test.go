package redlimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testlane"
)

// randomRules returns count rules of distinct strategy and period (from
// periods), with limits from the smallest to MaxRate, some of them per
// call; with count of 5 or more, every strategy at least once.
func randomRules(rng *rand.Rand, periods []time.Duration, count int) []Rule {
	seen := map[[2]int64]bool{}
	var rules []Rule
	for len(rules) < count {
		s := Strategies()[rng.IntN(len(Strategies()))]
		if count >= len(Strategies()) && len(rules) < len(Strategies()) {
			s = Strategies()[len(rules)] // every strategy's file in the script
		}
		p := periods[rng.IntN(len(periods))]
		if seen[[2]int64{int64(s), int64(p)}] {
			continue
		}
		seen[[2]int64{int64(s), int64(p)}] = true
		maxRate := MaxRate
		if s == SlidingLog {
			maxRate = 200
		}
		rate := 1 + rng.IntN(10)
		if rng.IntN(3) == 0 {
			rate = 1 + rng.IntN(maxRate)
		}
		l := Limit{Rate: rate, Period: p}
		if s == SubWindowCounter && rng.IntN(2) == 0 {
			l.SubWindows = 1 + rng.IntN(min(MaxSubWindows, int(p/time.Millisecond)))
		}
		if s == TokenBucket || s == LeakyBucket {
			l.Burst = 1 + rng.IntN(min(2*rate, MaxRate))
			if float64(l.Burst)*float64(p)/float64(rate) > float64(MaxPeriod) {
				l.Burst = rate
			}
		}
		rules = append(rules, Rule{Strategy: s, Limit: l, PerCall: len(rules) > 0 && rng.IntN(4) == 0})
	}
	return rules
}

// A limiter with fixed rules runs a script with its rules written in; the
// same rules passed as arguments (what limits from WithLimitFunc do) must
// decide every call alike: every field of every Result, for random
// policies (every strategy, per-call rules, rates up to MaxRate), n from 0
// to the capacity, reservations settled, and the clock moving.
//
// On miniredis, whose clock the test sets, the clock moves by 1 µs to an
// hour. On real Redis (Lua 5.1 reading the numbers written into the
// script) both limiters read one simulated client clock (WithClientClock,
// and TIME answered from that clock, so the offset is 0 for both, as in
// TestEngineParity), and it moves by at most 100 ms a step and 20 s in all
// over periods of a minute and more: Redis expires keys on its own clock,
// and no key here can expire during the test.
func TestBakedScriptDecidesAsArguments(t *testing.T) {
	testlane.MarkHeavy(t)
	t.Parallel() // its own miniredis and clock: the heavy lane runs its tests on both cores
	b, _ := miniBackend(t)
	periods := []time.Duration{time.Millisecond, 250 * time.Millisecond, time.Second, time.Minute, time.Hour}
	compareBakedAndArgs(t, b.rdb, periods, b.advance, time.Hour, 40, 0)
}

func TestBakedScriptDecidesAsArgumentsRedis(t *testing.T) {
	rdb, advance, opts := simulatedRedis(t)
	periods := []time.Duration{time.Minute, 5 * time.Minute, time.Hour}
	compareBakedAndArgs(t, rdb, periods, advance, 100*time.Millisecond, 8, 0, opts...)
}

// simulatedRedis returns a client of a real Redis whose time, for the
// limiters made with opts, is a simulated clock that advance moves: the
// client clock, and TIME answered from it (see timeHook).
func simulatedRedis(t *testing.T) (redis.UniversalClient, func(time.Duration), []Option) {
	clock := &simClock{}
	clock.us.Store(t0.UnixMicro())
	rdb := redis.NewClient(steadyOptions(realServer(t).Addr))
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(timeHook{clock: clock})
	advance := func(d time.Duration) { clock.us.Add(d.Microseconds()) }
	return rdb, advance, []Option{WithClientClock(), withClock(clock.now)}
}

// A policy of MaxRules rules, its checks nested in its script (see
// writtenChecks), decides as the same rules passed as arguments: within
// the limits of Lua 5.1 on real Redis (locals per function, nesting) and
// of miniredis's Lua.
func TestBakedScriptMaxRules(t *testing.T) {
	b, _ := miniBackend(t)
	periods := []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour}
	compareBakedAndArgs(t, b.rdb, periods, b.advance, time.Hour, 3, MaxRules)
}

func TestBakedScriptMaxRulesRedis(t *testing.T) {
	rdb, advance, opts := simulatedRedis(t)
	periods := []time.Duration{time.Minute, 5 * time.Minute, 10 * time.Minute, time.Hour}
	compareBakedAndArgs(t, rdb, periods, advance, 100*time.Millisecond, 2, MaxRules, opts...)
}

// timeHook answers TIME from a simulated clock.
type timeHook struct {
	passHooks
	clock *simClock
}

func (h timeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if tc, ok := cmd.(*redis.TimeCmd); ok {
			tc.SetVal(h.clock.now())
			return nil
		}
		return next(ctx, cmd)
	}
}

// compareBakedAndArgs plays rounds of random calls on two policies of the
// same random rules, one with the rules written into its script and one
// passing them as arguments, and requires the same results. A clock step
// is at most maxStep.
func compareBakedAndArgs(t *testing.T, rdb redis.UniversalClient, periods []time.Duration, advance func(time.Duration), maxStep time.Duration, rounds, count int, opts ...Option) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 14))
	var policies []*Policy // each round's two, closed once the rounds are over
	defer func() {
		for _, p := range slices.Backward(policies) {
			p.Close()
		}
	}()
	for round := range rounds {
		n := count
		if n == 0 {
			n = 1 + rng.IntN(4)
		}
		rules := randomRules(rng, periods, n)
		prefix := fmt.Sprintf("r%d", round)
		baked, err := NewPolicy(rdb, rules, append(opts, WithPrefix(prefix+"baked"))...)
		require.NoError(t, err, "%+v", rules)
		policies = append(policies, baked)
		args, err := NewPolicy(rdb, rules, append(opts, WithPrefix(prefix+"args"))...)
		require.NoError(t, err)
		policies = append(policies, args)
		require.NotNil(t, baked.own.script, "round %d: no script with the rules written in", round)
		args.own.script = nil // the rules as arguments, with the script for any strategy
		args.own.run = argsRunner{warm: args.own.warm}
		_, asArgs := baked.own.run.(argsRunner)
		require.False(t, asArgs, "round %d: the baked policy runs its rules as arguments", round)

		maxN := baked.own.maxN
		if baked.own.logs > 0 {
			maxN = min(maxN, MaxSlidingLogN/baked.own.logs)
		}
		for i := range 60 {
			switch rng.IntN(4) {
			case 0:
				advance(time.Duration(1+rng.IntN(1000)) * time.Microsecond)
			case 1:
				advance(time.Duration(1 + rng.Int64N(int64(maxStep))))
			}
			n := rng.IntN(maxN + 1)
			if rng.IntN(2) == 0 {
				n = min(n, 1+rng.IntN(3))
			}
			what := fmt.Sprintf("round %d call %d: %+v, n = %d", round, i, rules, n)
			if rng.IntN(5) == 0 {
				n = max(n, 1)
				used := rng.IntN(2*n + 1)
				rb, errB := baked.Reserve(ctx, "k", n)
				ra, errA := args.Reserve(ctx, "k", n)
				require.Equal(t, errA, errB, what)
				if errB != nil {
					continue
				}
				require.Equal(t, ra.Result(), rb.Result(), what)
				if !rb.Result().Allowed {
					continue
				}
				sb, errB := rb.Settle(ctx, used)
				sa, errA := ra.Settle(ctx, used)
				require.Equal(t, errA, errB, what)
				require.Equal(t, sa, sb, "%s, settled with %d", what, used)
				continue
			}
			rb, errB := baked.AllowN(ctx, "k", n)
			ra, errA := args.AllowN(ctx, "k", n)
			require.Equal(t, errA, errB, what)
			require.Equal(t, ra, rb, what)
			require.False(t, rb.Degraded, what)
		}
	}
}

// argCounter records the argument count of every EVALSHA.
type argCounter struct {
	passHooks
	counts []int
}

func (h *argCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.counts = append(h.counts, len(cmd.Args()))
		}
		return next(ctx, cmd)
	}
}

// A limiter's own rules travel in its script, not in every call; limits
// from WithLimitFunc travel as arguments.
func TestBakedScriptSendsNoRules(t *testing.T) {
	b, _ := miniBackend(t)
	h := &argCounter{}
	b.rdb.(*redis.Client).AddHook(h)
	ctx := context.Background()

	p, err := NewPolicy(b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: PerSecond(10)},
		{Strategy: FixedWindow, Limit: PerMinute(100)},
	})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	// evalsha sha numkeys, 2 keys, and none of the 7 arguments: n and the
	// others are their defaults, the number of rules the script's own
	assert.Equal(t, []int{3 + 2}, h.counts)
	h.counts = nil
	_, err = p.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	assert.Equal(t, []int{3 + 2 + 1}, h.counts, "n only")

	h.counts = nil
	tb := newLimiter(t, b.rdb, TokenBucket, PerSecond(10))
	_, err = tb.Allow(ctx, "k")
	require.NoError(t, err)
	_, err = tb.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	_, err = tb.Reserve(ctx, "k", 1)
	require.NoError(t, err)
	assert.Equal(t, []int{3 + 1, 3 + 1 + 1, 3 + 2 + 7}, h.counts,
		"one rule: no argument for Allow, n for AllowN(2), all for a reservation")

	h.counts = nil
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(10), WithLimitFunc(func(context.Context, string) (Limit, error) {
		return PerSecond(20), nil
	}))
	_, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []int{3 + 1 + 7 + 4}, h.counts, "a limit from WithLimitFunc: its 4 arguments")
}

// Past maxBakedScripts, limiters pass their rules as arguments and decide
// the same; limiters with the same rules share one script.
func TestBakedScriptsBounded(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := context.Background()
	a1 := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 79, Period: 7 * time.Second})
	a2 := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 79, Period: 7 * time.Second})
	require.NotNil(t, a1.own.script)
	assert.Same(t, a1.own.script, a2.own.script, "the same rules, one script")

	baked.Lock()
	saved := maxBakedScripts
	maxBakedScripts = len(baked.m)
	baked.Unlock()
	defer func() {
		baked.Lock()
		maxBakedScripts = saved
		baked.Unlock()
	}()
	over := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 73, Period: 7 * time.Second})
	assert.Nil(t, over.own.script, "past the bound")
	baked.Lock()
	assert.LessOrEqual(t, len(baked.m), maxBakedScripts)
	baked.Unlock()
	for i := range 74 {
		res, err := over.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, i < 73, res.Allowed, "call %d", i+1)
	}
}

// Only the strategies' codes and the limits' numbers are written into a
// script: a rule's name, which may come from configuration, never is.
func TestBakedScriptHoldsNoNames(t *testing.T) {
	b, _ := miniBackend(t)
	hostile := "x'\nend\nredis.call('FLUSHALL')\n--"
	p, err := NewPolicy(b.rdb, []Rule{
		{Name: hostile, Strategy: FixedWindow, Limit: PerSecond(2)},
		{Name: "]] ' \" \\", Strategy: SlidingCounter, Limit: PerMinute(100)},
	})
	require.NoError(t, err)
	defer p.Close()
	require.NotNil(t, p.own.script)
	part := writtenChecks(p.own)
	assert.NotContains(t, part, "FLUSHALL")
	assert.NotContains(t, part, "]]")
	require.NoError(t, b.rdb.Set(context.Background(), "other", "kept", 0).Err())
	for i := range 3 {
		res, err := p.Allow(context.Background(), "k")
		require.NoError(t, err)
		assert.Equal(t, i < 2, res.Allowed, "call %d", i+1)
		if !res.Allowed {
			assert.Equal(t, hostile, res.Rule, "the denying rule keeps its name")
		}
	}
	v, err := b.rdb.Get(context.Background(), "other").Result()
	require.NoError(t, err)
	assert.Equal(t, "kept", v)
}

// packed returns the reply v packed as scripts/reply.lua packs it where
// Redis has its struct library.
func packed(v [5]int64) string {
	b := make([]byte, 0, packedReply)
	b = append(b, byte(v[0]))
	for _, x := range v[1:4] {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return string(append(b, byte(v[4])))
}

// A reply packed in one string (real Redis) decodes as the same reply as an
// array (miniredis) does; a malformed reply is an error, not a panic.
func TestParsePackedReply(t *testing.T) {
	p, err := NewPolicy(newStubClient(), []Rule{
		{Name: "second", Strategy: TokenBucket, Limit: PerSecond(10)},
		{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(100)},
	})
	require.NoError(t, err)
	defer p.Close()
	for _, v := range [][5]int64{
		{0, 9, 0, 100_000, 1},
		{0, 1<<53 - 1, 12, 1<<53 - 1, 2},
		{1, 0, 250_000, 1_000_000, 2},
		{2, 0, 10_000_000, 10_000_000, 0}, // a block: no rule
		{3, 4, 30, 70, 1},
	} {
		array := []any{v[0], v[1], v[2], v[3], v[4]}
		if v[0] == int64(reasonBlock) {
			array = append(array, v[2]) // the block's time left (see noteBlock)
		}
		want, wantWhy, err := p.parse(array, p.own, nil, nil)
		require.NoError(t, err)
		got, why, err := p.parse(packed(v), p.own, nil, nil)
		require.NoError(t, err)
		assert.Equal(t, want, got, "%v", v)
		assert.Equal(t, wantWhy, why, "%v", v)
	}
	for name, reply := range map[string]any{
		"short":   packed([5]int64{0, 9, 0, 1, 1})[:packedReply-1],
		"long":    packed([5]int64{0, 9, 0, 1, 1}) + "x",
		"integer": int64(1),
		"nil":     nil,
	} {
		_, _, err := p.parse(reply, p.own, nil, nil)
		assert.Error(t, err, name)
	}
	// An admitted reservation needs its tags: never packed.
	_, _, err = p.parse(packed([5]int64{0, 9, 0, 1, 1}), p.own, &reserveCall{}, nil)
	assert.Error(t, err)
}

// replyKinds records the Go type of every script reply.
type replyKinds struct {
	passHooks
	kinds []string
}

func (h *replyKinds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && (cmd.Name() == "evalsha" || cmd.Name() == "eval" || cmd.Name() == "fcall") && err == nil {
			kind := fmt.Sprintf("%T", c.Val())
			if s, ok := c.Val().(string); ok {
				kind += fmt.Sprintf("(%d)", len(s))
			}
			h.kinds = append(h.kinds, kind)
		}
		return err
	}
}

// Redis replies to a decision with one packed string, except for an
// admitted reservation; miniredis, whose Lua has no struct library, with
// arrays. Both decide the same (TestEngineParity).
func TestPackedReplyRedis(t *testing.T) {
	ctx := context.Background()
	for name, rdb := range map[string]redis.UniversalClient{
		"redis":     redis.NewClient(steadyOptions(realServer(t).Addr)),
		"miniredis": func() redis.UniversalClient { b, _ := miniBackend(t); return b.rdb }(),
	} {
		h := &replyKinds{}
		rdb.(*redis.Client).AddHook(h)
		lim := newLimiter(t, rdb, TokenBucket, Limit{Rate: 2, Period: time.Minute}, WithBlock(time.Second))
		key := "packed:" + name
		_, err := lim.Allow(ctx, key)
		require.NoError(t, err)
		_, err = lim.Reserve(ctx, key, 1)
		require.NoError(t, err)
		res, err := lim.Allow(ctx, key) // denied: the bucket of 2 is used
		require.NoError(t, err)
		require.False(t, res.Allowed)
		res, err = lim.Allow(ctx, key) // denied by the block
		require.NoError(t, err)
		require.False(t, res.Allowed)
		if name == "redis" {
			assert.Equal(t, []string{"string(26)", "[]interface {}", "string(26)", "[]interface {}"}, h.kinds,
				"allowed, reservation, denied, blocked")
		} else {
			assert.Equal(t, []string{"[]interface {}", "[]interface {}", "[]interface {}", "[]interface {}"}, h.kinds)
		}
		rdb.Close()
	}
}

// floor_div and ceil_div (common.lua) divide exactly wherever the
// floating-point quotient rounds, on miniredis's Lua and on Redis's.
func TestScriptDivisionExactRedis(t *testing.T) {
	script := redis.NewScript(readScripts("common.lua") + `
local out = {}
for i = 1, #KEYS, 2 do
  local a, b = tonumber(KEYS[i]), tonumber(KEYS[i + 1])
  out[#out + 1] = floor_div(a, b)
  out[#out + 1] = ceil_div(a, b)
end
return out`)
	rng := rand.New(rand.NewPCG(3, 4))
	var pairs [][2]int64
	for _, b := range []int64{1, 3, 7, 1000, 999_983, 1 << 26, 1_000_000_007} {
		for _, q := range []int64{0, 1, 5, 1 << 20, (1 << 53) / b / 2, (1<<53)/b - 1} {
			for _, d := range []int64{-1, 0, 1} {
				a := q*b + d
				pairs = append(pairs, [2]int64{a, b}, [2]int64{-a, b})
			}
		}
	}
	for range 500 {
		b := 1 + rng.Int64N(1<<30)
		a := rng.Int64N(1<<53) - 1<<52
		pairs = append(pairs, [2]int64{a, b})
	}
	keys := make([]string, 0, 2*len(pairs))
	for _, p := range pairs {
		keys = append(keys, strconv.FormatInt(p[0], 10), strconv.FormatInt(p[1], 10))
	}
	mini, _ := miniBackend(t)
	onRedis := redis.NewClient(steadyOptions(realServer(t).Addr))
	defer onRedis.Close()
	for name, rdb := range map[string]redis.UniversalClient{"miniredis": mini.rdb, "redis": onRedis} {
		got, err := script.Run(context.Background(), rdb, keys).Int64Slice()
		require.NoError(t, err, name)
		require.Len(t, got, 2*len(pairs), name)
		for i, p := range pairs {
			a, b := p[0], p[1]
			floor := a / b
			if a%b != 0 && a < 0 {
				floor--
			}
			ceil := floor
			if a%b != 0 {
				ceil++
			}
			assert.Equal(t, floor, got[2*i], "%s: floor_div(%d, %d)", name, a, b)
			assert.Equal(t, ceil, got[2*i+1], "%s: ceil_div(%d, %d)", name, a, b)
		}
	}
}

// The script specialised for a single rule (singleSource) decides every
// call its runner gives it (no block or reservation; a priority share
// for a bucket's, and a limiter with shares called at each priority: n
// from 0 to the capacity, a max delay or none, the server's TIME or a
// client's time, behind the state's or ahead) as the general script does, reply
// for reply, and leaves the same state with the same TTL: on random
// limits (rates up to MaxRate, periods from a ms to 2 h, whose state is
// text), with the clock moving forward and back, reservations taken and
// settled on the same key (the general script's, which leave a state
// with gaps, "<D>:<t>:<Y>:<W>") and a higher limit sharing the state (a
// state the rule must keep alive longer). The limiters themselves, one
// on specialisedRunner and one on the general script, return the same
// Results.
func TestSingleScriptDecidesAsGeneral(t *testing.T) {
	testlane.MarkHeavy(t)
	algs := []*algorithm{warmTokenBucket, warmLeakyBucket}
	for _, s := range Strategies() {
		algs = append(algs, algorithms[s])
	}
	for _, a := range algs {
		s := a.strategy
		src := singleSource(&ruleSet{rules: []rule{{alg: a, args: [4]any{a.code + "1", int64(1), int64(1000), int64(1)}}}}, -1)
		if src == "" {
			continue // no specialised script: the general one decides
		}
		name, seed := s.String(), uint64(s)
		if a.warm {
			name, seed = name+" warm-up", seed+100
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, m := miniBackend(t)
			rng := rand.New(rand.NewPCG(40, seed))
			for round := range 16 {
				c := newSingleCompare(t, b, m, rng, a, round)
				for range 150 {
					c.step()
				}
			}
		})
	}
}

// A call with a priority share on a single bucket whose compact state
// rounds its debt up (TestPolicyScriptRoundedDebt) replies, as its sixth
// integer, the bucket's whole remaining as stored, as the general script
// does.
func TestSingleScriptRoundedDebtShare(t *testing.T) {
	b, m := miniBackend(t)
	ctx := t.Context()
	l := Limit{Rate: 1000, Period: 1234567 * time.Microsecond, Burst: 2000}
	one := newLimiter(t, b.rdb, TokenBucket, l, withoutFunctions(), WithPriorityShares(0.5, 1), WithPrefix("one"))
	gen := newLimiter(t, b.rdb, TokenBucket, l, withoutFunctions(), WithPriorityShares(0.5, 1), WithPrefix("gen"))
	single := one.own.run.(specialisedRunner).one.(writtenRunner).script
	ppm := sharePPM(0.5)
	for range 2 { // 662 × 1,234,567 has 12 digits: stored rounded up
		ro, err := single.Run(ctx, b.rdb, []string{one.stateKey("k")}, singleShareArgs(662, shareCapacity(2000, ppm), 0, -1)...).Result()
		require.NoError(t, err)
		rg, err := gen.own.script.Run(ctx, b.rdb, []string{gen.stateKey("k")}, 662, 1, 0, -1, 0, "", 0, ppm).Result()
		require.NoError(t, err)
		require.Equal(t, rg, ro)
		requireSameState(t, m, "one", "gen", "after AllowN(662)")
	}
}

// singleCompare plays one round of TestSingleScriptDecidesAsGeneral: the
// same calls on two keys, one decided by the specialised script and one
// by the general script.
type singleCompare struct {
	t              *testing.T
	b              *backend
	m              *miniredis.Miniredis
	rng            *rand.Rand
	what           string
	one, gen       *RateLimiter // specialisedRunner, and the general script
	higherOne      *RateLimiter // a higher limit on one's keys, and on gen's:
	higherGen      *RateLimiter // both on the general script
	single         *redis.Script
	keyOne, keyGen string
	pending        [][2]*Reservation
	now            time.Duration // the server's clock, from t0
	subWindows     int64         // of one's limit (1 for a strategy without)
	shares         []int64       // one's and gen's priority shares (ppm), or none
}

// nextStart returns the first µs after now at which one of the s
// sub-windows of a period of periodUS µs starts, on the grid of
// subwindow.lua (sub-window j of a period starts ceil(j * period / s)
// into it, periods aligned to the Unix epoch); with s = 1, a window.
func nextStart(now, periodUS, s int64) int64 {
	q, r := now/periodUS, now%periodUS
	j := r*s/periodUS + 1
	return q*periodUS + (j*periodUS+s-1)/s
}

func newSingleCompare(t *testing.T, b *backend, m *miniredis.Miniredis, rng *rand.Rand, a *algorithm, round int) *singleCompare {
	c := &singleCompare{t: t, b: b, m: m, rng: rng}
	s := a.strategy
	var l Limit
	for {
		l = randomLimit(rng, s)
		if rng.IntN(6) == 0 {
			l.Period = 2 * time.Hour // a bucket's state as text
		}
		if a.warm {
			l = randomWarmUp(rng, l)
		}
		if _, err := newRule("", algorithms[s], l); err == nil {
			break
		}
	}
	// (With a warm-up, the higher limit shares the state: a state another
	// rate wrote, converted; at times with a longer warm-up, whose stored
	// permits may be more than the rule's most.)
	higher := Limit{Rate: min(3*l.Rate, MaxRate), Period: l.Period, Burst: min(3*max(l.Burst, l.Rate), MaxRate), WarmUp: l.WarmUp}
	if a.warm && rng.IntN(2) == 0 {
		higher.WarmUp = min(2*l.WarmUp, MaxPeriod)
	}
	if _, err := newRule("", algorithms[s], higher); err != nil {
		higher = l
	}
	c.what = fmt.Sprintf("%v round %d, %v (higher %v)", s, round, l, higher)
	sw, err := subWindows(algorithms[s], l)
	require.NoError(t, err)
	c.subWindows = int64(max(sw, 1))
	one, gen := fmt.Sprintf("r%done", round), fmt.Sprintf("r%dgen", round)
	opts := []Option{withoutFunctions()}
	if round%2 == 1 {
		// The single script takes a priority share too.
		sheddable, normal := 0.1+0.4*rng.Float64(), 0.5+0.5*rng.Float64()
		opts = append(opts, WithPriorityShares(sheddable, normal))
		c.shares = []int64{sharePPM(sheddable), sharePPM(normal), 1 + rng.Int64N(999_999)}
		c.what += fmt.Sprintf(", shares %v", c.shares[:2])
	}
	c.one = newLimiter(t, b.rdb, s, l, append(opts, WithPrefix(one))...)
	c.gen = newLimiter(t, b.rdb, s, l, append(opts, WithPrefix(gen))...)
	c.higherOne = newLimiter(t, b.rdb, s, higher, WithPrefix(one), withoutFunctions())
	c.higherGen = newLimiter(t, b.rdb, s, higher, WithPrefix(gen), withoutFunctions())
	sr, ok := c.one.own.run.(specialisedRunner)
	require.True(t, ok, "%s: runner %T", c.what, c.one.own.run)
	c.single = sr.one.(writtenRunner).script
	if len(c.shares) > 0 {
		// Each share's calls run their own script, the share written in.
		for _, ppm := range c.shares[:2] {
			_, ok := sr.shares[ppm]
			require.Equal(t, ppm != 0, ok, "%s: the script of share %d", c.what, ppm)
		}
		if l.WarmUp > 0 { // a warming bucket takes no share: one script for all
			hashes := map[string]bool{}
			for _, run := range sr.shares {
				if w, ok := run.(sharedRunner).one.(writtenRunner); ok {
					hashes[w.script.Hash()] = true
				}
			}
			assert.LessOrEqual(t, len(hashes), 1, "%s: a warming bucket's scripts of its shares", c.what)
		}
	}
	for _, lim := range []*RateLimiter{c.gen, c.higherOne, c.higherGen} {
		lim.own.run = writtenRunner{script: lim.own.script}
	}
	c.keyOne, c.keyGen = c.one.stateKey("k"), c.gen.stateKey("k")
	return c
}

// step moves the clock or makes one call on both sides, and compares.
func (c *singleCompare) step() {
	ctx := context.Background()
	switch op := c.rng.IntN(12); {
	case op < 3:
		c.moveClock()
	case op < 7:
		c.script()
	case op < 8:
		n := c.pickN(c.one)
		p := Priority(1 + c.rng.IntN(int(Critical)))
		allowBoth(ContextWithPriority(ctx, p), c.t, c.one, c.gen, n, fmt.Sprintf("%s: AllowN(%d) at %v", c.what, n, p))
	case op < 9:
		n := c.pickN(c.higherOne)
		allowBoth(ctx, c.t, c.higherOne, c.higherGen, n, fmt.Sprintf("%s: the higher limit's AllowN(%d)", c.what, n))
	case op < 10:
		c.reserve()
	default:
		c.settle()
	}
	c.compareState()
}

// reserve reserves the same n on both sides, and compares (reserveBoth).
func (c *singleCompare) reserve() {
	reserveBoth(c.t, c.what, c.one, c.gen, max(c.pickN(c.one), 1), &c.pending)
}

// settle settles a pending pair of reservations (settleBoth).
func (c *singleCompare) settle() {
	settleBoth(c.t, c.what, c.rng, &c.pending)
}

// allowBoth asks one and gen for n on key "k" and requires the same
// Results and errors.
func allowBoth(ctx context.Context, t *testing.T, one, gen Limiter, n int, what string) {
	t.Helper()
	ro, errO := one.AllowN(ctx, "k", n)
	rg, errG := gen.AllowN(ctx, "k", n)
	require.Equal(t, errG, errO, what)
	require.Equal(t, rg, ro, what)
}

// reserveBoth reserves n on key "k" of one and of gen, requires the same
// results, and adds the pair to pending when granted.
func reserveBoth(t *testing.T, what string, one, gen reserver, n int, pending *[][2]*Reservation) {
	t.Helper()
	ro, errO := one.Reserve(context.Background(), "k", n)
	rg, errG := gen.Reserve(context.Background(), "k", n)
	require.Equal(t, errG, errO, what)
	if errO == nil {
		require.Equal(t, rg.Result(), ro.Result(), "%s: Reserve(%d)", what, n)
		*pending = append(*pending, [2]*Reservation{ro, rg})
	}
}

// settleBoth settles one pending pair of reservations, at random, with
// the same use, if there is one, and requires the same results.
func settleBoth(t *testing.T, what string, rng *rand.Rand, pending *[][2]*Reservation) {
	t.Helper()
	if len(*pending) == 0 {
		return
	}
	i := rng.IntN(len(*pending))
	p := (*pending)[i]
	*pending = slices.Delete(*pending, i, i+1)
	used := rng.IntN(2*p[0].n + 1)
	so, errO := p[0].Settle(context.Background(), used)
	sg, errG := p[1].Settle(context.Background(), used)
	require.Equal(t, errG, errO, what)
	require.Equal(t, sg, so, "%s: Settle(%d)", what, used)
}

// moveClock moves the server's clock (clockStep).
func (c *singleCompare) moveClock() {
	c.now += clockStep(c.rng, t0.Add(c.now).UnixMicro(), c.one.limit.Period, c.one.limit.Period, c.subWindows)
	c.b.setClock(c.now)
}

// clockStep returns a random step of a clock at now (µs): by µs, by up
// to two of period, to the µs one of the s sub-windows of a period of
// grid starts (nextStart), or back (a little, or by more than a second:
// a clock stepped back).
func clockStep(rng *rand.Rand, now int64, period, grid time.Duration, s int64) time.Duration {
	switch rng.IntN(7) {
	case 0, 1:
		return time.Duration(1+rng.IntN(1000)) * time.Microsecond
	case 2, 3:
		return time.Duration(1 + rng.Int64N(int64(2*period)))
	case 4:
		return -time.Duration(1+rng.IntN(900_000)) * time.Microsecond
	case 5:
		return time.Duration(nextStart(now, int64(grid/time.Microsecond), s)-now) * time.Microsecond
	}
	return -time.Duration(1+rng.IntN(5)) * time.Second
}

// pickN returns an n that lim accepts (pickUpTo).
func (c *singleCompare) pickN(lim *RateLimiter) int {
	return pickUpTo(c.rng, lim.own.maxN)
}

// pickUpTo returns an n for a limit of capacity maxN: often 0 to 2, else
// up to maxN.
func pickUpTo(rng *rand.Rand, maxN int) int {
	if rng.IntN(2) == 0 {
		return rng.IntN(3)
	}
	return rng.IntN(maxN + 1)
}

// script runs one call on both scripts, with the arguments a runner
// sends (n, the number of rules, now, max delay, trailing defaults left
// out, or all of them), and compares the replies.
func (c *singleCompare) script() {
	ctx := context.Background()
	now := int64(0) // the server's TIME
	if c.rng.IntN(3) == 0 {
		// A client clock: about the server's, or behind it, or ahead.
		offsets := []time.Duration{0, time.Microsecond, -time.Microsecond, -50 * time.Millisecond, -150 * time.Millisecond, -2 * time.Second, 3 * time.Second}
		now = t0.Add(c.now).Add(offsets[c.rng.IntN(len(offsets))]).UnixMicro()
	}
	maxDelay := int64(-1)
	if c.rng.IntN(3) == 0 {
		maxDelay = c.rng.Int64N(int64(c.one.limit.Period/time.Microsecond) * 2)
	}
	n := c.pickN(c.one)
	args := []any{n, 1, now, maxDelay}
	argsOne := args
	if len(c.shares) > 0 && c.rng.IntN(2) == 0 {
		// A call with a share: the general script's every argument, then
		// the share; the single script's as trimSingle sends them.
		share := c.shares[c.rng.IntN(len(c.shares))]
		argsOne = singleShareArgs(n, shareCapacity(int64(c.one.own.rules[0].capacity()), share), now, maxDelay)
		args = append(args, 0, "", 0, share)
	} else if c.rng.IntN(3) > 0 {
		for len(args) > 0 && fmt.Sprint(args[len(args)-1]) == fmt.Sprint(defaultArgs[len(args)-1]) {
			args = args[:len(args)-1]
		}
		argsOne = args
	}
	ro, errO := c.single.Run(ctx, c.b.rdb, []string{c.keyOne}, argsOne...).Result()
	rg, errG := c.gen.own.script.Run(ctx, c.b.rdb, []string{c.keyGen}, args...).Result()
	require.NoError(c.t, errG, c.what)
	require.NoError(c.t, errO, c.what)
	require.Equal(c.t, rg, ro, "%s: arguments %v at %v", c.what, args, c.now)
}

// compareState requires the same keys, values and TTLs on both sides.
func (c *singleCompare) compareState() {
	prefixOne, prefixGen := c.keyOne[:strings.Index(c.keyOne, ":")], c.keyGen[:strings.Index(c.keyGen, ":")]
	requireSameState(c.t, c.m, prefixOne, prefixGen, fmt.Sprintf("%s: the state at %v", c.what, c.now))
}

// requireSameState requires the same keys, values and TTLs in miniredis
// m under prefix one and under prefix gen.
func requireSameState(t *testing.T, m *miniredis.Miniredis, one, gen, what string) {
	t.Helper()
	var ones, gens []string
	for _, k := range m.Keys() {
		switch {
		case strings.HasPrefix(k, one+":"):
			ones = append(ones, miniKeyState(m, k, strings.TrimPrefix(k, one)))
		case strings.HasPrefix(k, gen+":"):
			gens = append(gens, miniKeyState(m, k, strings.TrimPrefix(k, gen)))
		}
	}
	require.Equal(t, gens, ones, what)
}

// miniKeyState prints key k (named as name) of miniredis m: type, value,
// TTL.
func miniKeyState(m *miniredis.Miniredis, k, name string) string {
	s := name + " " + m.Type(k) + " ttl " + m.TTL(k).String() + ": "
	switch m.Type(k) {
	case "string":
		v, _ := m.Get(k)
		s += v
	case "zset":
		members, _ := m.ZMembers(k)
		for _, mb := range members {
			score, _ := m.ZScore(k, mb)
			if strings.HasSuffix(k, reserveSuffix) {
				mb = "id" // a reservation's id is random: its time only
			} else if dot := strings.Index(mb, "."); dot >= 0 {
				mb = mb[:dot] + ".id" // a log's member of a reservation
			}
			s += fmt.Sprintf("%s=%.0f ", mb, score)
		}
	case "hash":
		fields, _ := m.HKeys(k)
		for _, f := range fields {
			s += f + "=" + m.HGet(k, f) + " "
		}
	}
	return s
}

// On real Redis (Lua 5.1, struct.pack), the script specialised for a
// single rule, as a script and as a Redis Function (Redis 7 and later),
// replies as the general script does and leaves the same state and TTL,
// for random calls at a client's time (moving forward, and back by up to
// 2 s) over periods of a minute and more (no key expires during the test).
func TestSingleScriptDecidesAsGeneralRedis(t *testing.T) {
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(40, 41))
	for _, s := range Strategies() {
		rounds := 4
		if algorithms[s].bucket {
			rounds = 8 // rounds 4 to 7 with a warm-up (single_warmup.lua)
		}
		for round := range rounds {
			l, r, err := singleRedisLimit(rng, s, round)
			if err != nil {
				continue
			}
			rs := newRuleSet([]rule{r})
			bake(rs, &config{functions: hasFunctions})
			sr, ok := rs.run.(specialisedRunner)
			if !ok {
				continue // no specialised script
			}
			c := singleRedis{t: t, rdb: rdb, rng: rng, rs: rs, what: fmt.Sprintf("%v %v", s, l)}
			switch one := sr.one.(type) {
			case writtenRunner:
				c.single = one.script
			case functionRunner:
				c.single, c.fn = one.script, one.fn
				require.NoError(t, rdb.FunctionLoadReplace(ctx, c.fn.code).Err(), c.what)
			}
			require.NoError(t, rs.script.Load(ctx, rdb).Err())
			require.NoError(t, c.single.Load(ctx, rdb).Err())
			for i := range 3 {
				c.keys[i] = fmt.Sprintf("{r%v%d}%d%s", s, round, i, r.suffix)
			}
			c.play(300)
		}
	}
}

// randomWarmUp returns l with a random warm-up (a µs to three periods, or
// a whole period), and a token bucket's Burst 0, as a warm-up requires;
// newRule may still refuse it (the warm-up's bounds).
func randomWarmUp(rng *rand.Rand, l Limit) Limit {
	switch rng.IntN(4) {
	case 0:
		l.WarmUp = time.Duration(1+rng.IntN(1000)) * time.Microsecond
	case 1:
		l.WarmUp = l.Period
	default:
		l.WarmUp = time.Duration(1+rng.Int64N(int64(3*l.Period/time.Microsecond))) * time.Microsecond
	}
	l.WarmUp = min(l.WarmUp, MaxPeriod)
	if l.Burst == 0 || rng.IntN(2) == 0 {
		l.Burst = 0
	}
	return l
}

// singleRedisLimit returns round's limit of strategy s for
// TestSingleScriptDecidesAsGeneralRedis, and its rule: from round 4 on, a
// bucket's with a warm-up (drawn again until newRule takes it).
func singleRedisLimit(rng *rand.Rand, s Strategy, round int) (Limit, rule, error) {
	for {
		l := Limit{Rate: []int{1, 3, 10, 1000, MaxRate}[rng.IntN(5)], Period: []time.Duration{time.Minute, time.Hour, 2 * time.Hour}[rng.IntN(3)]}
		if s == SlidingLog {
			l.Rate = min(l.Rate, 100)
		}
		if s == TokenBucket || s == LeakyBucket {
			l.Burst = min(1+rng.IntN(3*l.Rate), MaxRate)
		}
		if s == SubWindowCounter {
			l.SubWindows = []int{0, 7, MaxSubWindows}[round%3] // 7: sub-windows of uneven length
		}
		if round >= 4 {
			l = randomWarmUp(rng, l)
		}
		r, err := newRule("", algorithms[s], l)
		if err == nil || round < 4 {
			return l, r, err
		}
	}
}

// singleRedis plays TestSingleScriptDecidesAsGeneralRedis's calls on
// keys[0] (the general script), keys[1] (the specialised script) and
// keys[2] (the specialised Function, where fn is not nil).
type singleRedis struct {
	t      *testing.T
	rdb    *redis.Client
	rng    *rand.Rand
	rs     *ruleSet
	what   string
	single *redis.Script
	fn     *redisFunction
	keys   [3]string
}

func (c *singleRedis) play(steps int) {
	ctx := context.Background()
	now := t0.UnixMicro()
	period := int64(c.rs.rules[0].limit.Period / time.Microsecond)
	for step := range steps {
		switch c.rng.IntN(8) {
		case 0:
			now -= 1 + c.rng.Int64N(2_000_000) // behind the state's time
		case 1, 2:
			now += 1 + c.rng.Int64N(2*period)
		case 3: // to the µs a sub-window (or a window) starts
			sub := int64(1)
			if r := c.rs.rules[0]; r.alg.strategy == SubWindowCounter {
				sub = r.args[3].(int64)
			}
			now = nextStart(now, period, sub)
		default:
			now += c.rng.Int64N(1000)
		}
		n := []int{0, 1, 1, 1, 2, 3, c.rng.IntN(c.rs.maxN + 1)}[c.rng.IntN(7)]
		maxDelay := int64(-1)
		if c.rng.IntN(3) == 0 {
			maxDelay = c.rng.Int64N(2 * period)
		}
		args := []any{n, 1, now, maxDelay}
		argsOne := args
		if c.rng.IntN(2) == 0 {
			// A priority share: after the general script's every argument,
			// and to the single script as trimSingle sends it.
			share := 1 + c.rng.Int64N(999_999)
			argsOne = singleShareArgs(n, shareCapacity(int64(c.rs.rules[0].capacity()), share), now, maxDelay)
			args = append(args, 0, "", 0, share)
		}
		var cmds [3]*redis.Cmd
		var ttls [3]*redis.DurationCmd
		_, err := c.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			cmds[0] = p.EvalSha(ctx, c.rs.script.Hash(), c.keys[:1], args...)
			cmds[1] = p.EvalSha(ctx, c.single.Hash(), c.keys[1:2], argsOne...)
			if c.fn != nil {
				cmds[2] = p.FCall(ctx, c.fn.name, c.keys[2:], argsOne...)
			}
			for i := range ttls {
				ttls[i] = p.PTTL(ctx, c.keys[i])
			}
			return nil
		})
		require.NoError(c.t, err, c.what)
		where := fmt.Sprintf("%s, step %d: %v", c.what, step, args)
		want := cmds[0].Val()
		require.Equal(c.t, want, cmds[1].Val(), where)
		require.Equal(c.t, dumpState(c.t, c.rdb, c.keys[0]), dumpState(c.t, c.rdb, c.keys[1]), where)
		// (Redis's clock moves between the commands of a transaction.)
		require.InDelta(c.t, ttls[0].Val(), ttls[1].Val(), float64(20*time.Millisecond), where)
		if c.fn != nil {
			require.Equal(c.t, want, cmds[2].Val(), "%s: the Function", where)
			require.Equal(c.t, dumpState(c.t, c.rdb, c.keys[0]), dumpState(c.t, c.rdb, c.keys[2]), "%s: the Function", where)
			require.InDelta(c.t, ttls[0].Val(), ttls[2].Val(), float64(20*time.Millisecond), "%s: the Function", where)
		}
	}
}

// Lua numbers are doubles: tostring keeps 14 digits of a µs timestamp on
// real Redis (and all of them on miniredis), so the scripts never use it,
// nor '..' on a number.
func TestScriptsNeverStringifyNumbers(t *testing.T) {
	files, err := filepath.Glob("scripts/*.lua")
	require.NoError(t, err, "no scripts: %v", err)
	require.NotEmpty(t, files, "no scripts: %v", err)
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "--")
			assert.NotContains(t, code, "tostring", "%s:%d: %s", f, i+1, strings.TrimSpace(line))
			assert.NotContains(t, code, "..", "%s:%d: %s", f, i+1, strings.TrimSpace(line))
		}
	}
}

// singleShareArgs returns a single bucket script's arguments for a call of
// n with a priority share that leaves capacity c, as trimSingle sends them
// (now and max delay kept).
func singleShareArgs(n int, c, now, maxDelay int64) []any {
	if n == 1 {
		return []any{-c - 1, 1, now, maxDelay}
	}
	return []any{n, -c - 1, now, maxDelay}
}
