package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// startRedis starts a miniredis whose clock stands still at a fixed time,
// and returns it with a client.
func startRedis(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 250_000_000, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	return m, rdb
}

// allowT consumes n events of key with a limiter of s and limit.
func allowT(t *testing.T, rdb *redis.Client, s redlimit.Strategy, limit redlimit.Limit, key string, n int) {
	t.Helper()
	lim, err := redlimit.New(rdb, s, limit)
	require.NoError(t, err)
	defer lim.(*redlimit.RateLimiter).Close()
	res, err := lim.AllowN(context.Background(), key, n)
	require.NoError(t, err, "AllowN(%q, %d) = %+v, %v; want allowed", key, n, res, err)
	require.True(t, res.Allowed, "AllowN(%q, %d) = %+v, %v; want allowed", key, n, res, err)
}

// field returns the value printed after name at the start of a line.
func field(out, name string) string {
	if f := rowOf(out, name); len(f) > 1 {
		return strings.Join(f[1:], " ")
	}
	return ""
}

func TestInspectAndReset(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	const key = "a{b}%c" // escaped in the Redis key
	const state = "redlimit:{a%7Bb%7D%25c}:tb1000000"
	allowT(t, rdb, redlimit.TokenBucket, redlimit.PerSecond(10), key, 3)

	inspectArgs := []string{"inspect", "-redis", m.Addr(), "-strategy", "token-bucket", "-rate", "10", "-period", "1s", key}
	code, stdout, stderr := runT(t, inspectArgs...)
	require.Zero(t, code, "inspect: exit %d, stderr %q", code, stderr)
	for name, want := range map[string]string{
		"key":         `"a{b}%c"`,
		"strategy":    "token-bucket",
		"limit":       "10/1s",
		"allowed":     "true",
		"remaining":   "7",
		"retry-after": "0s",
		"reset-after": "300ms",
		// 3 tokens used (D = 3 × 1s in µs, then the write time in µs): the
		// bucket is full again in 300ms; the key lives one period.
		`"` + state + `"`:               "string 1s 300000006000250000",
		`"` + state + blockSuffix + `"`: "(missing) - -",
	} {
		got := field(stdout, name)
		assert.Equal(t, want, got, "inspect: %s = %q, want %q\n%s", name, got, want, stdout)
	}

	code, stdout, stderr = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", key)
	require.Zero(t, code, "reset: exit %d, stderr %q", code, stderr)
	want := `reset "a{b}%c": deleted "` + state + `"` + "\n"
	assert.Equal(t, want, stdout, "reset: stdout %q, want %q", stdout, want)
	assert.False(t, m.Exists(state), "%s still exists after reset", state)
	_, stdout, _ = runT(t, inspectArgs...)
	got := field(stdout, "remaining")
	want = "10"
	assert.Equal(t, want, got, "inspect after reset: remaining = %q, want %q", got, want)
	_, stdout, _ = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", key)
	want = `reset "a{b}%c": no state in Redis ("` + state + `")` + "\n"
	assert.Equal(t, want, stdout, "second reset: stdout %q, want %q", stdout, want)
}

// TestInspectStrategies checks, for every strategy, that inspect finds the
// key the library writes, and what it shows of it.
func TestInspectStrategies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		strategy  redlimit.Strategy
		state     string
		keyRow    string // type, TTL and value of the state key
		remaining string
		reset     string
	}{
		// Window of [0s, 2s) at 0.25s: the counter expires at its end. Its
		// value is count*10 + the window's last digit (here 0).
		{redlimit.FixedWindow, "p:{u}:fw2000000", "string 1.75s 20", "2", "1.75s"},
		// The log lives a period, an expiry cell (a 64th of it) and a ms
		// after the newest event that set its expiry (see slidinglog.lua).
		{redlimit.SlidingLog, "p:{u}:sl2000000", "zset 2.033s 2 members", "2", "2s"},
		// The counter's two counts are packed in one integer (here c=2, p=0),
		// then the window's last digit.
		{redlimit.SlidingCounter, "p:{u}:sc2000000", "string 3.75s 20", "2", "3.75s"},
		// T = 500ms: 2 events are used, D = 2 × 2s = 4000000 (µs units),
		// written as its digits, an exponent 0 and the write time in µs
		// modulo 1e10, 10 digits; the key lives at least one period.
		{redlimit.TokenBucket, "p:{u}:tb2000000", "string 2s 400000006000250000", "2", "1s"},
		{redlimit.LeakyBucket, "p:{u}:lb2000000", "string 2s 400000006000250000", "2", "1s"},
	}
	for _, tt := range tests {
		t.Run(tt.strategy.String(), func(t *testing.T) {
			t.Parallel()
			m, rdb := startRedis(t)
			limit := redlimit.Limit{Rate: 4, Period: 2 * time.Second}
			lim, err := redlimit.New(rdb, tt.strategy, limit, redlimit.WithPrefix("p"))
			require.NoError(t, err)
			defer lim.(*redlimit.RateLimiter).Close()
			_, err = lim.AllowN(context.Background(), "u", 2)
			require.NoError(t, err)
			code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-strategy", tt.strategy.String(),
				"-rate", "4", "-period", "2s", "-prefix", "p", "u")
			require.Zero(t, code, "exit %d, stderr %q", code, stderr)
			for name, want := range map[string]string{
				`"` + tt.state + `"`: tt.keyRow,
				"remaining":          tt.remaining,
				"reset-after":        tt.reset,
			} {
				got := field(stdout, name)
				assert.Equal(t, want, got, "%s = %q, want %q\n%s", name, got, want, stdout)
			}
		})
	}
}

// TestKeyNamesMatchLibrary checks that inspect and reset name the same
// Redis key as the library for keys around MaxKeyLen, keys whose escaping
// grows them past it, and a huge key: the library writes real state, and
// that state must be the one key stateKey names, found by inspect and
// deleted by reset.
//
// It runs alone, not in parallel, and gives inspect and reset a timeout
// of 5 s, not their 100ms: miniredis under the race detector missed that
// now and then on a busy machine (the test is about names, not time).
func TestKeyNamesMatchLibrary(t *testing.T) {
	const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
	var keys []string
	for n := 1; n <= 300; n++ { // 0 is refused, below
		keys = append(keys, strings.Repeat(alnum, n/len(alnum)+1)[:n])
	}
	// Escaping triples each '{', '}' and '%': from 86 bytes on, these grow
	// past MaxKeyLen, yet only keys longer than MaxKeyLen before escaping
	// are hashed.
	for _, n := range []int{1, 85, 86, 128, 255, 256, 257, 300} {
		for _, s := range []string{"{", "}", "%", "a{b}%"} {
			keys = append(keys, strings.Repeat(s, n)[:n])
		}
	}
	sum := sha256.Sum256([]byte(keys[299])) // the 300-byte key
	keys = append(keys,
		"%h"+hex.EncodeToString(sum[:]), // what that key is hashed to
		strings.Repeat("é", 128),        // 256 bytes
		strings.Repeat("é", 128)+"x",    // 257 bytes
		strings.Repeat("\xff", 257),
		strings.Repeat("x{", 1<<19), // 1 MiB
	)

	m, rdb := startRedis(t)
	strategies := redlimit.Strategies()
	for i, key := range keys {
		s := strategies[i%len(strategies)]
		state := stateKey("redlimit", s, redlimit.PerSecond(1), key)
		hashed := len(key) > redlimit.MaxKeyLen
		assert.Equal(t, hashed, strings.HasPrefix(state, "redlimit:{%h"),
			"%s key of %d bytes: state key %.100q, hashed = %v", s, len(key), state, hashed)

		allowT(t, rdb, s, redlimit.PerSecond(10), key, 1)
		require.Equal(t, []string{state}, m.Keys(),
			"%s key of %d bytes %.100q: the library wrote other keys than stateKey's", s, len(key), key)

		code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-timeout", "5s", "-strategy", s.String(),
			"-rate", "10", "-period", "1s", key)
		require.Zero(t, code, "inspect %s key of %d bytes: exit %d, stderr %.300q", s, len(key), code, stderr)
		row := rowOf(stdout, strconv.Quote(state))
		require.NotEmpty(t, row, "inspect %s key of %d bytes: no row for %.100q", s, len(key), state)
		assert.NotEqual(t, "(missing)", row[1], "inspect %s key of %d bytes: %.100q is missing", s, len(key), state)

		code, stdout, stderr = runT(t, "reset", "-redis", m.Addr(), "-timeout", "5s", "-strategy", s.String(), "-period", "1s", key)
		require.Zero(t, code, "reset %s key of %d bytes: exit %d, stderr %.300q", s, len(key), code, stderr)
		want := "reset " + strconv.Quote(key) + ": deleted " + strconv.Quote(state) + "\n"
		assert.Equal(t, want, stdout, "reset %s key of %d bytes: wrong output", s, len(key))
		require.Empty(t, m.Keys(), "reset %s key of %d bytes: state left in Redis", s, len(key))
	}

	// The empty key has no state: both the library and the tool refuse it.
	lim, err := redlimit.New(rdb, redlimit.TokenBucket, redlimit.PerSecond(10))
	require.NoError(t, err)
	defer lim.(*redlimit.RateLimiter).Close()
	_, err = lim.AllowN(context.Background(), "", 1)
	assert.ErrorIs(t, err, redlimit.ErrInvalidArgument, "library: AllowN of the empty key")
	for _, args := range [][]string{
		{"inspect", "-redis", m.Addr(), "-strategy", "token-bucket", "-rate", "10", "-period", "1s", ""},
		{"reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", ""},
	} {
		code, _, stderr := runT(t, args...)
		first, _, _ := strings.Cut(stderr, "\n")
		assert.Equal(t, 2, code, "%s of the empty key: exit %d, stderr %q", args[0], code, stderr)
		assert.Equal(t, "redlimit: "+args[0]+": empty KEY", first, "%s of the empty key: stderr %q", args[0], stderr)
	}
}

// TestKeysQuoted checks that inspect and reset print keys quoted, so that a
// key with newlines cannot forge lines of output, nor one with a terminal
// escape sequence reach the terminal.
func TestKeysQuoted(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	const key = "user\nallowed  true\nremaining  999\x1b[2J\r"
	const quoted = `"user\nallowed  true\nremaining  999\x1b[2J\r"`
	const state = `"redlimit:{user\nallowed  true\nremaining  999\x1b[2J\r}:tb1000000"`
	allowT(t, rdb, redlimit.TokenBucket, redlimit.PerSecond(10), key, 10)

	code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-strategy", "token-bucket", "-rate", "10", "-period", "1s", key)
	require.Zero(t, code, "inspect: exit %d, stderr %q", code, stderr)
	// The key holds runs of two spaces, which field would squeeze.
	assert.Regexp(t, `(?m)^key +`+regexp.QuoteMeta(quoted)+`\n`, stdout, "inspect: the key is not quoted")
	assert.Equal(t, "0", field(stdout, "remaining"), "inspect: remaining is not 0 (but the key's forged 999?):\n%s", stdout)
	assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(state)+` +string +1s +1000000006000250000\n`, stdout, "inspect: no quoted row of the state key")
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	assert.Len(t, lines, 13, "inspect: want 8 lines of decision, a blank one, a header and 3 Redis keys:\n%s", stdout)
	for _, name := range []string{"allowed", "remaining"} {
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, name+" ") {
				n++
			}
		}
		assert.Equal(t, 1, n, "inspect: %d lines of %s, want 1 (forged by the key?):\n%s", n, name, stdout)
	}
	assert.NotContains(t, stdout, "\x1b", "inspect: an escape sequence reached the output")
	assert.NotContains(t, stdout, "\r", "inspect: a carriage return reached the output")

	code, stdout, stderr = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", key)
	require.Zero(t, code, "reset: exit %d, stderr %q", code, stderr)
	want := "reset " + quoted + ": deleted " + state + "\n"
	assert.Equal(t, want, stdout, "reset: stdout %q, want %q", stdout, want)
	assert.Empty(t, m.Keys(), "reset left state in Redis")
	_, stdout, _ = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", key)
	want = "reset " + quoted + ": no state in Redis (" + state + ")\n"
	assert.Equal(t, want, stdout, "second reset: stdout %q, want %q", stdout, want)

	// An ordinary key stays readable: only the quotes are added, and
	// printable non-ASCII text is kept.
	_, stdout, _ = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", "héllo-1")
	want = `reset "héllo-1": no state in Redis ("redlimit:{héllo-1}:tb1000000")` + "\n"
	assert.Equal(t, want, stdout, "reset of an ordinary key: stdout %q, want %q", stdout, want)
}

// TestInspectBlocked checks that inspect shows a penalty block as the
// limiter that set it reports it: inspect used to decide without the block
// and showed a blocked key as allowed with 2 remaining, while every call
// was denied for 59s more.
func TestInspectBlocked(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	ctx := context.Background()
	limit := redlimit.Limit{Rate: 3, Period: time.Second}
	l, err := redlimit.New(rdb, redlimit.FixedWindow, limit, redlimit.WithBlock(time.Minute))
	require.NoError(t, err)
	lim := l.(*redlimit.RateLimiter)
	defer lim.Close()
	res, err := lim.AllowN(ctx, "blocked", 1)
	require.NoError(t, err)
	require.True(t, res.Allowed, "first call: %+v", res)
	res, err = lim.AllowN(ctx, "blocked", 3) // past the limit: blocks for a minute
	require.NoError(t, err)
	require.False(t, res.Allowed, "second call: %+v", res)
	// One window later: by the limit alone, 3 remain.
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 1, 250_000_000, time.UTC))

	// What the limiter that set the block says now, for n = 0 and n = 1
	// (a call denied by the block writes nothing).
	report, err := lim.AllowN(ctx, "blocked", 0)
	require.NoError(t, err)
	denied, err := lim.AllowN(ctx, "blocked", 1)
	require.NoError(t, err)
	require.False(t, denied.Allowed, "a blocked call: %+v", denied)
	require.Equal(t, 59*time.Second, denied.RetryAfter, "a blocked call: %+v", denied)

	code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-strategy", "fixed-window", "-rate", "3", "-period", "1s", "blocked")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	const state = "redlimit:{blocked}:fw1000000"
	for name, want := range map[string]string{
		"allowed":     strconv.FormatBool(report.Allowed), // n = 0 is never denied
		"remaining":   strconv.Itoa(report.Remaining),     // 0
		"retry-after": report.RetryAfter.String(),         // 0s
		"reset-after": report.ResetAfter.String(),         // 59s
		"blocked":     denied.RetryAfter.String(),         // 59s
		// The block's end in µs on the server's clock; it lives a minute.
		`"` + state + blockSuffix + `"`: "string 59s 1893456060250000",
	} {
		got := field(stdout, name)
		assert.Equal(t, want, got, "%s = %q, want %q\n%s", name, got, want, stdout)
	}
	assert.Equal(t, "0", field(stdout, "remaining"), "remaining of a blocked key\n%s", stdout)

	// Without the block, the limit decides; and blocked says no.
	m.SetTime(time.Date(2030, 1, 1, 0, 1, 1, 250_000_000, time.UTC))
	code, stdout, stderr = runT(t, "inspect", "-redis", m.Addr(), "-strategy", "fixed-window", "-rate", "3", "-period", "1s", "blocked")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	for name, want := range map[string]string{
		"allowed":                       "true",
		"remaining":                     "3",
		"blocked":                       "no",
		`"` + state + blockSuffix + `"`: "(missing) - -",
	} {
		got := field(stdout, name)
		assert.Equal(t, want, got, "after the block: %s = %q, want %q\n%s", name, got, want, stdout)
	}
}

// TestInspectResetReservations checks that inspect lists, and reset
// reports, the sorted set of a key's pending reservations (":r" after the
// state key), which the limiter's Reset deletes: both named only the state
// and the block, and reset deleted the reservations without saying so.
func TestInspectResetReservations(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	ctx := context.Background()
	l, err := redlimit.New(rdb, redlimit.TokenBucket, redlimit.PerSecond(10))
	require.NoError(t, err)
	lim := l.(*redlimit.RateLimiter)
	defer lim.Close()
	r, err := lim.Reserve(ctx, "u", 4)
	require.NoError(t, err)
	require.True(t, r.Result().Allowed, "Reserve: %+v", r.Result())
	const state = "redlimit:{u}:tb1000000"
	require.ElementsMatch(t, []string{state, state + reserveSuffix}, m.Keys(), "keys the library wrote")

	code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-strategy", "token-bucket", "-rate", "10", "-period", "1s", "u")
	require.Zero(t, code, "inspect: exit %d, stderr %q", code, stderr)
	assert.Equal(t, "6", field(stdout, "remaining"), "inspect:\n%s", stdout)
	row := rowOf(stdout, strconv.Quote(state+reserveSuffix))
	require.Len(t, row, 5, "inspect: no row for the reservations:\n%s", stdout)
	assert.Equal(t, []string{"zset", "1", "members"}, []string{row[1], row[3], row[4]}, "inspect: the reservations' row:\n%s", stdout)

	code, stdout, stderr = runT(t, "reset", "-redis", m.Addr(), "-strategy", "token-bucket", "-period", "1s", "u")
	require.Zero(t, code, "reset: exit %d, stderr %q", code, stderr)
	want := `reset "u": deleted "` + state + `", "` + state + reserveSuffix + `"` + "\n"
	assert.Equal(t, want, stdout, "reset: stdout %q, want %q", stdout, want)
	assert.Empty(t, m.Keys(), "reset left keys in Redis")
	_, err = r.Settle(ctx, 1)
	assert.ErrorIs(t, err, redlimit.ErrSettled, "Settle after reset")

	// The help names the reservations among the keys.
	for _, cmd := range []string{"inspect", "reset"} {
		code, stdout, _ := runT(t, "help", cmd)
		require.Zero(t, code)
		assert.Contains(t, stdout, "pending reservations", "help %s:\n%s", cmd, stdout)
	}
	_, stdout, _ = runT(t, "help", "inspect")
	assert.Contains(t, stdout, "<prefix>:{<KEY>}:<code><period in µs>:r   the pending reservations", "help inspect:\n%s", stdout)
}

// TestInspectPolicyAndConcurrency inspects and resets a Policy's key (all
// its rules at once) and a Concurrency's key (its holders) on miniredis,
// whose clock stands still, so that every figure is exact. (-timeout 5s:
// miniredis parses each script on every call, which took more than the
// default 100ms with -race on a loaded machine.)
func TestInspectPolicyAndConcurrency(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	testInspectPolicyAndConcurrency(t, m.Addr(), rdb, true)
}

// TestInspectPolicyAndConcurrencyRedis does the same on a real Redis,
// whose clock runs: figures that move with it are matched loosely.
func TestInspectPolicyAndConcurrencyRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	testInspectPolicyAndConcurrency(t, s.Addr, rdb, false)
}

func testInspectPolicyAndConcurrency(t *testing.T, addr string, rdb *redis.Client, exact bool) {
	ctx := context.Background()
	const key = "tenant:1"
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.FixedWindow, Limit: redlimit.PerMinute(1000)},
		{Name: "tokens", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100)},
	})
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	res, err := pol.AllowN(ctx, key, 30)
	require.NoError(t, err)
	require.True(t, res.Allowed)

	rules := []string{"-rule", "requests=fixed-window:1000/1m", "-rule", "tokens=token-bucket:100/1m"}
	code, stdout, stderr := runT(t, append(append([]string{"inspect", "-timeout", "5s", "-redis", addr}, rules...), key)...)
	require.Zero(t, code, "inspect: exit %d, stderr %q", code, stderr)
	fw := "redlimit:{tenant:1}:fw60000000"
	tb := "redlimit:{tenant:1}:tb60000000"
	want := map[string]string{
		"key":       `"tenant:1"`,
		"policy":    "2 rules",
		"allowed":   "true",
		"remaining": "70 (rule tokens)",
		"blocked":   "no",
		// The clock stands at 0.25s past a minute: the window ends in 59.75s.
		"requests": "fixed-window 1000/1m0s 30 of 1000 counted in this window, which ends in 59.75s",
		// 30 tokens at 100 a minute come back in 18s.
		"tokens":                       "token-bucket 100/1m0s 30 of 100 tokens used, 70 left; full in 18s",
		`"` + fw + `:b"`:               "(missing) - -",
		`"` + tb + reserveSuffix + `"`: "(missing) - -",
	}
	// Real Redis: the bucket refills and the window moves on as the test
	// runs.
	loose := map[string]string{
		"remaining": `7\d \(rule tokens\)`,
		"requests":  `fixed-window 1000/1m0s 30 of 1000 counted in this window, which ends in [\d.]+m?s`,
		"tokens":    `token-bucket 100/1m0s (30 of 100 tokens used, 70|29 of 100 tokens used, 71) left; full in 1[78][\d.]*m?s`,
	}
	for name, w := range want {
		if l, ok := loose[name]; ok && !exact {
			w = l
		} else {
			w = regexp.QuoteMeta(w)
		}
		got := field(stdout, name)
		assert.Regexp(t, "^"+w+"$", got, "inspect: %s = %q, want %q\n%s", name, got, w, stdout)
	}
	assert.Regexp(t, `(?m)^"`+regexp.QuoteMeta(fw)+`"\s+string\s`, stdout, "the fixed window's key\n%s", stdout)
	assert.Regexp(t, `(?m)^"`+regexp.QuoteMeta(tb)+`"\s+string\s`, stdout, "the token bucket's key\n%s", stdout)

	code, stdout, stderr = runT(t, append(append([]string{"reset", "-timeout", "5s", "-redis", addr}, rules...), key)...)
	require.Zero(t, code, "reset: exit %d, stderr %q", code, stderr)
	assert.Equal(t, `reset "tenant:1": deleted "`+fw+`", "`+tb+`"`+"\n", stdout)
	res, err = pol.AllowN(ctx, key, 0)
	require.NoError(t, err)
	assert.Equal(t, 100, res.Remaining, "after reset: %+v", res)

	// A concurrency cap of 3 with a 10s ttl: two holders.
	conc, err := redlimit.NewConcurrency(rdb, 3, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conc.Close() })
	for range 2 {
		_, res, err := conc.TryAcquire(ctx, key)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	code, stdout, stderr = runT(t, "inspect", "-timeout", "5s", "-redis", addr, "-concurrency", "-max", "3", key)
	require.Zero(t, code, "inspect -concurrency: exit %d, stderr %q", code, stderr)
	assert.Equal(t, "2 leases held, 1 of 3 slots free", field(stdout, "leases"), "%s", stdout)
	assert.Equal(t, `in "redlimit:{tenant:1}:cc"`, field(stdout, "stored"), "%s", stdout)
	expires := `in 10s`
	if !exact {
		expires = `in (10s|9\.\d+s)`
	}
	holders := regexp.MustCompile(`(?m)^"[0-9a-f]{16}"\s+`+expires+`$`).FindAllString(stdout, -1)
	assert.Len(t, holders, 2, "two holders, by lease id, expiring %s:\n%s", expires, stdout)

	code, stdout, stderr = runT(t, "reset", "-timeout", "5s", "-redis", addr, "-concurrency", key)
	require.Zero(t, code, "reset -concurrency: exit %d, stderr %q", code, stderr)
	assert.Equal(t, `reset "tenant:1": deleted "redlimit:{tenant:1}:cc"`+"\n", stdout)
	_, stdout, _ = runT(t, "inspect", "-timeout", "5s", "-redis", addr, "-concurrency", "-max", "3", key)
	assert.Equal(t, "0 leases held, 3 of 3 slots free", field(stdout, "leases"), "%s", stdout)

	// Flags that do not go together.
	for _, args := range [][]string{
		{"inspect", "-timeout", "5s", "-redis", addr, "-concurrency", "-rule", "a=token-bucket:1/1s", key},
		{"inspect", "-timeout", "5s", "-redis", addr, "-concurrency", "-strategy", "token-bucket", key},
		{"inspect", "-timeout", "5s", "-redis", addr, "-rule", "a=token-bucket", key},
		{"inspect", "-timeout", "5s", "-redis", addr, "-max", "3", "-strategy", "token-bucket", "-rate", "1", "-period", "1s", key},
	} {
		code, _, stderr := runT(t, args...)
		assert.Equal(t, 2, code, "%q: exit %d, stderr %q; want a usage error", args, code, stderr)
	}
}

// A sub-window counter's state key names its sub-windows (-subwindows, or
// a -rule's third part); its state is a hash: c, the events that count
// (2) × 4096 plus the newest sub-window's index modulo 4096 (sub-windows
// of 500 ms since the epoch: 3786912000, so 256), and o, the oldest.
func TestInspectSubWindowCounter(t *testing.T) {
	t.Parallel()
	m, rdb := startRedis(t)
	limit := redlimit.Limit{Rate: 4, Period: 2 * time.Second, SubWindows: 4}
	lim, err := redlimit.NewSubWindowCounter(rdb, limit, redlimit.WithPrefix("p"))
	require.NoError(t, err)
	defer lim.Close()
	_, err = lim.AllowN(context.Background(), "u", 2)
	require.NoError(t, err)
	code, stdout, stderr := runT(t, "inspect", "-redis", m.Addr(), "-strategy", "sub-window-counter",
		"-rate", "4", "-period", "2s", "-subwindows", "4", "-prefix", "p", "u")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	for name, want := range map[string]string{
		`"p:{u}:sw2000000x4"`: "hash 2.25s c=8448 o=3786912000",
		"remaining":           "2",
		"reset-after":         "2.25s", // sub-window 0 ends at 0.5s, and counts 2s more
	} {
		got := field(stdout, name)
		assert.Equal(t, want, got, "%s = %q, want %q\n%s", name, got, want, stdout)
	}
	code, stdout, stderr = runT(t, "inspect", "-redis", m.Addr(), "-rule", "w=sub-window-counter:4/2s:4", "-prefix", "p", "u")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	assert.Contains(t, stdout, "2 of 4 counted in the last 2s and up to one sub-window (of 4) before; full in 2.25s", stdout)
	code, stdout, stderr = runT(t, "reset", "-redis", m.Addr(), "-strategy", "sub-window-counter", "-period", "2s", "-subwindows", "4", "-prefix", "p", "u")
	require.Zero(t, code, "exit %d, stderr %q", code, stderr)
	assert.Contains(t, stdout, `deleted "p:{u}:sw2000000x4"`)
	assert.False(t, m.Exists("p:{u}:sw2000000x4"))
}
