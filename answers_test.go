package redlimit

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
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

// Whatever keys arrive, the answers kept take a fixed table of as many
// slots as WithFallbackKeys (a power of two): a flood of new keys takes
// no more, and a key Redis answered last is still found.
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
	slots, held := 0, 0
	for i := range a.stripes {
		slots += len(a.stripes[i].slots)
		for _, v := range a.stripes[i].slots {
			if v.tag != 0 {
				held++
			}
		}
	}
	t.Logf("%d answers held in %d slots after 501 keys", held, slots)
	require.Equal(t, 16, slots, "slots")
	require.LessOrEqual(t, held, 16, "answers held")
	m.Close()
	if got := countAdmitted(t, lim, "k", 3); got != 0 {
		t.Errorf("admitted %d of the key Redis denied last, want 0", got)
	}
}

// An answer is of use until its reset, and only for the limits it was
// given under.
func TestAnswersExpire(t *testing.T) {
	a := newAnswers(100)
	require.Len(t, a.stripes, 1, "64 slots: one stripe")
	rs := newRuleSet([]rule{mustRule(t, FixedWindow, PerMinute(10))})
	a.note("k", rs, &Result{Remaining: 2, ResetAfter: time.Second}, reasonAllowed)
	h := a.hash("k")
	v, ok := a.get(h, 0, rs.sig, monoNow())
	require.True(t, ok, "just noted")
	require.EqualValues(t, 2, v.remaining)
	_, ok = a.get(h, 0, rs.sig, v.at+int64(time.Second))
	require.False(t, ok, "at its reset")
	_, ok = a.get(h, 0, rs.sig+1, v.at)
	require.False(t, ok, "under other limits")
	_, ok = a.get(a.hash("other"), 0, rs.sig, v.at)
	require.False(t, ok, "another key")
	a.note("k", rs, &Result{Remaining: 10, ResetAfter: time.Second}, reasonAllowed)
	v2, ok := a.get(h, 0, rs.sig, v.at)
	require.True(t, ok && v2 == v, "a full answer is not noted: %+v", v2)
}

func mustRule(t testing.TB, s Strategy, l Limit) rule {
	t.Helper()
	alg, ok := algorithmOf(s)
	require.True(t, ok)
	r, err := newRule("", alg, l)
	require.NoError(t, err)
	return r
}

// Noting an answer allocates nothing once its stripe is in use.
func TestAnswersNoteAllocs(t *testing.T) {
	a := newAnswers(100_000)
	rs := newRuleSet([]rule{mustRule(t, TokenBucket, PerSecond(10))})
	res := Result{Remaining: 3, ResetAfter: time.Second}
	state := "redlimit:{user:12345}:tb1000000"
	if got := testing.AllocsPerRun(1000, func() { a.note(state, rs, &res, reasonAllowed) }); got != 0 {
		t.Errorf("note: %v allocations, want 0", got)
	}
}

// BenchmarkAnswersNote is what a decision on Redis adds for the fallback's
// memory (compare BenchmarkDecisionOverhead).
func BenchmarkAnswersNote(b *testing.B) {
	a := newAnswers(100_000)
	rs := newRuleSet([]rule{mustRule(b, TokenBucket, PerSecond(10))})
	res := Result{Remaining: 3, ResetAfter: time.Second}
	state := "redlimit:{user:12345}:tb1000000"
	b.ReportAllocs()
	for b.Loop() {
		a.note(state, rs, &res, reasonAllowed)
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
