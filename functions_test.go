package redlimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// withoutFunctions turns WithRedisFunctions off, for the tests of what a
// script does (REDLIMIT_TEST_FUNCTIONS=1 turns it on for every limiter).
func withoutFunctions() Option { return optionFunc(func(c *config) { c.functions = false }) }

// ownServer starts a redis-server for one test (whose functions, ACL users
// and configuration it may change) and returns it, a client closed at the
// end of the test, and whether the engine has functions (Redis 7.0 and
// later, Valkey).
func ownServer(t *testing.T) (*redistest.Server, *redis.Client, bool) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(steadyOptions(srv.Addr))
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb, serverVersion(t).AtLeast(7, 0)
}

// fcallStats returns INFO commandstats' fields for FCALL (calls,
// failed_calls, rejected_calls...), empty where none ran.
func fcallStats(t *testing.T, rdb *redis.Client) map[string]int {
	return commandStats(t, rdb, "fcall")
}

// commandStats returns INFO commandstats' fields for command cmd (lower
// case), empty where it never ran.
func commandStats(t *testing.T, rdb *redis.Client, cmd string) map[string]int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	fields := map[string]int{}
	for line := range strings.SplitSeq(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(stats, ",") {
			name, value, _ := strings.Cut(f, "=")
			if n, err := strconv.Atoi(value); err == nil {
				fields[name] = n
			}
		}
	}
	return fields
}

// fcalls returns how many FCALLs the server has answered without an
// error.
func fcalls(t *testing.T, rdb *redis.Client) int {
	st := fcallStats(t, rdb)
	return st["calls"] - st["failed_calls"]
}

// A limiter with WithRedisFunctions decides as one without it, sharing its
// state, on every strategy and a policy; it loads its library where the
// server has functions (Redis 7, Valkey), again after FUNCTION FLUSH, and
// runs the script where it has none (Redis 6).
func TestRedisFunctionsRedis(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // windows of an hour, on a real clock
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	limit := Limit{Rate: 6, Period: time.Hour, Burst: 6}
	// A bucket stores what is used rounded up to 8 significant digits
	// (bucket.lua): at 6 an hour, by up to 1000 units, which the refill of
	// 167 µs pays back, so calls closer than that could see one Remaining
	// less. At 6 a minute it is 10 units, 2 µs, less than any round trip.
	bucketLimit := Limit{Rate: 6, Period: time.Minute, Burst: 6}

	type limiters struct {
		name            string
		withFn, without Limiter
	}
	var all []limiters
	for _, s := range Strategies() {
		l := limit
		if s == TokenBucket || s == LeakyBucket {
			l = bucketLimit
		}
		all = append(all, limiters{s.String(),
			newLimiter(t, rdb, s, l, WithRedisFunctions()),
			newLimiter(t, rdb, s, l, withoutFunctions())})
	}
	rules := []Rule{
		{Strategy: TokenBucket, Limit: bucketLimit},
		{Strategy: SlidingLog, Limit: Limit{Rate: 100, Period: time.Minute}},
		{Strategy: FixedWindow, Limit: Limit{Rate: 100, Period: 24 * time.Hour}},
	}
	for _, o := range []Option{WithRedisFunctions(), withoutFunctions()} {
		p, err := NewPolicy(rdb, rules, o)
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		if len(all) == len(Strategies()) {
			all = append(all, limiters{name: "policy", withFn: p})
		} else {
			all[len(all)-1].without = p
		}
	}

	decide := func(round string) {
		t.Helper()
		before := fcalls(t, rdb)
		for _, l := range all {
			key := round + ":" + l.name
			// The two limiters take turns on one key: one state.
			for i := range 7 {
				lim := l.withFn
				if i%2 == 1 {
					lim = l.without
				}
				res, err := lim.Allow(ctx, key)
				require.NoError(t, err, "%s call %d", l.name, i)
				assert.False(t, res.Degraded, "%s call %d", l.name, i)
				assert.Equal(t, i < 6, res.Allowed, "%s call %d: %+v", l.name, i, res)
				if i < 6 {
					assert.Equal(t, 5-i, res.Remaining, "%s call %d: %+v", l.name, i, res)
				} else {
					assert.Positive(t, res.RetryAfter, "%s call %d: %+v", l.name, i, res)
				}
			}
		}
		// The four calls of each limiter with the option.
		if hasFunctions {
			assert.Equal(t, 4*len(all), fcalls(t, rdb)-before, "FCALLs in round %s", round)
		} else {
			assert.Zero(t, fcalls(t, rdb), "FCALLs on a server without functions")
		}
	}
	decide("first")
	libraries, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "redlimit_*"}).Result()
	if hasFunctions {
		require.NoError(t, err)
		assert.Len(t, libraries, len(all), "one library per set of rules")
		require.NoError(t, rdb.FunctionFlush(ctx).Err())
		decide("flushed") // loaded again
		libraries, err = rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "redlimit_*"}).Result()
		require.NoError(t, err)
		assert.Len(t, libraries, len(all), "loaded again after FUNCTION FLUSH")
	} else {
		require.Error(t, err, "FUNCTION LIST on a server without functions")
	}
}

// On a server without functions (miniredis), the option changes nothing:
// the limiter runs its script.
func TestRedisFunctionsMissing(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 2, Period: time.Minute}, WithRedisFunctions())
	ctx := context.Background()
	for i := range 3 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		assert.False(t, res.Degraded)
		assert.Equal(t, i < 2, res.Allowed, "call %d", i)
	}
	assert.True(t, lim.noFunctions.Load(), "the limiter still tries functions after an unknown command")
}

// In a cluster, each master loads the library when a key of it first asks
// (on Redis 6, the limiter runs its script).
func TestRedisFunctionsCluster(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // windows of an hour, on a real clock
	c := realCluster(t)
	hasFunctions := serverVersion(t).AtLeast(7, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer rdb.Close()
	ctx := context.Background()
	lim := newLimiter(t, rdb, FixedWindow, Limit{Rate: 3, Period: time.Hour}, WithRedisFunctions())
	fn := runnerOf(t, lim, "k").(functionRunner).fn // the library of its usual calls
	require.NotNil(t, fn)
	// FCALLs answered, over every node of the cluster.
	answered := func() int {
		sum := 0
		for _, addr := range c.Addrs() {
			node := redis.NewClient(&redis.Options{Addr: addr})
			sum += fcalls(t, node)
			node.Close()
		}
		return sum
	}
	before := answered()
	masters := map[string]bool{}
	decisions := 0
	for i := 0; len(masters) < 3 && i < 1000; i++ {
		key := "fn-cluster-" + strconv.Itoa(i)
		for j := range 4 {
			decisions++
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.Equal(t, j < 3, res.Allowed, "key %s call %d", key, j)
		}
		m, err := rdb.MasterForKey(ctx, lim.engine.stateKey(key, &lim.own.rules[0]))
		require.NoError(t, err)
		masters[m.Options().Addr] = true
	}
	require.Len(t, masters, 3, "keys on every master")
	if !hasFunctions {
		assert.True(t, lim.noFunctions.Load(), "the limiter still tries functions on %v", serverVersion(t))
		return
	}
	require.False(t, lim.noFunctions.Load())
	assert.Equal(t, decisions, answered()-before, "decisions made by FCALL")
	loadedEverywhere := func(fn *redisFunction) bool {
		for addr := range masters {
			node := redis.NewClient(&redis.Options{Addr: addr})
			libs, err := node.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: fn.name}).Result()
			node.Close()
			require.NoError(t, err)
			if len(libs) != 1 {
				return false
			}
		}
		return true
	}
	assert.True(t, loadedEverywhere(fn), "library on every master")

	// Through an AutoPipeliner, FUNCTION LOAD goes to any node: the
	// library reaches every master after a few tries, and every call in
	// between is decided by the script.
	ap, err := rdb.AutoPipeline()
	require.NoError(t, err)
	defer ap.Close()
	lim = newLimiter(t, ap, FixedWindow, Limit{Rate: 2, Period: time.Hour}, WithRedisFunctions())
	before = answered()
	for i := range 200 {
		key := "fn-cluster-ap-" + strconv.Itoa(i)
		for j := range 3 {
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			require.Equal(t, j < 2, res.Allowed, "key %s call %d", key, j)
		}
	}
	require.False(t, lim.noFunctions.Load())
	assert.True(t, loadedEverywhere(runnerOf(t, lim, "k").(functionRunner).fn), "library on every master through the AutoPipeliner")
	assert.Greater(t, answered()-before, 500, "of 600 decisions through the AutoPipeliner, FCALLs")
}

// A limiter without the option makes no library code; one with it, on the
// same rules, gets a library beside the shared script.
func TestFunctionMadeOnlyWhenAsked(t *testing.T) {
	b, _ := miniBackend(t)
	l := Limit{Rate: 7, Period: 7 * time.Second}
	plain := newLimiter(t, b.rdb, FixedWindow, l, withoutFunctions())
	require.NotNil(t, plain.own.script)
	assert.Nil(t, plain.own.fn, "library code made without the option")
	withFn := newLimiter(t, b.rdb, FixedWindow, l, WithRedisFunctions())
	assert.Same(t, plain.own.script, withFn.own.script, "one script for the same rules")
	require.NotNil(t, withFn.own.fn)
	assert.Contains(t, withFn.own.fn.code, "redis.register_function('"+withFn.own.fn.name+"'")
}

// A user who may not load or call functions gets the script, with no
// error: the limiter stops trying after the first refusal.
func TestRedisFunctionsNotAllowedRedis(t *testing.T) {
	srv, admin, hasFunctions := ownServer(t)
	ctx := context.Background()
	for _, deny := range []string{"-function", "-fcall"} {
		opts := steadyOptions(srv.Addr)
		if hasFunctions {
			user := "limited" + deny
			require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", deny).Err())
			opts.Username, opts.Password = user, "pw"
		}
		rdb := redis.NewClient(opts)
		lim := newLimiter(t, rdb, TokenBucket, Limit{Rate: 2, Period: time.Minute}, WithRedisFunctions())
		for i := range 3 {
			res, err := lim.Allow(ctx, deny)
			require.NoError(t, err, "%s call %d", deny, i)
			assert.False(t, res.Degraded, "%s call %d", deny, i)
			assert.Equal(t, i < 2, res.Allowed, "%s call %d", deny, i)
		}
		assert.True(t, lim.noFunctions.Load(), "%s: the limiter still tries functions", deny)
		assert.Zero(t, fcalls(t, admin), "%s: FCALLs answered", deny)
		rdb.Close()
	}
}

// serverError is an error reply of a server, as go-redis returns one.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// The errors that tell a server without functions, or a user without the
// right, from one that may run or load the library later.
func TestFunctionErrors(t *testing.T) {
	for _, c := range []struct {
		msg                          string
		missing, refused, notRunning bool
		loadRefused                  bool
	}{
		{msg: "ERR Function not found", missing: true},
		{msg: "ERR unknown command 'FCALL', with args beginning with: ", refused: true, loadRefused: true},
		{msg: "ERR unknown command `fcall`, with args beginning with: `x` ", refused: true, loadRefused: true},
		{msg: "NOPERM User limited has no permissions to run the 'fcall' command", refused: true, loadRefused: true},
		{msg: "unsupported command 'fcall'", refused: true, loadRefused: true}, // Envoy's proxy
		{msg: "NOPERM User limited has no permissions to run the 'function|load' command", loadRefused: true},
		{msg: "ERR Error registering functions: bad", loadRefused: true},
		{msg: "NOPERM No permissions to access a key", loadRefused: true}, // from FCALL: a key's ACL, which the script meets too
		{msg: "BUSY Redis is busy running a script."},
		{msg: "LOADING Redis is loading the dataset in memory"},
		{msg: "READONLY You can't write against a read only replica."},
		{msg: "OOM command not allowed when used memory > 'maxmemory'.", notRunning: true},
		{msg: "NOREPLICAS Not enough good replicas to write.", notRunning: true},
		{msg: "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", notRunning: true},
		{msg: "ERR user_function:12: Script attempted to access nonexistent global variable 'x' script: redlimit_0123456789abcdef, on @user_function:12."},
	} {
		err := error(serverError(c.msg))
		assert.True(t, isServerError(err), c.msg)
		assert.Equal(t, c.missing, functionMissing(err), c.msg)
		assert.Equal(t, c.refused, functionsRefused(err), c.msg)
		assert.Equal(t, c.notRunning, refusedBeforeRunning(err), c.msg)
		assert.Equal(t, c.loadRefused, loadRefused(err), c.msg)
	}
	assert.False(t, isServerError(context.DeadlineExceeded))
	assert.False(t, isServerError(redis.Nil))
}

// Past maxmemory, or with too few replicas for min-replicas-to-write,
// Redis refuses a function that may write before running it, but a script
// only when it writes: a denial is still answered, as without the option.
func TestRedisFunctionsRefusedWritesRedis(t *testing.T) {
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	for _, c := range []struct{ param, value, want string }{
		{"maxmemory", "1", "OOM"},
		{"min-replicas-to-write", "1", "NOREPLICAS"},
	} {
		lim := newLimiter(t, rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour}, WithRedisFunctions(), WithFallback(FallbackError))
		res, err := lim.Allow(ctx, c.param)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		old, err := rdb.ConfigGet(ctx, c.param).Result()
		require.NoError(t, err)
		require.NoError(t, rdb.ConfigSet(ctx, c.param, c.value).Err())
		rejected := fcallStats(t, rdb)["rejected_calls"]
		for i := range 3 {
			res, err = lim.Allow(ctx, c.param)
			require.NoError(t, err, "%s: denial %d", c.param, i)
			assert.False(t, res.Allowed, "%s: denial %d", c.param, i)
			assert.Positive(t, res.RetryAfter, "%s: denial %d", c.param, i)
		}
		if hasFunctions {
			// Each denial was first refused as an FCALL.
			assert.Equal(t, 3, fcallStats(t, rdb)["rejected_calls"]-rejected, "%s: FCALLs refused", c.param)
		}
		_, err = lim.Allow(ctx, c.param+"-other") // would write: refused, as a script is
		if hasFunctions || c.want == "OOM" {
			require.ErrorContains(t, err, c.want)
		} else {
			require.NoError(t, err, "Redis 6 lets a script write without the replicas")
		}
		// (Redis 6 has no functions: the limiter stopped trying at once.)
		assert.Equal(t, !hasFunctions, lim.noFunctions.Load(), "%s is no reason to stop trying functions", c.want)
		require.NoError(t, rdb.ConfigSet(ctx, c.param, old[c.param]).Err())
		// The refused write marked the node down in the watch that the
		// limiters of rdb share (see internal/nodewatch): the next case's limiter
		// starts with a watch of its own once this one, its only member,
		// has closed.
		require.NoError(t, lim.Close())
	}
}

// A library decides exactly as its script, call after call on one loaded
// library: random n (0 too), reservations, blocks, max delays, a clock
// that jumps (back too) and calls that fail in the middle (a corrupted
// state), on each strategy alone, a policy of five and one of MaxRules
// rules. The clock comes as an argument, so the two replies and states must
// be equal, byte for byte. (Redis 6 has no functions: there it checks that
// FUNCTION LOAD is refused, which is what turns the option off.)
func TestRedisFunctionsMatchScriptsRedis(t *testing.T) {
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	var sets [][]Rule
	for _, s := range Strategies() {
		sets = append(sets, []Rule{{Strategy: s, Limit: Limit{Rate: 4, Period: 20 * time.Millisecond, Burst: 6}}})
	}
	var five, most []Rule
	for i, s := range Strategies() {
		five = append(five, Rule{Strategy: s, Limit: Limit{Rate: 3 + i, Period: time.Duration(10*(i+1)) * time.Millisecond}, PerCall: i == 2})
	}
	for i := range MaxRules {
		s := Strategies()[i%len(Strategies())]
		most = append(most, Rule{Strategy: s, Limit: Limit{Rate: 5 + i%7, Period: time.Duration(5*(i+1)) * time.Millisecond}, PerCall: i%6 == 5})
	}
	sets = append(sets, five, most)

	rng := rand.New(rand.NewPCG(11, 12))
	for si, rules := range sets {
		rs, err := policyRules(rules)
		require.NoError(t, err)
		bake(rs, &config{functions: true})
		require.NotNil(t, rs.fn, "set %d", si)
		err = rdb.FunctionLoad(ctx, rs.fn.code).Err()
		if !hasFunctions {
			require.Error(t, err, "FUNCTION LOAD on %v", serverVersion(t))
			assert.True(t, loadRefused(err), "%v: %v", serverVersion(t), err)
			continue
		}
		require.NoError(t, err, "set %d: FUNCTION LOAD", si)
		require.NoError(t, rs.script.Load(ctx, rdb).Err())
		keysOf := func(side string) []string {
			var ks []string
			for i := range rs.rules {
				ks = append(ks, ruleKey("{"+side+"}"+rs.rules[0].suffix, rs, i))
			}
			return ks
		}
		ruleKeysA, ruleKeysB := keysOf(fmt.Sprint("fa", si)), keysOf(fmt.Sprint("fb", si))
		now := int64(1_700_000_000_000_000)
		failed := 0 // calls that failed in their middle
		for step := range 400 {
			now += rng.Int64N(8000)
			if rng.IntN(50) == 0 {
				now -= rng.Int64N(30000) // the clock steps back
			}
			n := []int{0, 1, 1, 1, 2, 3, 9}[rng.IntN(7)]
			maxDelay, block, rid, life := int64(-1), int64(0), "", int64(0)
			if rng.IntN(4) == 0 {
				maxDelay = rng.Int64N(40000)
			}
			if rng.IntN(5) == 0 {
				block = 15000
			}
			if rng.IntN(5) == 0 {
				rid, life = fmt.Sprint("r", step), 60000
			}
			keysA, keysB := slices.Clone(ruleKeysA), slices.Clone(ruleKeysB)
			for _, p := range []*[]string{&keysA, &keysB} {
				rules := slices.Clone(*p)
				if block > 0 {
					*p = append(*p, rules[0]+blockSuffix)
				}
				if rid != "" {
					for _, k := range rules {
						*p = append(*p, k+reserveSuffix)
					}
				}
			}
			corrupt := rng.IntN(40) == 0
			if corrupt { // the call fails in its middle, on both sides
				k := rng.IntN(len(rs.rules))
				require.NoError(t, rdb.Del(ctx, ruleKeysA[k], ruleKeysB[k]).Err())
				require.NoError(t, rdb.SAdd(ctx, ruleKeysA[k], "x").Err())
				require.NoError(t, rdb.SAdd(ctx, ruleKeysB[k], "x").Err())
			}
			// Both in one transaction, which then takes away every
			// expiry: Redis's own clock, which the keys' expiries
			// follow, must not expire a key on one side only.
			args := []any{n, len(rs.rules), now, maxDelay, block, rid, life}
			var script, fn *redis.Cmd
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				script = p.EvalSha(ctx, rs.script.Hash(), keysA, args...)
				fn = p.FCall(ctx, rs.fn.name, keysB, args...)
				for _, k := range slices.Concat(keysA, keysB) {
					p.Persist(ctx, k)
				}
				return nil
			})
			if err != nil && script.Err() == nil && fn.Err() == nil {
				require.NoError(t, err)
			}
			want, errScript := script.Result()
			got, errFn := fn.Result()
			where := fmt.Sprintf("set %d step %d: n %d, max delay %d, block %d, rid %q, corrupt %v", si, step, n, maxDelay, block, rid, corrupt)
			require.Equal(t, errScript != nil, errFn != nil, "%s: script %v, function %v", where, errScript, errFn)
			require.Equal(t, want, got, where)
			if corrupt {
				if errScript != nil {
					failed++
				}
				for _, ks := range [][]string{ruleKeysA, ruleKeysB} {
					require.NoError(t, rdb.Del(ctx, ks...).Err())
				}
				continue
			}
			for i := range ruleKeysA {
				a, b := dumpState(t, rdb, ruleKeysA[i]), dumpState(t, rdb, ruleKeysB[i])
				require.Equal(t, a, b, "%s: rule %d's state", where, i)
			}
		}
		assert.Positive(t, failed, "set %d: no call failed in its middle", si)
	}
}

// dumpState returns a key's type and value (a sorted set's members with
// their scores), for comparing two keys' states.
func dumpState(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := rdb.Type(ctx, key).Result()
	require.NoError(t, err)
	switch typ {
	case "none":
		return typ
	case "zset":
		zs, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		require.NoError(t, err)
		return fmt.Sprint(typ, zs)
	case "hash":
		h, err := rdb.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		return fmt.Sprint(typ, h) // fmt prints a map sorted by key
	}
	v, err := rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	return typ + " " + v
}

// Keys, n and rule names come from clients and configuration: through a
// library they are arguments, never code, and bad ones are refused before
// Redis is asked, as with scripts.
func TestRedisFunctionsHostileInputRedis(t *testing.T) {
	_, rdb, hasFunctions := ownServer(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "other", "kept", 0).Err())
	lim := newLimiter(t, rdb, TokenBucket, Limit{Rate: 3, Period: time.Hour}, WithRedisFunctions())
	inject := "x') redis.call('FLUSHALL') --"
	keys := []string{"{", "}", "%7B", "{a}b", "%h" + strings.Repeat("0", 64), "\x00\n\r", inject,
		"a\r\n*1\r\n$8\r\nFLUSHALL\r\n", strings.Repeat("k", 10_000), strings.Repeat("k", 10_001)}
	for _, key := range keys {
		for i := range 4 {
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err, "key %.40q call %d", key, i)
			assert.False(t, res.Degraded, "key %.40q call %d", key, i)
			assert.Equal(t, i < 3, res.Allowed, "key %.40q call %d: its own state, shared with no other key", key, i)
		}
	}
	size, err := rdb.DBSize(ctx).Result()
	require.NoError(t, err)
	for _, c := range []struct {
		key  string
		n    int
		want error
	}{
		{"", 1, ErrInvalidArgument},
		{"k", -1, ErrInvalidArgument},
		{"k", 4, ErrExceedsLimit},
		{"k", math.MaxInt, ErrExceedsLimit},
	} {
		_, err := lim.AllowN(ctx, c.key, c.n)
		require.ErrorIs(t, err, c.want, "key %q n %d", c.key, c.n)
	}
	after, err := rdb.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Equal(t, size, after, "a refused call wrote to Redis")

	p, err := NewPolicy(rdb, []Rule{
		{Name: inject, Strategy: FixedWindow, Limit: PerHour(2)}, // three calls in one window, on a real clock
		{Name: "]] ' \" \\ end) QZX", Strategy: SlidingCounter, Limit: PerMinute(100)},
	}, WithRedisFunctions())
	require.NoError(t, err)
	defer p.Close()
	require.NotNil(t, p.own.fn)
	for _, name := range []string{"FLUSHALL", "QZX"} {
		assert.False(t, strings.Contains(p.own.fn.code, name), "a rule's name (%s) in the library's code", name)
	}
	for i := range 3 {
		res, err := p.Allow(ctx, inject)
		require.NoError(t, err)
		assert.Equal(t, i < 2, res.Allowed, "policy call %d", i)
		if !res.Allowed {
			assert.Equal(t, inject, res.Rule, "the denying rule keeps its name")
		}
	}
	v, err := rdb.Get(ctx, "other").Result()
	require.NoError(t, err)
	assert.Equal(t, "kept", v)
	if hasFunctions {
		assert.Positive(t, fcalls(t, rdb), "decisions made by FCALL")
		assert.False(t, lim.noFunctions.Load())
	}
}
