package redlimit

import (
	"context"
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Four instances, each on its own client with a fallback share of 1/4,
// drive one key per strategy to its limit of 100 a minute on Redis; Redis
// is SIGKILLed and the same traffic goes on. In the outage's first second
// the stand-ins start from what Redis last said (the key used up): the
// fleet admits about what the limit refills in that second (100/60 per
// key), not the four stand-ins' full shares (4 × 25 = 100 a key when they
// started full). The bound is what the stand-ins refill since the last
// answers, plus the shares' rounding.
func TestFallbackRemembersRedis(t *testing.T) {
	const instances, perKey = 4, 100
	srv := redistest.Start(t)
	strategies := Strategies()
	lims := make([][]*RateLimiter, instances)
	for i := range lims {
		opt := redistest.TunedOptions(srv.Addr)
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { rdb.Close() })
		for _, s := range strategies {
			lims[i] = append(lims[i], newLimiter(t, rdb, s, PerMinute(perKey),
				WithFallbackShare(1.0/instances), WithPingInterval(time.Hour)))
		}
	}
	ctx := context.Background()
	// On Redis: every instance calls every key until it has seen three
	// denials of it in a row.
	var driven [len(algorithms)]time.Time // when each key was last answered on Redis
	for j, s := range strategies {
		var admitted int
		for i := range lims {
			for denied := 0; denied < 3; {
				res, err := lims[i][j].Allow(ctx, "k")
				require.NoError(t, err, "%v on Redis", s)
				require.False(t, res.Degraded, "%v on Redis: %+v", s, res)
				if res.Allowed {
					admitted++
					denied = 0
				} else {
					denied++
				}
			}
		}
		require.Equal(t, perKey, admitted, "%v: admitted on Redis", s)
		driven[j] = time.Now()
	}
	require.NoError(t, srv.Kill())
	killed := time.Now()
	// The same traffic, for one second of outage: each instance calls
	// every key every 2 ms.
	var admitted [len(algorithms)]atomic.Int64
	var calls, degraded atomic.Int64
	var wg sync.WaitGroup
	for i := range lims {
		wg.Go(func() {
			for time.Since(killed) < time.Second {
				for j := range strategies {
					res, err := lims[i][j].Allow(ctx, "k")
					if !assert.NoError(t, err) {
						return
					}
					calls.Add(1)
					if res.Degraded {
						degraded.Add(1)
					}
					if res.Allowed {
						admitted[j].Add(1)
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	require.Positive(t, degraded.Load(), "no call was answered by the fallback")
	for j, s := range strategies {
		// What the stand-ins refill since the key's last answers (as
		// Redis's bucket would): 100/60 a second for the fleet, about 3
		// on a quiet machine; plus one for each instance's rounding.
		since := time.Since(driven[j])
		bound := int64(math.Ceil(perKey/60.0*since.Seconds())) + instances
		got := admitted[j].Load()
		t.Logf("%v: %d admitted by the fleet in the outage's first second (%d calls; %v since the key's last answer: at most %d)",
			s, got, calls.Load(), since.Round(time.Millisecond), bound)
		assert.LessOrEqual(t, got, bound, "%v: admitted %d of a key at its limit in the outage's first second, want at most %d", s, got, bound)
	}
}

// answersBackend is a miniredis whose clock stands at t0 (so windows start
// there), and a client that reaches it even on a busy machine.
func answersBackend(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	m.SetTime(t0)
	opt := redistest.TunedOptions(m.Addr())
	opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return m, rdb
}

// allowUntil calls Allow for key on lim (on Redis) until it has been
// admitted admit times, and then, if deny, once more to see it denied.
func allowUntil(t *testing.T, lim Limiter, key string, admit int, deny bool) {
	t.Helper()
	ctx := context.Background()
	for i := range admit {
		res, err := lim.Allow(ctx, key)
		require.NoError(t, err)
		require.True(t, res.Allowed && !res.Degraded, "call %d on Redis: %+v", i, res)
	}
	if deny {
		res, err := lim.Allow(ctx, key)
		require.NoError(t, err)
		require.False(t, res.Allowed || res.Degraded, "call %d on Redis: %+v", admit, res)
	}
}

// countAdmitted calls Allow for key calls times with Redis down, and
// returns how many were admitted: all of them from the fallback.
func countAdmitted(t *testing.T, lim Limiter, key string, calls int) int {
	t.Helper()
	admitted := 0
	for i := range calls {
		res, err := lim.Allow(context.Background(), key)
		require.NoError(t, err)
		require.True(t, res.Degraded, "call %d with Redis down: %+v", i, res)
		if res.Allowed {
			admitted++
		}
	}
	return admitted
}

// For every strategy, a key's stand-in starts from Redis's last answer:
// its remaining allowance, scaled to the share. Keys that Redis never
// answered start full. (With the stand-ins started full, every case
// admitted the whole share.)
func TestFallbackStartsFromAnswer(t *testing.T) {
	for _, s := range Strategies() {
		for _, c := range []struct {
			share      float64
			used, want int // of 10 a minute on Redis; admitted in fallback
		}{
			{1, 10, 0},  // at its limit: stays limited
			{1, 6, 4},   // 4 left
			{0.5, 6, 2}, // 4 left, half of them this instance's
			{0.5, 0, 5}, // never asked: the full share
		} {
			t.Run(fmt.Sprintf("%v/share=%v/used=%d", s, c.share, c.used), func(t *testing.T) {
				m, rdb := answersBackend(t)
				lim := newLimiter(t, rdb, s, PerMinute(10), WithFallbackShare(c.share), WithPingInterval(time.Hour))
				allowUntil(t, lim, "k", c.used, c.used == 10)
				m.Close()
				if got := countAdmitted(t, lim, "k", 12); got != c.want {
					t.Errorf("admitted %d in fallback, want %d", got, c.want)
				}
			})
		}
	}
}

// A Policy remembers per rule: the rule that decided Redis's last answer
// starts from it, so a key at the limit of either rule stays limited, and
// the fallback's denial names that rule.
func TestFallbackStartsFromAnswerPolicy(t *testing.T) {
	for _, limited := range []string{"minute", "hour"} {
		t.Run(limited, func(t *testing.T) {
			m, rdb := answersBackend(t)
			minute, hour := 3, 50
			if limited == "hour" {
				minute, hour = 50, 3
			}
			p := newPolicy(t, rdb, []Rule{
				{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(minute)},
				{Name: "hour", Strategy: SlidingLog, Limit: PerHour(hour)},
			}, WithPingInterval(time.Hour))
			allowUntil(t, p, "k", 3, true)
			m.Close()
			res, err := p.Allow(context.Background(), "k")
			require.NoError(t, err)
			require.True(t, res.Degraded, "%+v", res)
			require.False(t, res.Allowed, "a key at its %s limit admitted in fallback: %+v", limited, res)
			require.Equal(t, limited, res.Rule, "the denying rule: %+v", res)
		})
	}
}

// A Reset forgets what Redis said of the key: its stand-in starts full.
func TestFallbackAnswerReset(t *testing.T) {
	m, rdb := answersBackend(t)
	lim := newLimiter(t, rdb, TokenBucket, PerMinute(3), WithPingInterval(time.Hour))
	allowUntil(t, lim, "k", 3, true)
	require.NoError(t, lim.Reset(context.Background(), "k"))
	m.Close()
	if got := countAdmitted(t, lim, "k", 5); got != 3 {
		t.Errorf("admitted %d in fallback after a Reset, want 3", got)
	}
}

// Whatever keys arrive, the answers kept are at most as many as
// WithFallbackKeys: a flood of new keys takes no more, and a key Redis
// answered last is still found.
func TestFallbackAnswersBounded(t *testing.T) {
	m, rdb := answersBackend(t)
	lim := newLimiter(t, rdb, FixedWindow, PerMinute(3), WithFallbackKeys(16), WithPingInterval(time.Hour))
	a := lim.rescue.answers
	ctx := context.Background()
	for i := range 500 {
		_, err := lim.Allow(ctx, "flood:"+strconv.Itoa(i))
		require.NoError(t, err)
	}
	allowUntil(t, lim, "k", 3, true)
	held := a.Len()
	t.Logf("%d answers held after 501 keys", held)
	require.LessOrEqual(t, held, 16, "answers held")
	m.Close()
	if got := countAdmitted(t, lim, "k", 3); got != 0 {
		t.Errorf("admitted %d of the key Redis denied last, want 0", got)
	}
}

// noteAnswer notes what a reply says of each rule: a single rule's
// Remaining; each rule's left before the call, less what an admitted call
// took (0 at least); not a rule found full, one with a warm-up, nor a
// block's answer.
func TestNoteAnswer(t *testing.T) {
	one := newRuleSet([]rule{mustRule(t, FixedWindow, PerMinute(10))})
	fw := mustRule(t, FixedWindow, PerMinute(10))
	fw.name = "minute"
	hour := mustRule(t, FixedWindow, PerHour(100))
	hour.name = "hour"
	warm := mustRule(t, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 10, WarmUp: time.Minute})
	warm.name = "warm"
	three := newRuleSet([]rule{fw, hour, warm})
	const none = -1 // nothing noted
	for _, c := range []struct {
		name string
		rs   *ruleSet
		n    int
		res  Result
		ra   ruleAnswers
		want []int64 // each rule's Remaining noted
	}{
		{"one rule", one, 1, Result{Allowed: true, Remaining: 2}, ruleAnswers{}, []int64{2}},
		{"one rule, full", one, 0, Result{Allowed: true, Remaining: 10}, ruleAnswers{}, []int64{none}},
		{"a block's", one, 1, Result{Remaining: 2}, ruleAnswers{none: true}, []int64{none}},
		{"rules, allowed", three, 2, Result{Allowed: true, Remaining: 3}, ruleAnswers{left: [MaxRules]int64{5, 100, 3}, has: true}, []int64{3, 98, none}},
		{"rules, denied", three, 2, Result{Remaining: 5}, ruleAnswers{left: [MaxRules]int64{5, 100, 3}, has: true}, []int64{5, none, none}},
		{"rules, taken past", three, 2, Result{Allowed: true}, ruleAnswers{left: [MaxRules]int64{1, 1, 1}, has: true}, []int64{0, 0, none}},
		{"rules, Remaining only", three, 1, Result{Allowed: true, Remaining: 4}, ruleAnswers{}, []int64{4, none, none}},
	} {
		a := newAnswers(100)
		now := monoNow()
		noteAnswer(a, "k", c.rs, c.n, &c.res, &c.ra, now)
		for i, want := range c.want {
			v, ok := a.Get(a.Hash("k"), i, c.rs.sig, now)
			got := int64(none)
			if ok {
				got = v.Remaining
			}
			if got != want {
				t.Errorf("%s: rule %d noted %d, want %d (-1: none)", c.name, i, got, want)
			}
		}
	}
}

func mustRule(t testing.TB, s Strategy, l Limit) rule {
	t.Helper()
	alg, ok := algorithmOf(s)
	require.True(t, ok)
	r, err := newRule("", alg, l)
	require.NoError(t, err)
	return r
}

// Noting an answer about a key already noted allocates nothing.
func TestAnswersNoteAllocs(t *testing.T) {
	a := newAnswers(100_000)
	rs := newRuleSet([]rule{mustRule(t, TokenBucket, PerSecond(10))})
	res := Result{Allowed: true, Remaining: 3, ResetAfter: time.Second}
	state := "redlimit:{user:12345}:tb1000000"
	var ra ruleAnswers
	if got := testing.AllocsPerRun(1000, func() { noteAnswer(a, state, rs, 1, &res, &ra, monoNow()) }); got != 0 {
		t.Errorf("note: %v allocations, want 0", got)
	}
}

// BenchmarkAnswersNote is what a decision on Redis adds for the fallback's
// memory (compare BenchmarkDecisionOverhead).
func BenchmarkAnswersNote(b *testing.B) {
	a := newAnswers(100_000)
	rs := newRuleSet([]rule{mustRule(b, TokenBucket, PerSecond(10))})
	res := Result{Allowed: true, Remaining: 3, ResetAfter: time.Second}
	state := "redlimit:{user:12345}:tb1000000"
	var ra ruleAnswers
	b.ReportAllocs()
	for b.Loop() {
		noteAnswer(a, state, rs, 1, &res, &ra, monoNow())
	}
}

// BenchmarkAnswersNoteKeys notes answers about 5,000 keys in turn, each
// already noted.
func BenchmarkAnswersNoteKeys(b *testing.B) {
	a := newAnswers(100_000)
	rs := newRuleSet([]rule{mustRule(b, TokenBucket, PerSecond(10))})
	res := Result{Allowed: true, Remaining: 3, ResetAfter: time.Second}
	states := make([]string, 5000)
	for i := range states {
		states[i] = "redlimit:{user:" + strconv.Itoa(i) + "}:tb1000000"
	}
	var ra ruleAnswers
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		noteAnswer(a, states[i], rs, 1, &res, &ra, monoNow())
		if i++; i == len(states) {
			i = 0
		}
	}
}

// A key that Redis blocked (WithBlock) keeps its block in the fallback,
// and once the block ends its stand-in is still the one Redis's answer
// made (at its limit), not the full one the block's bookkeeping started
// it with: it admitted 2 then.
func TestFallbackAnswerAfterBlock(t *testing.T) {
	const block = 50 * time.Millisecond
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			m, rdb := answersBackend(t)
			lim := newLimiter(t, rdb, s, PerMinute(2), WithBlock(block), WithPingInterval(time.Hour))
			allowUntil(t, lim, "k", 2, true)
			m.Close()
			start := time.Now()
			res, err := lim.Allow(context.Background(), "k")
			require.NoError(t, err)
			require.True(t, res.Degraded && !res.Allowed, "blocked: %+v", res)
			time.Sleep(block + 10*time.Millisecond - time.Since(start)) // the fallback's block is timed by the wall clock
			if got := countAdmitted(t, lim, "k", 3); got != 0 {
				t.Errorf("admitted %d after the block, want 0", got)
			}
		})
	}
}

// A stand-in made before Redis's last answer (here by a block's
// bookkeeping, at a denial) starts from that last answer when the node
// goes down: the key, refilled on Redis an hour later and called once
// there, has 1 of 2 left.
func TestFallbackAnswerLatest(t *testing.T) {
	const block = 50 * time.Millisecond
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			m, rdb := answersBackend(t)
			lim := newLimiter(t, rdb, s, PerMinute(2), WithBlock(block), WithPingInterval(time.Hour))
			allowUntil(t, lim, "k", 2, true)
			start := time.Now()
			m.SetTime(t0.Add(time.Hour))
			allowUntil(t, lim, "k", 1, false)
			time.Sleep(block + 10*time.Millisecond - time.Since(start)) // the fallback's block is timed by the wall clock
			m.Close()
			if got := countAdmitted(t, lim, "k", 3); got != 1 {
				t.Errorf("admitted %d, want 1", got)
			}
		})
	}
}

// rememberCase is a limiter driven on Redis, then asked with Redis gone:
// the fallback must admit no more than Redis's answers left.
type rememberCase struct {
	name  string
	make  func(t *testing.T, rdb redis.UniversalClient) Limiter
	drive int // events taken on Redis, in one AllowN
	want  int // admitted in the fallback, Redis's answers remembered
}

// rememberCases: calendar quotas (a limiter and a Policy) and policies
// whose last answer was decided by another rule than the one that holds
// the fewest events left for later (a bucket that refills in
// milliseconds beside an hourly or daily quota). Before every answer's
// rule was noted, each case admitted its whole quota again. opts are the
// limiters' options.
func rememberCases(opts ...Option) []rememberCase {
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	fast := Limit{Rate: 1000, Period: time.Second, Burst: 30} // refills one event a millisecond
	policy := func(rules ...Rule) func(t *testing.T, rdb redis.UniversalClient) Limiter {
		return func(t *testing.T, rdb redis.UniversalClient) Limiter { return newPolicy(t, rdb, rules, opts...) }
	}
	limiter := func(s Strategy, l Limit) func(t *testing.T, rdb redis.UniversalClient) Limiter {
		return func(t *testing.T, rdb redis.UniversalClient) Limiter { return newLimiter(t, rdb, s, l, opts...) }
	}
	return []rememberCase{
		{"daily used up", limiter(FixedWindow, Daily(30, nil)), 30, 0},
		{"daily Tokyo 10 left", limiter(FixedWindow, Daily(1000, tokyo)), 990, 10},
		{"policy bucket and daily, used up", policy(
			Rule{Name: "rps", Strategy: TokenBucket, Limit: fast},
			Rule{Name: "daily", Strategy: FixedWindow, Limit: Daily(30, nil)}), 30, 0},
		{"policy bucket and daily, 10 left", policy(
			Rule{Name: "rps", Strategy: TokenBucket, Limit: Limit{Rate: 1000, Period: time.Second, Burst: 20}},
			Rule{Name: "daily", Strategy: FixedWindow, Limit: Daily(30, nil)}), 20, 10},
		{"policy bucket and hour, used up", policy(
			Rule{Name: "burst", Strategy: TokenBucket, Limit: fast},
			Rule{Name: "hour", Strategy: FixedWindow, Limit: PerHour(30)}), 30, 0},
		{"policy bucket and hour, 10 left", policy(
			Rule{Name: "burst", Strategy: TokenBucket, Limit: Limit{Rate: 1000, Period: time.Second, Burst: 20}},
			Rule{Name: "hour", Strategy: SlidingLog, Limit: PerHour(30)}), 20, 10},
	}
}

// admittedFor calls Allow for key on lim every millisecond for d, with
// Redis gone, and returns how many calls were admitted (all from the
// fallback): the buckets beside the quotas refill in that time.
func admittedFor(t *testing.T, lim Limiter, key string, d time.Duration) int {
	t.Helper()
	admitted := 0
	for start := time.Now(); time.Since(start) < d; time.Sleep(time.Millisecond) {
		res, err := lim.Allow(context.Background(), key)
		require.NoError(t, err)
		require.True(t, res.Degraded, "with Redis down: %+v", res)
		admitted += btoi(res.Allowed)
	}
	return admitted
}

// testRemembersEveryRule drives each case's key on Redis (rdb), has
// Redis killed (kill), and counts what the fallback admits in 200 ms.
func testRemembersEveryRule(t *testing.T, rdb redis.UniversalClient, kill func()) {
	cases := rememberCases(WithPingInterval(time.Hour))
	lims := make([]Limiter, len(cases))
	ctx := context.Background()
	for i, c := range cases {
		lims[i] = c.make(t, rdb)
		res, err := lims[i].AllowN(ctx, "k"+strconv.Itoa(i), c.drive)
		require.NoError(t, err, c.name)
		require.True(t, res.Allowed && !res.Degraded, "%s: on Redis: %+v", c.name, res)
	}
	kill()
	for i, c := range cases {
		got := admittedFor(t, lims[i], "k"+strconv.Itoa(i), 200*time.Millisecond)
		t.Logf("%s: %d admitted in the fallback, want %d", c.name, got, c.want)
		assert.Equal(t, c.want, got, "%s: admitted in the fallback", c.name)
	}
}

// Issue 36 items 1 and 2: every rule's last answer bounds its stand-in,
// calendar quotas included.
func TestFallbackRemembersEveryRule(t *testing.T) {
	m, rdb := answersBackend(t)
	testRemembersEveryRule(t, rdb, m.Close)
}

func TestFallbackRemembersEveryRuleRedis(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // hourly windows, on a real clock
	srv := redistest.Start(t)
	opt := redistest.TunedOptions(srv.Addr)
	opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	testRemembersEveryRule(t, rdb, func() { require.NoError(t, srv.Kill()) })
}

// Issue 36 items 1 and 2 in a Redis Cluster failover: keys of the
// failing master used up on Redis (a Daily quota alone, and each beside a
// bucket that refills in milliseconds, as the rule that decided the last
// answer) stay used up while the slot fails over and after: before, each
// key admitted its quota again (60 of 30).
func TestClusterFailoverRemembersEveryRule(t *testing.T) {
	c, err := redistest.StartCluster(3, 1)
	redistest.SkipOrFail(t, err)
	defer c.Close()
	rdb := clusterClient(t, c, 0)
	clearOfHourEdge(t, 30*time.Second)
	var cases []rememberCase
	for _, rc := range rememberCases() { // probed every 100 ms, back once the replica is promoted
		if rc.want == 0 { // used up: Redis, back, admits no more either
			cases = append(cases, rc)
		}
	}
	lims := make([]Limiter, len(cases))
	for i, rc := range cases {
		lims[i] = rc.make(t, rdb)
	}
	// Keys of one master: the first's slot owner.
	state := func(i int, key string) string {
		var e *engine
		switch l := lims[i].(type) {
		case *RateLimiter:
			e = &l.engine
		case *Policy:
			e = &l.engine
		}
		return e.stateKey(key, &e.own.rules[0])
	}
	master, err := c.MasterOf(redistest.Slot(state(0, "0-key0")))
	require.NoError(t, err)
	const keysPer = 8
	keys := make([][]string, len(cases)) // each case's own: some share a rule's state
	for i := range cases {
		for j := 0; len(keys[i]) < keysPer; j++ {
			key := strconv.Itoa(i) + "-key" + strconv.Itoa(j)
			if m, err := c.MasterOf(redistest.Slot(state(i, key))); err == nil && m == master {
				keys[i] = append(keys[i], key)
			}
		}
	}
	ctx := context.Background()
	for i, rc := range cases {
		for _, key := range keys[i] {
			res, err := lims[i].AllowN(ctx, key, rc.drive)
			require.NoError(t, err, rc.name)
			require.True(t, res.Allowed && !res.Degraded, "%s %s: on Redis: %+v", rc.name, key, res)
		}
	}
	_, err = master.CLI("WAIT", "1", "2000") // the replica has every count
	require.NoError(t, err)
	require.NoError(t, master.Kill())
	// Every key called every 2 ms until the slot answers on Redis again
	// and 200 ms more, or 20 s (it took 5 s on a loaded machine).
	admitted := make([]int, len(cases))
	var degraded int
	killed := time.Now()
	deadline := killed.Add(20 * time.Second)
	var backAt time.Time
	for time.Now().Before(deadline) && (backAt.IsZero() || time.Since(backAt) < 200*time.Millisecond) {
		onRedis := true
		for i := range cases {
			for _, key := range keys[i] {
				res, err := lims[i].Allow(ctx, key)
				require.NoError(t, err, "%s %s", cases[i].name, key)
				admitted[i] += btoi(res.Allowed)
				if res.Degraded {
					degraded++
					onRedis = false
				}
			}
		}
		if onRedis && backAt.IsZero() {
			backAt = time.Now()
		}
		time.Sleep(2 * time.Millisecond)
	}
	require.Positive(t, degraded, "no call was answered by the fallback")
	if backAt.IsZero() {
		t.Logf("not back on Redis 20 s after the kill: the fallback's decisions only")
	} else {
		t.Logf("back on Redis %v after the kill", backAt.Sub(killed).Round(time.Millisecond))
	}
	for i, rc := range cases {
		t.Logf("%s: %d admitted over %d keys used up, during the failover and after (%d fallback decisions in all)", rc.name, admitted[i], keysPer, degraded)
		assert.Zero(t, admitted[i], "%s: admitted %d over %d keys used up", rc.name, admitted[i], keysPer)
	}
}

// Issue 36 item 3: a call in flight when its node is marked down brings
// Redis's answer back later; the stand-in, which has admitted meanwhile,
// may only be lowered by it: before, it restarted from the late answer
// and admitted that again (100/h with 50 left: 50 + 10 in flight + 50 +
// 40 = 150).
func TestFallbackLateAnswer(t *testing.T) {
	m := miniredis.RunT(t)
	testLateAnswer(t, m.Addr())
}

func TestFallbackLateAnswerRedis(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // an hourly window, on a real clock
	testLateAnswer(t, redistest.Start(t).Addr)
}

func testLateAnswer(t *testing.T, addr string) {
	const inFlight = 10
	proxy := redistest.NewProxy(t, addr)
	var refuse atomic.Bool
	opt := redistest.TunedOptions(proxy.Addr)
	opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(refuseHook{refuse: &refuse})
	lim := newLimiter(t, rdb, FixedWindow, PerHour(100), WithPingInterval(time.Hour))
	direct := newLimiter(t, tunedClient(t, addr), FixedWindow, PerHour(100), WithPingInterval(time.Hour))
	ctx := context.Background()
	res, err := lim.AllowN(ctx, "k", 50)
	require.NoError(t, err)
	require.True(t, res.Allowed && !res.Degraded && res.Remaining == 50, "on Redis: %+v", res)
	// Calls in flight: Redis counts them at once, their answers come 700 ms later.
	proxy.SetDelay(700 * time.Millisecond)
	var wg sync.WaitGroup
	var onRedis atomic.Int64
	for range inFlight {
		wg.Go(func() {
			res, err := lim.Allow(ctx, "k")
			if assert.NoError(t, err) && assert.False(t, res.Degraded, "%+v", res) && res.Allowed {
				onRedis.Add(1)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := direct.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		if res.Remaining <= 50-inFlight { // (less: a call retried after a timeout)
			break
		}
		require.False(t, time.Now().After(deadline), "Redis counted %d of the %d calls in flight in 10 s", 50-res.Remaining, inFlight)
		time.Sleep(5 * time.Millisecond)
	}
	// The next call is refused a connection: the node is marked down
	// while the answers are on their way.
	refuse.Store(true)
	first := countAdmitted(t, lim, "k", 60)
	wg.Wait()
	second := countAdmitted(t, lim, "k", 60)
	res, err = direct.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	counted := 100 - res.Remaining // by Redis, the calls in flight included
	total := counted + first + second
	t.Logf("100/h with 50 left: %d admitted on Redis by the calls in flight (%d counted), %d in the fallback before their answers came, %d after: %d of 100",
		onRedis.Load(), counted-50, first, second, total)
	assert.LessOrEqual(t, first, 50, "admitted in the fallback before the late answers")
	assert.Zero(t, second, "admitted in the fallback after the late answers")
	assert.LessOrEqual(t, total, counted+50, "admitted in all: at most the limit and the calls in flight, which no one could know of")
}

// refuseHook fails every command sent while refuse is set as a refused
// connection does, and passes the others (those in flight) through.
type refuseHook struct {
	passHooks
	refuse *atomic.Bool
}

func (h refuseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.refuse.Load() {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// Issue 36 item 8: a call with a share is answered its share's Remaining,
// but the fallback remembers the whole limit's: Critical calls get in the
// fallback what Redis had left for them.
func TestFallbackRemembersWholeLimitOfShare(t *testing.T) {
	sheddable := ContextWithPriority(context.Background(), Sheddable)
	critical := ContextWithPriority(context.Background(), Critical)
	for _, s := range Strategies() {
		for _, c := range []struct {
			name              string
			shed, crit, shed2 int // calls on Redis: Sheddable, then Critical, then Sheddable again
			want              int // Critical calls admitted in the fallback
		}{
			{"10 sheddable", 10, 0, 0, 90},
			{"sheddable's share used", 50, 0, 1, 50},
			{"critical used more", 0, 80, 1, 20}, // the Sheddable call's share is overdrawn
		} {
			t.Run(s.String()+"/"+c.name, func(t *testing.T) {
				m, rdb := answersBackend(t)
				lim := newLimiter(t, rdb, s, PerMinute(100), WithPriorityShares(0.5, 1), WithPingInterval(time.Hour))
				call := func(ctx context.Context, calls int) {
					for range calls {
						_, err := lim.Allow(ctx, "k")
						require.NoError(t, err)
					}
				}
				call(sheddable, c.shed)
				call(critical, c.crit)
				call(sheddable, c.shed2)
				m.Close()
				admitted := 0
				for range 120 {
					res, err := lim.Allow(critical, "k")
					require.NoError(t, err)
					require.True(t, res.Degraded, "%+v", res)
					admitted += btoi(res.Allowed)
				}
				assert.Equal(t, c.want, admitted, "Critical calls admitted in the fallback")
			})
		}
	}
}

// Issue 37 item 1, through limiters on a real redis-server (whose memory
// is not the process's): 20 limiters, each used for 200 keys, grow the
// heap by what their answers take beside the same limiters without the
// fallback's memory (FallbackDeny).
func TestFallbackMemoryFollowsKeysRedis(t *testing.T) {
	const limiters, keys = 20, 200
	srv := redistest.Start(t)
	rdb := tunedClient(t, srv.Addr)
	ctx := context.Background()
	grow := func(fallback FallbackPolicy) float64 {
		before := heapInUse()
		lims := make([]*RateLimiter, limiters)
		for i := range lims {
			lims[i] = newLimiter(t, rdb, TokenBucket, PerMinute(100), WithFallback(fallback), WithPrefix("mem"+strconv.Itoa(i)))
			for k := range keys {
				_, err := lims[i].Allow(ctx, "user:"+strconv.Itoa(k))
				require.NoError(t, err)
			}
		}
		grew := float64(heapInUse() - before)
		runtime.KeepAlive(lims)
		return grew
	}
	deny := grow(FallbackDeny)
	local := grow(FallbackLocal)
	per := (local - deny) / limiters
	t.Logf("%d limiters used for %d keys each: heap grew %.2f MB with FallbackLocal, %.2f MB with FallbackDeny: %.1f KB a limiter for its answers (%.0f bytes a key)",
		limiters, keys, local/1e6, deny/1e6, per/1e3, per/keys)
	assert.LessOrEqual(t, per, float64(150*keys+4096), "%.0f bytes a limiter for %d keys' answers", per, keys)
}
