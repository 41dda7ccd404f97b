package redlimit

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// evictingArgs are the redis-server arguments of a small Redis with the
// given maxmemory-policy; "" is no memory limit (maxmemory 0).
func evictingArgs(policy string) []string {
	if policy == "" {
		return []string{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"}
	}
	return []string{"--maxmemory", "2mb", "--maxmemory-policy", policy}
}

// fillRedis writes n keys of 1 KB without a TTL, as other data sharing a Redis
// with the limits would; it returns how many writes Redis refused (OOM).
func fillRedis(t *testing.T, rdb *redis.Client, tag string, n int) (refused int) {
	t.Helper()
	ctx := context.Background()
	value := strings.Repeat("x", 1024)
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.Set(ctx, fmt.Sprintf("filler:%s:%d", tag, i), value, 0)
		if pipe.Len() == 100 || i == n-1 {
			cmds, _ := pipe.Exec(ctx)
			for _, c := range cmds {
				if err := c.Err(); err != nil {
					require.True(t, redis.IsOOMError(err), "filler write: %v", err)
					refused++
				}
			}
		}
	}
	return refused
}

// TestCheckRedisPolicyRedis checks CheckRedis's verdict on real servers
// started with each policy, one that refuses CONFIG, and one that is down.
func TestCheckRedisPolicyRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		args   []string
		policy string // the policy named in the error; "" for no error
	}{
		{"noeviction", evictingArgs("noeviction"), ""},
		{"allkeys-lru", evictingArgs("allkeys-lru"), "allkeys-lru"},
		{"volatile-lru", evictingArgs("volatile-lru"), "volatile-lru"},
		{"maxmemory 0", evictingArgs(""), ""},
		// A managed service that renamed CONFIG: skipped, whatever it does.
		{"CONFIG renamed", append(evictingArgs("allkeys-lru"), "--rename-command", "CONFIG", "x-config"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.Start(t, tc.args...)
			err := CheckRedis(ctx, s.Client(t))
			if tc.policy == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrEvictionPolicy)
			assert.Contains(t, err.Error(), s.Addr)
			assert.Contains(t, err.Error(), "maxmemory-policy "+tc.policy)
		})
	}
	t.Run("down", func(t *testing.T) {
		s := redistest.Start(t)
		rdb := s.Client(t)
		require.NoError(t, s.Close())
		err := CheckRedis(ctx, rdb)
		require.Error(t, err)
		assert.NotErrorIs(t, err, ErrEvictionPolicy)
		assert.Contains(t, err.Error(), s.Addr)
	})
	t.Run("nil client", func(t *testing.T) {
		require.ErrorIs(t, CheckRedis(ctx, nil), ErrInvalidArgument)
	})
}

// TestCheckRedisCluster: on a 3+3 cluster where one master alone is given
// an evicting policy, the check fails naming that master and no other;
// then where one replica alone is (it evicts once promoted), naming it.
func TestCheckRedisCluster(t *testing.T) {
	ctx := context.Background()
	c := realCluster(t)
	require.NoError(t, c.WaitHealthy(10*time.Second))
	rdb := redis.NewClusterClient(redistest.TunedClusterOptions(c.Addrs()))
	t.Cleanup(func() { rdb.Close() })
	rdb.Options().ReadTimeout = steadyTimeout
	require.NoError(t, CheckRedis(ctx, rdb), "the cluster as started")

	m, err := c.MasterOf(0)
	require.NoError(t, err)
	mc := m.Client(t)
	// 1 GB: the policy is what the check reads; the shared cluster must
	// not actually evict the keys of other tests.
	require.NoError(t, mc.ConfigSet(ctx, "maxmemory", "1gb").Err())
	require.NoError(t, mc.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err())
	t.Cleanup(func() {
		assert.NoError(t, mc.ConfigSet(ctx, "maxmemory", "0").Err())
		assert.NoError(t, mc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	})

	err = CheckRedis(ctx, rdb)
	require.ErrorIs(t, err, ErrEvictionPolicy)
	assert.Contains(t, err.Error(), "Redis "+m.Addr+" has maxmemory 1073741824 and maxmemory-policy allkeys-lfu")
	assert.Equal(t, 1, strings.Count(err.Error(), "maxmemory-policy"), "one master named: %v", err)

	require.NoError(t, mc.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, mc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	r, err := c.ReplicaOf(m)
	require.NoError(t, err)
	rc := r.Client(t)
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory", "1gb").Err())
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	t.Cleanup(func() {
		assert.NoError(t, rc.ConfigSet(ctx, "maxmemory", "0").Err())
		assert.NoError(t, rc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	})
	err = CheckRedis(ctx, rdb)
	require.ErrorIs(t, err, ErrEvictionPolicy, "a replica that would evict once promoted")
	assert.Contains(t, err.Error(), "Redis "+r.Addr+" has maxmemory 1073741824 and maxmemory-policy volatile-lru")
	assert.Equal(t, 1, strings.Count(err.Error(), "maxmemory-policy"), "one replica named: %v", err)
}

// TestEvictionNoticedRedis fills a 2 MB allkeys-lru Redis behind a limiter
// in use: the evictions are reported once, through the OnTransition hook
// and one log line, however long they go on.
func TestEvictionNoticedRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := redistest.Start(t, evictingArgs("allkeys-lru")...)
	rdb := redis.NewClient(steadyOptions(s.Addr))
	t.Cleanup(func() { rdb.Close() })
	var (
		mu     sync.Mutex
		seen   []Transition
		logged []string
	)
	lim := newLimiter(t, rdb, FixedWindow, PerHour(1000), WithEvictionCheck(20*time.Millisecond),
		WithOnTransition(func(tr Transition) {
			mu.Lock()
			seen = append(seen, tr)
			mu.Unlock()
		}))
	w := lim.evict
	w.SetLogf(func(format string, v ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(format, v...))
		mu.Unlock()
	})
	sampled := func() bool { // a sample has found a baseline for the server
		known, _ := w.Node(s.Addr)
		return known
	}
	reports := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	// decide keeps the limiter in use (a sample starts only on a decision).
	decide := func() {
		_, err := lim.Allow(ctx, "user")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { decide(); return sampled() }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 0, reports(), "no eviction yet")

	for round := range 4 {
		fillRedis(t, rdb, fmt.Sprint(round), 2000)
		require.Eventually(t, func() bool { decide(); return reports() > 0 }, 10*time.Second, 5*time.Millisecond,
			"round %d: the evictions were not reported", round)
	}
	// Several more samples, on a server that went on evicting throughout.
	for range 10 {
		fillRedis(t, rdb, "more", 500)
		w.MakeDue() // the next decision samples at once
		decide()
		w.Wait()
	}

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 1, "reported once: %v", seen)
	tr := seen[0]
	t.Logf("reported: %v", tr.Err)
	assert.Equal(t, s.Addr, tr.Node)
	assert.False(t, tr.Down)
	assert.Positive(t, tr.Evicted)
	assert.ErrorIs(t, tr.Err, ErrEvictionPolicy)
	assert.Contains(t, tr.Err.Error(), "maxmemory-policy allkeys-lru")
	require.Len(t, logged, 1)
	assert.Contains(t, logged[0], "maxmemory-policy allkeys-lru")
}

// TestEvictionQuietNoeviction: a full Redis that does not evict is an
// outage (OOM), never reported as evicting; and a limiter that is not used
// takes no sample.
func TestEvictionQuietRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := redistest.Start(t, evictingArgs("noeviction")...)
	rdb := redis.NewClient(steadyOptions(s.Addr))
	t.Cleanup(func() { rdb.Close() })
	var mu sync.Mutex
	var seen []Transition
	lim := newLimiter(t, rdb, FixedWindow, PerHour(1000), WithEvictionCheck(time.Millisecond),
		WithOnTransition(func(tr Transition) {
			mu.Lock()
			seen = append(seen, tr)
			mu.Unlock()
		}))
	w := lim.evict
	for range 3 {
		_, err := lim.Allow(ctx, "user")
		require.NoError(t, err)
		w.Wait()
		require.Eventually(t, func() bool { return w.Due() }, 10*time.Second, time.Millisecond)
	}
	require.Positive(t, fillRedis(t, rdb, "x", 4000), "noeviction refuses writes once full")
	for range 3 {
		w.MakeDue()
		_, err := lim.Allow(ctx, "user") // OOM: the fallback answers, no sample
		require.NoError(t, err)
		w.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tr := range seen {
		assert.Zero(t, tr.Evicted, "no eviction notice: %+v", tr)
		assert.NotErrorIs(t, tr.Err, ErrEvictionPolicy)
	}
}

// evictionScenario is the measurement of the README's section on Redis
// memory, on a real redis-server of 2 MB with a policy: 30 keys used up on
// each of four limiters (20 an hour) and 3 leases held on each of 30 keys
// of a Concurrency of 3, then 4,000 other keys of 1 KB without a TTL, then
// every key asked again (20 calls, 3 leases), where the limits allow none.
// The limiters have the default fallback (FallbackLocal).
type evictionScenario struct {
	admitted, fallback int // calls admitted after the fill (bound: 0 of 2,400): by Redis, by the fallback (OOM)
	leases, fbLeases   int // leases taken after the fill (bound: 0 of 90): by Redis, by the fallback
	keysLeft           int // limiter state keys left after the fill, of 150
	fillerLeft         int // filler keys left, of 4,000
	fillerRefused      int // filler writes refused (OOM)
}

func (sc evictionScenario) String() string {
	return fmt.Sprintf("admitted beyond the limits: %d calls by Redis + %d by the fallback (of 2,400), %d leases by Redis + %d by the fallback (of 90); left after the fill: %d of 150 limiter keys, %d of 4,000 other keys (%d refused)",
		sc.admitted, sc.fallback, sc.leases, sc.fbLeases, sc.keysLeft, sc.fillerLeft, sc.fillerRefused)
}

func runEvictionScenario(t *testing.T, policy string) evictionScenario {
	ctx := context.Background()
	s := redistest.Start(t, evictingArgs(policy)...)
	rdb := redis.NewClient(steadyOptions(s.Addr))
	t.Cleanup(func() { rdb.Close() })
	var lims []*RateLimiter
	for _, st := range []Strategy{FixedWindow, SlidingLog, SlidingCounter, TokenBucket} {
		lims = append(lims, newLimiter(t, rdb, st, PerHour(20), WithEvictionCheck(0)))
	}
	conc, err := NewConcurrency(rdb, 3, time.Hour, WithEvictionCheck(0))
	require.NoError(t, err)
	t.Cleanup(func() { conc.Close() })
	key := func(i int) string { return fmt.Sprintf("user:%d", i) }

	for i := range 30 {
		for _, lim := range lims {
			require.Equal(t, 20, allowedOf(t, lim, key(i), 21), "%v: used up", lim.Strategy())
		}
		for range 3 {
			_, res, err := conc.TryAcquire(ctx, key(i))
			require.NoError(t, err)
			require.True(t, res.Allowed)
		}
	}
	var sc evictionScenario
	sc.fillerRefused = fillRedis(t, rdb, "", 4000)
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
		require.NoError(t, err)
		for _, k := range keys {
			if strings.HasPrefix(k, "filler:") {
				sc.fillerLeft++
			} else if strings.HasPrefix(k, "redlimit:") {
				sc.keysLeft++
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	count := func(res Result, redis, fallback *int) {
		switch {
		case !res.Allowed:
		case res.Degraded:
			*fallback++
		default:
			*redis++
		}
	}
	for i := range 30 {
		for _, lim := range lims {
			for range 20 {
				res, err := lim.Allow(ctx, key(i))
				require.NoError(t, err)
				count(res, &sc.admitted, &sc.fallback)
			}
		}
		for range 3 {
			_, res, err := conc.TryAcquire(ctx, key(i))
			require.NoError(t, err)
			count(res, &sc.leases, &sc.fbLeases)
		}
	}
	return sc
}

// TestEvictionOverAdmitsRedis measures what a Redis that evicts does to
// the limits (the figures of the README's section on Redis memory): with
// no memory limit nothing is admitted beyond them; with noeviction, Redis
// admits nothing more and refuses writes (OOM), which sends the limiters
// to their fallback; with an evicting policy the evicted keys come back
// with a full allowance: allkeys-* evicts some of them, volatile-* evicts
// them first (they are the only keys with a TTL) and then, full of keys it
// may not evict, refuses writes as noeviction does (and the fallback,
// which starts from Redis's last answers, admits next to nothing). (allkeys-lfu, here,
// evicts the other keys, written once, before limiter keys used 21 times
// each: what it evicts depends on how keys are used.)
// REDLIMIT_EVICTION_POLICIES=all measures every policy, not only these.
func TestEvictionOverAdmitsRedis(t *testing.T) {
	t.Parallel()
	policies := []string{"", "noeviction", "allkeys-lru", "volatile-lru"}
	if evictionAll {
		policies = append(policies, "allkeys-lfu", "allkeys-random", "volatile-lfu", "volatile-random", "volatile-ttl")
	}
	for _, p := range policies {
		name := p
		if name == "" {
			name = "maxmemory 0"
		}
		t.Run(name, func(t *testing.T) {
			sc := runEvictionScenario(t, p)
			t.Logf("%s: %v", name, sc)
			switch {
			case p == "":
				assert.Zero(t, sc.admitted+sc.fallback, "admitted beyond the limits")
				assert.Zero(t, sc.leases+sc.fbLeases, "leases beyond the limit")
			case p == "noeviction":
				assert.Zero(t, sc.admitted, "admitted by Redis beyond the limits")
				assert.Zero(t, sc.leases, "leases by Redis beyond the limit")
				assert.Equal(t, 150, sc.keysLeft, "limiter keys evicted")
			case p == "allkeys-lru", p == "allkeys-random":
				assert.Positive(t, sc.admitted, "admitted by Redis beyond the limits")
			case strings.HasPrefix(p, "volatile-"):
				// The limiter keys go first, then Redis refuses writes
				// (OOM) and the limiters fall back: their stand-ins start
				// from Redis's last answer (0 left: answers.go), not full,
				// and the Concurrency's count the leases held here. Only
				// a key whose answer another key's took the slot of (a
				// collision in the table) may start full: 20 calls.
				assert.Less(t, sc.keysLeft, 150, "limiter keys evicted")
				assert.LessOrEqual(t, sc.fallback, 2*20, "admitted by the fallback beyond the limits (2,400 when stand-ins started full)")
				assert.Zero(t, sc.fbLeases, "leases by the fallback beyond the limit")
			}
		})
	}
}

var evictionAll = os.Getenv("REDLIMIT_EVICTION_POLICIES") == "all"

// A limiter reads the baseline when it starts, and samples one interval
// after its first decision, not at it; on miniredis it sends INFO once,
// at the start, and never again: miniredis answers INFO memory with an
// error, and must never be sent INFO stats, whose handler reads its server
// unlocked and crashed the test program when a test closed the miniredis
// during a sample.
func TestEvictionSkipsMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	start := m.CommandCount()
	lim := newLimiter(t, rdb, FixedWindow, PerHour(1000), WithEvictionCheck(time.Hour))
	w := lim.evict
	w.Wait()
	assert.False(t, w.Armed() || w.Due(), "no sample armed before a decision")
	known, refused := w.Node(m.Addr())
	require.True(t, known, "the baseline at start")
	assert.True(t, refused, "miniredis refuses INFO memory: not sampled again")
	assert.Positive(t, m.CommandCount()-start, "the baseline's INFO memory (and the connection's handshake)")
	ctx := context.Background()
	commands := func() int { // what a decision sends, and a sample if one starts
		before := m.CommandCount()
		_, err := lim.Allow(ctx, "user")
		require.NoError(t, err)
		w.Wait()
		return m.CommandCount() - before
	}
	first := commands() // with the script's loading
	assert.True(t, w.Armed(), "the first decision arms the first sample")
	alone := commands()
	assert.Less(t, alone, first)
	w.MakeDue()
	assert.Equal(t, alone, commands(), "a due sample sends no INFO to miniredis")
}

// The limiters of one client share one watch, and the last to close ends
// it; another client, or another interval, has its own.
func TestEvictionWatchShared(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	a := newLimiter(t, rdb, FixedWindow, PerHour(1000))
	b := newLimiter(t, rdb, TokenBucket, PerHour(1000))
	c := newLimiter(t, tunedClient(t, m.Addr()), TokenBucket, PerHour(1000))
	d := newLimiter(t, rdb, TokenBucket, PerHour(1000), WithEvictionCheck(time.Minute))
	require.Same(t, a.evict, b.evict)
	assert.NotSame(t, a.evict, c.evict)
	assert.NotSame(t, a.evict, d.evict)
	assert.Nil(t, newLimiter(t, rdb, TokenBucket, PerHour(1000), WithEvictionCheck(0)).evict)
	w := a.evict
	require.NoError(t, a.Close())
	assert.False(t, w.Closed(), "b still uses it")
	require.NoError(t, b.Close())
	assert.True(t, w.Closed(), "the last limiter closed it")
	e := newLimiter(t, rdb, FixedWindow, PerHour(1000))
	assert.NotSame(t, w, e.evict, "a new limiter gets a new watch")
}

// Evictions right after a limiter starts, before its first sample, are
// reported: the baseline is taken when the limiter starts, not by the
// first sample, one interval after the first decision (which found them
// all in its baseline, and reported nothing).
func TestEvictionAtStartRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := redistest.Start(t, evictingArgs("allkeys-lru")...)
	rdb := redis.NewClient(steadyOptions(s.Addr))
	t.Cleanup(func() { rdb.Close() })
	var tr transitions
	lim := newLimiter(t, rdb, FixedWindow, PerHour(1000), WithEvictionCheck(50*time.Millisecond), WithOnTransition(tr.record))
	w := lim.evict
	w.Wait() // a sample in flight: the baseline at start
	fillRedis(t, rdb, "start", 4000)
	evicted := func() int64 {
		text, err := rdb.Info(ctx, "stats").Result()
		require.NoError(t, err)
		var n int64
		for line := range strings.Lines(text) {
			if value, ok := strings.CutPrefix(strings.TrimSpace(line), "evicted_keys:"); ok {
				_, err := fmt.Sscan(value, &n)
				require.NoError(t, err)
			}
		}
		return n
	}
	atStart := evicted()
	require.Positive(t, atStart, "the fill evicted keys")
	// The limiter's first decisions, over several intervals.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && len(tr.list()) == 0 {
		_, err := lim.Allow(ctx, "user")
		require.NoError(t, err)
		w.Wait()
		time.Sleep(5 * time.Millisecond)
	}
	got := tr.list()
	t.Logf("%d keys evicted right after the start; notices: %+v", atStart, got)
	require.Len(t, got, 1, "the evictions at start reported")
	assert.GreaterOrEqual(t, got[0].Evicted, atStart, "the evictions at start counted (the decisions' writes may evict more)")
	assert.ErrorIs(t, got[0].Err, ErrEvictionPolicy)
}
