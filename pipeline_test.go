package redlimit

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// runnerCase makes a limiter whose calls one runner decides.
type runnerCase struct {
	name   string
	runner runner // the runner its rule set must have
	// calendar is the runner of a single calendar rule's usual calls: its
	// own script's (calendarSingleRunner), or with the rules as arguments.
	calendar runner
	make     func(t *testing.T, rdb redis.UniversalClient, s Strategy, l Limit, opts ...Option) *RateLimiter
}

// runnerCases covers every runner: with the rules written in (a script, a
// Redis Function), as arguments (a limit function), and a calendar rule's.
func runnerCases() []runnerCase {
	plain := func(t *testing.T, rdb redis.UniversalClient, s Strategy, l Limit, opts ...Option) *RateLimiter {
		return newLimiter(t, rdb, s, l, opts...)
	}
	functions := func(t *testing.T, rdb redis.UniversalClient, s Strategy, l Limit, opts ...Option) *RateLimiter {
		return newLimiter(t, rdb, s, l, append(opts, WithRedisFunctions())...)
	}
	dynamic := func(t *testing.T, rdb redis.UniversalClient, s Strategy, l Limit, opts ...Option) *RateLimiter {
		f := WithLimitFunc(func(context.Context, string) (Limit, error) { return l, nil })
		return newLimiter(t, rdb, s, l, append(opts, f)...)
	}
	var written runner = writtenRunner{}
	if functionsByDefault { // REDLIMIT_TEST_FUNCTIONS=1: every limiter on Redis Functions
		written = functionRunner{}
	}
	return []runnerCase{
		{"written-in script", written, calendarSingleRunner{}, plain},
		{"Redis Function", functionRunner{}, calendarSingleRunner{}, functions},
		{"rules as arguments", argsRunner{}, calendarRunner{}, dynamic},
	}
}

// runnerOf returns the runner that decides key's usual calls on lim: for
// a single rule's specialised script, the one inside specialisedRunner (a
// written-in script's or a Redis Function's, as for the general script).
func runnerOf(t *testing.T, lim *RateLimiter, key string) runner {
	t.Helper()
	rs, err := lim.rulesFor(t.Context(), key)
	require.NoError(t, err)
	if sr, ok := rs.run.(specialisedRunner); ok {
		return sr.one
	}
	return rs.run
}

// pausedClient returns a client of a new redis-server that the test can
// pause (SIGSTOP): a call then times out after 100 ms, and the fallback
// decides (never pinging Redis again during the test).
func pausedClient(t *testing.T) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(redistest.TunedOptions(srv.Addr))
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// Issue 38: a feature is a stage, which every runner's calls pass, so
// that none can be on for one runner and off for another. A key at its
// limit, hourly and daily (a calendar rule: its own runner, whatever the
// options ask), stays limited through a Redis pause whichever runner
// decided it on Redis: before the pipeline, a calendar rule's answers were
// never remembered, and a pause gave a daily quota back in full.
func TestEveryRunnerRemembersAnswersRedis(t *testing.T) {
	srv, rdb := pausedClient(t)
	type limiterCase struct {
		name string
		lim  *RateLimiter
	}
	var lims []limiterCase
	kinds := map[string]bool{}
	for _, rc := range runnerCases() {
		for _, l := range []Limit{PerHour(30), Daily(30, loadZone(t, "America/New_York"))} {
			lim := rc.make(t, rdb, FixedWindow, l, WithPingInterval(time.Hour))
			name := rc.name + "/" + l.String()
			want := reflect.TypeOf(rc.runner)
			if l.isCalendar() {
				want = reflect.TypeOf(rc.calendar)
			}
			run := runnerOf(t, lim, "k")
			require.Equal(t, want, reflect.TypeOf(run), "%s: the runner", name)
			kinds[want.Name()] = true
			lims = append(lims, limiterCase{name, lim})
		}
	}
	want := 5 // written-in, Function, arguments, calendar, a single calendar rule's
	if functionsByDefault {
		want = 4 // the written-in scripts are Functions too
	}
	assert.Len(t, kinds, want, "the runners covered: %v", kinds)
	ctx := t.Context()
	for i, c := range lims {
		res, err := c.lim.AllowN(ctx, fmt.Sprint("k", i), 30)
		require.NoError(t, err, c.name)
		require.True(t, res.Allowed && !res.Degraded, "%s: on Redis: %+v", c.name, res)
	}
	require.NoError(t, srv.Pause())
	defer func() { assert.NoError(t, srv.Resume()) }()
	for i, c := range lims {
		got := 0
		for range 20 {
			res, err := c.lim.Allow(ctx, fmt.Sprint("k", i))
			require.NoError(t, err, c.name)
			require.True(t, res.Degraded, "%s: with Redis paused: %+v", c.name, res)
			got += btoi(res.Allowed)
		}
		assert.Zero(t, got, "%s: admitted in the fallback of a used-up key", c.name)
	}
}

// Issue 38, a second feature: a penalty block that Redis set holds
// through a Redis pause, whichever runner decided, though the key's bucket
// has refilled by then.
func TestEveryRunnerKeepsBlockRedis(t *testing.T) {
	srv, rdb := pausedClient(t)
	fast := Limit{Rate: 50, Period: time.Second, Burst: 5} // refills in 100 ms
	var lims []*RateLimiter
	var names []string
	for _, rc := range runnerCases() {
		lim := rc.make(t, rdb, TokenBucket, fast, WithPingInterval(time.Hour), WithBlock(time.Hour))
		require.IsType(t, rc.runner, runnerOf(t, lim, "k"), rc.name)
		lims, names = append(lims, lim), append(names, rc.name)
	}
	ctx := t.Context()
	for i, lim := range lims {
		key := fmt.Sprint("k", i)
		res, err := lim.AllowN(ctx, key, 5)
		require.NoError(t, err, names[i])
		require.True(t, res.Allowed, "%s: %+v", names[i], res)
		res, err = lim.AllowN(ctx, key, 5) // over the limit: blocked for an hour
		require.NoError(t, err, names[i])
		require.False(t, res.Allowed, "%s: %+v", names[i], res)
	}
	time.Sleep(150 * time.Millisecond) // every bucket refilled
	require.NoError(t, srv.Pause())
	defer func() { assert.NoError(t, srv.Resume()) }()
	for i, lim := range lims {
		res, err := lim.Allow(ctx, fmt.Sprint("k", i))
		require.NoError(t, err, names[i])
		assert.True(t, res.Degraded && !res.Allowed, "%s: blocked key with Redis paused: %+v", names[i], res)
		assert.Greater(t, res.RetryAfter, 59*time.Minute, "%s: the block's RetryAfter", names[i])
	}
}
