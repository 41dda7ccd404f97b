package redlimit

import (
	"context"
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

// fcalls returns how many FCALLs the server has answered without an
// error (calls less failed_calls, from INFO commandstats).
func fcalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:")
		if !ok {
			continue
		}
		fields := map[string]int{}
		for f := range strings.SplitSeq(stats, ",") {
			name, value, _ := strings.Cut(f, "=")
			if n, err := strconv.Atoi(value); err == nil {
				fields[name] = n
			}
		}
		return fields["calls"] - fields["failed_calls"]
	}
	return 0
}

// A limiter with WithRedisFunctions decides as one without it, sharing its
// state, on every strategy and a policy; it loads its library where the
// server has functions (Redis 7, Valkey), again after FUNCTION FLUSH, and
// runs the script where it has none (Redis 6).
func TestRedisFunctionsRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(steadyOptions(srv.Addr))
	defer rdb.Close()
	ctx := context.Background()
	hasFunctions := serverVersion(t).AtLeast(7, 0)
	limit := Limit{Rate: 6, Period: time.Hour, Burst: 6}

	type limiters struct {
		name            string
		withFn, without Limiter
	}
	var all []limiters
	for _, s := range Strategies() {
		all = append(all, limiters{s.String(),
			newLimiter(t, rdb, s, limit, WithRedisFunctions()),
			newLimiter(t, rdb, s, limit, withoutFunctions())})
	}
	rules := []Rule{
		{Strategy: TokenBucket, Limit: limit},
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
	c := realCluster(t)
	hasFunctions := serverVersion(t).AtLeast(7, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer rdb.Close()
	ctx := context.Background()
	lim := newLimiter(t, rdb, FixedWindow, Limit{Rate: 3, Period: time.Hour}, WithRedisFunctions())
	fn := lim.own.fn
	require.NotNil(t, fn)
	masters := map[string]bool{}
	for i := 0; len(masters) < 3 && i < 1000; i++ {
		key := "fn-cluster-" + strconv.Itoa(i)
		for j := range 4 {
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
	for addr := range masters {
		node := redis.NewClient(&redis.Options{Addr: addr})
		libs, err := node.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: fn.name}).Result()
		node.Close()
		require.NoError(t, err)
		assert.Len(t, libs, 1, "library on master %s", addr)
	}
}

// A user who may not load or call functions gets the script, with no
// error: the limiter stops trying after the first refusal.
func TestRedisFunctionsNotAllowedRedis(t *testing.T) {
	srv := redistest.Start(t)
	admin := redis.NewClient(steadyOptions(srv.Addr))
	defer admin.Close()
	ctx := context.Background()
	hasFunctions := serverVersion(t).AtLeast(7, 0)
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
// right, from one that may load the library later.
func TestFunctionErrors(t *testing.T) {
	for _, c := range []struct {
		msg                string
		missing, refused   bool
		transient, fromSrv bool
	}{
		{msg: "ERR Function not found", missing: true, fromSrv: true},
		{msg: "ERR unknown command 'FCALL', with args beginning with: ", refused: true, fromSrv: true},
		{msg: "ERR unknown command `fcall`, with args beginning with: `x` ", refused: true, fromSrv: true},
		{msg: "NOPERM User limited has no permissions to run the 'fcall' command", refused: true, fromSrv: true},
		{msg: "BUSY Redis is busy running a script.", transient: true, fromSrv: true},
		{msg: "LOADING Redis is loading the dataset in memory", transient: true, fromSrv: true},
		{msg: "OOM command not allowed when used memory > 'maxmemory'.", transient: true, fromSrv: true},
		{msg: "ERR Error registering functions: bad", fromSrv: true},
	} {
		err := error(serverError(c.msg))
		assert.Equal(t, c.missing, functionMissing(err), c.msg)
		assert.Equal(t, c.refused, functionsRefused(err), c.msg)
		assert.Equal(t, c.transient, transient(err), c.msg)
		assert.Equal(t, c.fromSrv, isServerError(err), c.msg)
	}
	assert.False(t, isServerError(context.DeadlineExceeded))
	assert.False(t, isServerError(redis.Nil))
}

// Past maxmemory, Redis refuses a function that may write, but a script
// only when it writes: a denial is still answered, as without the option.
func TestRedisFunctionsOutOfMemoryRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(steadyOptions(srv.Addr))
	defer rdb.Close()
	ctx := context.Background()
	lim := newLimiter(t, rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour}, WithRedisFunctions(), WithFallback(FallbackError))
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
	defer rdb.ConfigSet(ctx, "maxmemory", "0")
	for i := range 3 {
		res, err = lim.Allow(ctx, "k")
		require.NoError(t, err, "denial %d past maxmemory", i)
		assert.False(t, res.Allowed, "denial %d past maxmemory", i)
		assert.False(t, res.Degraded, "denial %d past maxmemory", i)
		assert.Positive(t, res.RetryAfter, "denial %d past maxmemory", i)
	}
	_, err = lim.Allow(ctx, "other") // would write: refused, as a script is
	require.ErrorContains(t, err, "OOM")
	// (Redis 6 has no functions: the limiter stopped trying at once.)
	assert.Equal(t, !serverVersion(t).AtLeast(7, 0), lim.noFunctions.Load(), "memory is no reason to stop trying functions")
}
