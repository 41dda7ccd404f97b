package redlimit

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testlane"
)

// policyScriptStrategies are the strategies a policy's script writes out
// (policySource).
var policyScriptStrategies = []Strategy{TokenBucket, SlidingCounter, FixedWindow}

// policyScriptRules returns 2 to maxPolicyScriptRules random rules of
// policyScriptStrategies, of distinct strategy and period, and the same
// rules with limits three times as high (sharing their state), each valid.
func policyScriptRules(rng *rand.Rand) (rules, higher []Rule) {
	// (1.234567 s and 333,333 µs: not multiples of a power of ten, so a
	// bucket's compact state rounds its debt up, which a call's remaining
	// must count.)
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, 333333 * time.Microsecond, time.Second,
		1234567 * time.Microsecond, time.Minute, 2 * time.Hour}
	seen := map[[2]int64]bool{}
	count := 2 + rng.IntN(maxPolicyScriptRules-1)
	for len(rules) < count {
		s := policyScriptStrategies[rng.IntN(len(policyScriptStrategies))]
		l := randomLimit(rng, s)
		l.Period = periods[rng.IntN(len(periods))]
		if _, err := newRule("", algorithms[s], l); err != nil || seen[[2]int64{int64(s), int64(l.Period)}] {
			continue
		}
		h := Limit{Rate: min(3*l.Rate, MaxRate), Period: l.Period, Burst: min(3*max(l.Burst, l.Rate), MaxRate)}
		if s != TokenBucket {
			h.Burst = 0
		}
		if _, err := newRule("", algorithms[s], h); err != nil {
			h = l
		}
		seen[[2]int64{int64(s), int64(l.Period)}] = true
		rules = append(rules, Rule{Strategy: s, Limit: l})
		higher = append(higher, Rule{Strategy: s, Limit: h})
	}
	return rules, higher
}

// A policy of two to four rules (token buckets, sliding counters, fixed
// windows) runs, for its usual call, the script specialised for it
// (policySource); it must decide as the general script with the same
// rules written in: the same reply (code, remaining, retry, reset, the
// deciding rule and its reset, each rule's remaining) and the same state
// and TTL of every key, for random policies (rates up to MaxRate, periods
// of a ms to two hours, a bucket's state as text), n from 0 to the
// capacity, at the server's time and at a client's (behind it or ahead),
// the clock moving forward and back, reservations (the general script's,
// which leave a bucket's state with gaps) taken and settled on the same
// keys, and a higher limit sharing the state (which a look, n = 0, finds
// over the allowance). The policies themselves, one on specialisedRunner and one
// on the general script, return the same Results.
func TestPolicyScriptDecidesAsGeneral(t *testing.T) {
	testlane.MarkHeavy(t)
	b, m := miniBackend(t)
	rng := rand.New(rand.NewPCG(44, 45))
	for round := range 40 {
		c := newPolicyCompare(t, b, m, rng, round)
		for range 150 {
			c.step()
		}
	}
}

// A bucket's compact state keeps its debt rounded up to 8 digits, so that
// where its period is no multiple of the power of ten a call's debt is
// stored a little higher: the policy's script must count the remaining
// that leaves, as the general script does, in its Result when the bucket
// decides, and in the bucket's remaining in the reply (the fallback's
// memory) when another rule does.
func TestPolicyScriptRoundedDebt(t *testing.T) {
	b, m := miniBackend(t)
	bucket := Rule{Strategy: TokenBucket, Limit: Limit{Rate: 1000, Period: 1234567 * time.Microsecond, Burst: 2000}}
	for i, window := range []Limit{{Rate: 100_000, Period: time.Second}, {Rate: 1000, Period: time.Second}} {
		rules := []Rule{bucket, {Strategy: FixedWindow, Limit: window}}
		c := newPolicyCompareOf(t, b, m, rand.New(rand.NewPCG(1, 2)), i, rules, rules)
		c.callN(662, 0) // 662 × 1,234,567 has 12 digits: stored rounded up
		c.compareState()
		allowBoth(t.Context(), t, c.one, c.gen, 662, c.what+": AllowN(662)")
		c.compareState()
	}
}

// policyCompare plays one round of TestPolicyScriptDecidesAsGeneral: the
// same calls on two keys, one decided by the policy's script and one by
// the general script.
type policyCompare struct {
	t         *testing.T
	b         *backend
	m         *miniredis.Miniredis
	rng       *rand.Rand
	what      string
	one, gen  *Policy // specialisedRunner, and the general script
	higherOne *Policy // a higher limit on one's keys, and on gen's:
	higherGen *Policy // both on the general script
	script    *redis.Script
	keysOne   []string
	keysGen   []string
	pending   [][2]*Reservation
	now       time.Duration // the server's clock, from t0
	period    time.Duration // the longest rule's
	prefixOne string
	prefixGen string
}

func newPolicyCompare(t *testing.T, b *backend, m *miniredis.Miniredis, rng *rand.Rand, round int) *policyCompare {
	rules, higher := policyScriptRules(rng)
	return newPolicyCompareOf(t, b, m, rng, round, rules, higher)
}

// newPolicyCompareOf is newPolicyCompare of the given rules, and the higher
// limits sharing their state.
func newPolicyCompareOf(t *testing.T, b *backend, m *miniredis.Miniredis, rng *rand.Rand, round int, rules, higher []Rule) *policyCompare {
	c := &policyCompare{t: t, b: b, m: m, rng: rng, what: fmt.Sprintf("round %d, %v", round, rules)}
	c.prefixOne, c.prefixGen = fmt.Sprintf("p%done", round), fmt.Sprintf("p%dgen", round)
	c.one = newPolicy(t, b.rdb, rules, WithPrefix(c.prefixOne), withoutFunctions())
	c.gen = newPolicy(t, b.rdb, rules, WithPrefix(c.prefixGen), withoutFunctions())
	c.higherOne = newPolicy(t, b.rdb, higher, WithPrefix(c.prefixOne), withoutFunctions())
	c.higherGen = newPolicy(t, b.rdb, higher, WithPrefix(c.prefixGen), withoutFunctions())
	sr, ok := c.one.own.run.(specialisedRunner)
	require.True(t, ok, "%s: runner %T", c.what, c.one.own.run)
	c.script = sr.one.(writtenRunner).script
	require.Equal(t, redis.NewScript(policySource(c.one.own)).Hash(), c.script.Hash(), "%s: not the policy's script", c.what)
	for _, p := range []*Policy{c.gen, c.higherOne, c.higherGen} {
		p.own.run = writtenRunner{script: p.own.script}
	}
	first := c.one.stateKey("k", &c.one.own.rules[0])
	firstGen := c.gen.stateKey("k", &c.gen.own.rules[0])
	for i, r := range c.one.own.rules {
		c.keysOne = append(c.keysOne, ruleKey(first, c.one.own, i))
		c.keysGen = append(c.keysGen, ruleKey(firstGen, c.gen.own, i))
		c.period = max(c.period, r.limit.Period)
	}
	return c
}

// step moves the clock or makes one call on both sides, and compares.
func (c *policyCompare) step() {
	ctx := context.Background()
	switch op := c.rng.IntN(12); {
	case op < 3:
		c.moveClock()
	case op < 7:
		c.call()
	case op < 8:
		n := pickUpTo(c.rng, c.one.own.maxN)
		allowBoth(ctx, c.t, c.one, c.gen, n, fmt.Sprintf("%s: AllowN(%d)", c.what, n))
	case op < 9:
		n := pickUpTo(c.rng, c.higherOne.own.maxN)
		allowBoth(ctx, c.t, c.higherOne, c.higherGen, n, fmt.Sprintf("%s: the higher limit's AllowN(%d)", c.what, n))
	case op < 10:
		reserveBoth(c.t, c.what, c.one, c.gen, max(pickUpTo(c.rng, c.one.own.maxN), 1), &c.pending)
	default:
		settleBoth(c.t, c.what, c.rng, &c.pending)
	}
	c.compareState()
}

// moveClock moves the server's clock (clockStep), to the start of a
// window of a rule at random among its steps.
func (c *policyCompare) moveClock() {
	r := c.one.own.rules[c.rng.IntN(len(c.one.own.rules))]
	c.now += clockStep(c.rng, t0.Add(c.now).UnixMicro(), c.period, r.limit.Period, 1)
	c.b.setClock(c.now)
}

// call runs one call on both scripts, with the arguments the runners send
// (the policy's script's as trimSingle leaves them; the general script's
// as trimDefaults does, or all of them), at the server's time or a
// client's, and compares the replies.
func (c *policyCompare) call() {
	now := int64(0) // the server's TIME
	if c.rng.IntN(3) == 0 {
		offsets := []time.Duration{0, time.Microsecond, -time.Microsecond, -50 * time.Millisecond, -150 * time.Millisecond, -2 * time.Second, 3 * time.Second}
		now = t0.Add(c.now).Add(offsets[c.rng.IntN(len(offsets))]).UnixMicro()
	}
	c.callN(pickUpTo(c.rng, c.one.own.maxN), now)
}

// callN runs a call of n at now (0: the server's TIME) on both scripts, as
// call does.
func (c *policyCompare) callN(n int, now int64) {
	ctx := context.Background()
	k := len(c.keysOne)
	args, argsOne := []any{n, k, now, -1}, []any{n, 1, now}
	if c.rng.IntN(3) > 0 {
		for len(argsOne) > 0 && fmt.Sprint(argsOne[len(argsOne)-1]) == fmt.Sprint(defaultArgs[len(argsOne)-1]) {
			argsOne = argsOne[:len(argsOne)-1]
		}
	}
	ro, errO := c.script.Run(ctx, c.b.rdb, c.keysOne, argsOne...).Result()
	rg, errG := c.gen.own.script.Run(ctx, c.b.rdb, c.keysGen, args...).Result()
	require.NoError(c.t, errG, c.what)
	require.NoError(c.t, errO, c.what)
	require.Equal(c.t, rg, ro, "%s: arguments %v at %v", c.what, args, c.now)
}

// compareState requires the same keys, values and TTLs on both sides.
func (c *policyCompare) compareState() {
	requireSameState(c.t, c.m, c.prefixOne, c.prefixGen, fmt.Sprintf("%s: the state at %v", c.what, c.now))
}

// On real Redis (Lua 5.1, struct.pack), a policy's script, as a script and
// as a Redis Function (Redis 7 and later), replies as the general script
// does and leaves the same state and TTL in every rule's key, for random
// policies of periods of a minute and more (no key expires during the
// test) and random calls at a client's time, moving forward and back by
// up to 2 s, and a higher limit sharing the state on the general script.
func TestPolicyScriptDecidesAsGeneralRedis(t *testing.T) {
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(46, 47))
	long := func(rules []Rule) {
		for i := range rules {
			rules[i].Limit.Period = []time.Duration{time.Minute, time.Hour, 2 * time.Hour}[i%3]
		}
	}
	for round := range 12 {
		rules, higher := policyScriptRules(rng)
		long(rules)
		long(higher)
		rs, err := policyRules(rules)
		require.NoError(t, err)
		hs, err := policyRules(higher)
		require.NoError(t, err)
		bake(rs, &config{functions: hasFunctions})
		bake(hs, &config{})
		what := fmt.Sprintf("round %d, %v", round, rules)
		sr, ok := rs.run.(specialisedRunner)
		require.True(t, ok, "%s: runner %T", what, rs.run)
		// keys[0]: the general script; keys[1]: the policy's; keys[2]: its Function.
		var keys [3][]string
		for side := range keys {
			for i := range rs.rules {
				keys[side] = append(keys[side], fmt.Sprintf("{p%d.%d}%s", round, side, rs.rules[i].suffix))
			}
		}
		var script *redis.Script
		var fn *redisFunction
		switch one := sr.one.(type) {
		case writtenRunner:
			script = one.script
		case functionRunner:
			script, fn = one.script, one.fn
			require.NoError(t, rdb.FunctionLoadReplace(ctx, fn.code).Err(), what)
		}
		require.Equal(t, redis.NewScript(policySource(rs)).Hash(), script.Hash(), what)
		for _, s := range []*redis.Script{rs.script, hs.script, script} {
			require.NoError(t, s.Load(ctx, rdb).Err(), what)
		}
		now := t0.UnixMicro()
		for step := range 200 {
			switch rng.IntN(8) {
			case 0:
				now -= 1 + rng.Int64N(2_000_000)
			case 1, 2:
				now += 1 + rng.Int64N(int64(2*time.Minute/time.Microsecond))
			default:
				now += rng.Int64N(1000)
			}
			n := []int{0, 1, 1, 1, 2, 3, rng.IntN(rs.maxN + 1)}[rng.IntN(7)]
			if rng.IntN(6) == 0 {
				// The higher limit, on the general script, on every side's keys.
				for side := range keys {
					require.NoError(t, hs.script.Run(ctx, rdb, keys[side], n, len(rules), now).Err(), what)
				}
			}
			args, argsOne := []any{n, len(rules), now}, []any{n, 1, now}
			var cmds [3]*redis.Cmd
			var ttls [3][]*redis.DurationCmd
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				cmds[0] = p.EvalSha(ctx, rs.script.Hash(), keys[0], args...)
				cmds[1] = p.EvalSha(ctx, script.Hash(), keys[1], argsOne...)
				if fn != nil {
					cmds[2] = p.FCall(ctx, fn.name, keys[2], argsOne...)
				}
				for side := range keys {
					for _, k := range keys[side] {
						ttls[side] = append(ttls[side], p.PTTL(ctx, k))
					}
				}
				return nil
			})
			require.NoError(t, err, what)
			where := fmt.Sprintf("%s, step %d: %v", what, step, args)
			sides := 2
			if fn != nil {
				sides = 3
			}
			for side := 1; side < sides; side++ {
				require.Equal(t, cmds[0].Val(), cmds[side].Val(), "%s, side %d", where, side)
				for i := range rs.rules {
					require.Equal(t, dumpState(t, rdb, keys[0][i]), dumpState(t, rdb, keys[side][i]), "%s, side %d, rule %d", where, side, i+1)
					// (Redis's clock moves between the commands of a transaction.)
					require.InDelta(t, ttls[0][i].Val(), ttls[side][i].Val(), float64(20*time.Millisecond), "%s, side %d, rule %d", where, side, i+1)
				}
			}
		}
	}
}

// A policy's script nests each rule's block in the block of the rule
// before it (policySource), so a rule's files see every name the blocks
// before it declared. Each block (policyBlock, ended by policy_write.lua)
// must therefore declare no name of the script's head, and use no name
// before declaring it but the head's and Lua's and Redis's globals.
func TestPolicyScriptBlocksKeepTheirNames(t *testing.T) {
	head := luaNames(mustRead("single_args.lua")+mustRead("policy_head.lua"), true).declared
	for _, name := range []string{"format", "a1", "a2", "a3", "a4"} { // policySource's own lines
		head[name] = true
	}
	require.Contains(t, head, "now")
	require.Contains(t, head, "min_now")
	blocks := map[Strategy]luaScope{}
	ours := map[string]bool{} // every name some block declares
	for _, s := range policyScriptStrategies {
		rs, err := policyRules([]Rule{{Strategy: s, Limit: PerMinute(10)}, {Strategy: s, Limit: PerHour(100)}})
		require.NoError(t, err)
		blocks[s] = luaNames(policyBlock(&rs.rules[0], 1)+mustRead("policy_write.lua"), false)
		maps.Copy(ours, blocks[s].declared)
	}
	for s, b := range blocks {
		for name := range b.declared {
			assert.False(t, head[name], "%v's block declares %q, a name of the script's head", s, name)
		}
		for name := range b.free {
			assert.False(t, ours[name] && !head[name], "%v's block uses %q before declaring it: a block before it may have", s, name)
		}
	}
}

// luaScope is what luaNames found in a piece of Lua.
type luaScope struct {
	declared map[string]bool // by local (with top: only at the line's start, the outermost block)
	free     map[string]bool // used before the piece declares them
}

// luaNames reads the names a piece of Lua declares and uses, line by line
// (a name counts as declared from its declaration on, whatever block it
// is in): enough for the scripts' plain style, not a Lua parser.
func luaNames(src string, top bool) luaScope {
	sc := luaScope{declared: map[string]bool{}, free: map[string]bool{}}
	for _, line := range strings.Split(src, "\n") {
		code, _, _ := strings.Cut(line, "--")
		code = luaString.ReplaceAllString(code, "''")
		var decl []string
		if m := localDecl.FindStringSubmatch(code); m != nil && (!top || strings.HasPrefix(code, "local ")) {
			for _, name := range strings.Split(m[1], ",") {
				decl = append(decl, strings.TrimSpace(name))
			}
			code = strings.Replace(code, m[0], "", 1)
		}
		for _, m := range luaName.FindAllStringSubmatch(code, -1) {
			if name := m[1]; !luaKeywords[name] && !sc.declared[name] {
				sc.free[name] = true
			}
		}
		for _, name := range decl {
			sc.declared[name] = true
		}
	}
	return sc
}

var (
	// localDecl matches a declaration of locals ("local a, b", "local
	// function f"), its names in group 1.
	localDecl = regexp.MustCompile(`\blocal\s+(?:function\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)`)
	// luaName matches a name that is not a field (after "." or ":").
	luaName   = regexp.MustCompile(`(?:^|[^.:\w])([A-Za-z_]\w*)`)
	luaString = regexp.MustCompile(`'[^']*'|"[^"]*"`)
)

var luaKeywords = map[string]bool{
	"and": true, "break": true, "do": true, "else": true, "elseif": true, "end": true, "false": true,
	"for": true, "function": true, "if": true, "in": true, "local": true, "nil": true, "not": true,
	"or": true, "repeat": true, "return": true, "then": true, "true": true, "until": true, "while": true,
}

// A policy's script of maxPolicyScriptRules rules of one strategy loads
// and decides: its nested blocks hold every rule's locals at once, within
// the bounds of miniredis's Lua (200 registers a function) and of Lua 5.1
// on real Redis (200 locals, 250 registers).
func TestPolicyScriptMaxRules(t *testing.T) {
	b, _ := miniBackend(t)
	policyScriptMaxRules(t, b.rdb)
}

func TestPolicyScriptMaxRulesRedis(t *testing.T) {
	_, rdb, _ := ownServer(t)
	policyScriptMaxRules(t, rdb)
}

func policyScriptMaxRules(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	for _, s := range policyScriptStrategies {
		rules := make([]Rule, maxPolicyScriptRules)
		for i := range rules {
			rules[i] = Rule{Strategy: s, Limit: Limit{Rate: 10, Period: time.Duration(i+1) * time.Minute}}
		}
		rs, err := policyRules(rules)
		require.NoError(t, err)
		src := policySource(rs)
		require.NotEmpty(t, src, "%v", s)
		require.NoError(t, rdb.ScriptLoad(ctx, src).Err(), "%v", s)
		p, err := NewPolicy(rdb, rules, WithPrefix("max"+s.String()))
		require.NoError(t, err)
		res, err := p.Allow(ctx, "k")
		p.Close()
		require.NoError(t, err, "%v", s)
		assert.True(t, res.Allowed, "%v", s)
	}
}
