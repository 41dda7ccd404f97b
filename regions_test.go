package redlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/hashslot"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// regionsRig is regions on this machine, each its own redis-server, whose
// instances reach the other regions' Redis through proxies that delay
// every reply (the links).
type regionsRig struct {
	rtt   time.Duration
	names []string
	links [][]*redistest.Proxy // links[i][j]: region i's way to region j's Redis (nil for i == j)
	lims  [][]*RateLimiter     // lims[i][k]: instance k of region i, each with its own clients
}

const rigSync = 200 * time.Millisecond

// startRegions starts regions redis-servers and instances limiters in
// each, made by mk with their region's client and WithRegions, whose links
// add rtt to every round trip.
func startRegions(t *testing.T, regions, instances int, rtt time.Duration, mk func(own redis.UniversalClient, opt Option) (*RateLimiter, error)) *regionsRig {
	t.Helper()
	return startRegionsSync(t, regions, instances, rtt, rigSync, mk)
}

// startRegionsSync is startRegions with the exchange interval sync.
func startRegionsSync(t *testing.T, regions, instances int, rtt, sync time.Duration, mk func(own redis.UniversalClient, opt Option) (*RateLimiter, error)) *regionsRig {
	t.Helper()
	g := &regionsRig{rtt: rtt, names: []string{"eu", "us", "ap", "sa", "af"}[:regions]}
	servers := make([]*redistest.Server, regions)
	for i := range servers {
		servers[i] = redistest.Start(t)
	}
	g.links = make([][]*redistest.Proxy, regions)
	for i := range regions {
		g.links[i] = make([]*redistest.Proxy, regions)
		for j := range regions {
			if i != j {
				g.links[i][j] = redistest.NewProxy(t, servers[j].Addr)
				g.links[i][j].SetEachWay(rtt / 2)
			}
		}
	}
	client := func(addr string) *redis.Client {
		o := redistest.TunedOptions(addr)
		o.ReadTimeout, o.WriteTimeout = time.Second, time.Second
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	g.lims = make([][]*RateLimiter, regions)
	for i := range regions {
		for range instances {
			peers := map[string]redis.UniversalClient{}
			for j := range regions {
				if i != j {
					peers[g.names[j]] = client(g.links[i][j].Addr)
				}
			}
			lim, err := mk(client(servers[i].Addr), WithRegions(Regions{Name: g.names[i], Peers: peers, Sync: sync}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = lim.Close() })
			g.lims[i] = append(g.lims[i], lim)
		}
	}
	return g
}

// offered is what a run of offer saw.
type offered struct {
	admitted  []int64 // by region
	latencies []time.Duration
	degraded  int64
	stale     int64
}

func (o *offered) total() (n int64) {
	for _, a := range o.admitted {
		n += a
	}
	return n
}

// offer makes every instance of every region offer rate calls a second
// to key, for d.
func (g *regionsRig) offer(t *testing.T, key string, rate int, d time.Duration) *offered {
	o := &offered{admitted: make([]int64, len(g.lims))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	every := time.Second / time.Duration(rate)
	for i, lims := range g.lims {
		for _, lim := range lims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lat []time.Duration
				for k := 0; ; k++ {
					at := start.Add(time.Duration(k) * every)
					if at.Sub(start) >= d {
						break
					}
					time.Sleep(time.Until(at))
					t0 := time.Now()
					res, err := lim.Allow(context.Background(), key)
					lat = append(lat, time.Since(t0))
					if !assert.NoError(t, err) {
						return
					}
					if res.Allowed {
						atomic.AddInt64(&o.admitted[i], 1)
					}
					if res.Degraded {
						atomic.AddInt64(&o.degraded, 1)
					}
					if res.Stale {
						atomic.AddInt64(&o.stale, 1)
					}
				}
				mu.Lock()
				o.latencies = append(o.latencies, lat...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return o
}

// cut cuts region i off from every other region, or heals it.
func (g *regionsRig) cut(i int, on bool) {
	for j := range g.links {
		for _, p := range []*redistest.Proxy{g.links[i][j], g.links[j][i]} {
			switch {
			case p == nil:
			case on:
				p.Cut()
			default:
				p.Restore()
				p.SetEachWay(g.rtt / 2)
			}
		}
	}
}

// state returns what n = 0 reports for key in each region.
func (g *regionsRig) state(t *testing.T, key string) []Result {
	out := make([]Result, len(g.lims))
	for i, lims := range g.lims {
		res, err := lims[0].AllowN(context.Background(), key, 0)
		require.NoError(t, err)
		out[i] = res
	}
	return out
}

// overBound is the bound on what the regions admit together past the
// limit while they hear each other (docs/regions.md): what the other
// regions admit during an interval and a round trip, at most the rate
// offered, seen late by each of them.
func overBound(regions int, offeredPerSecond float64, rtt time.Duration) float64 {
	return float64(regions-1) * offeredPerSecond * (rigSync + rtt).Seconds()
}

// TestRegionsOneLimitRedis: three regions, two instances each, links of a
// 50 ms round trip; each instance offers 100/s to one key for 8 s against
// one limit: together the regions admit the limit (at least 90%), never
// more than the limit and the stated bound, and no decision waits on a
// link.
func TestRegionsOneLimitRedis(t *testing.T) {
	testlane.MarkAlone(t)
	const rtt, run = 50 * time.Millisecond, 8 * time.Second
	cases := []struct {
		name  string
		mk    func(redis.UniversalClient, Option) (*RateLimiter, error)
		limit float64 // over the run
	}{
		{"token bucket 300/s", func(rdb redis.UniversalClient, o Option) (*RateLimiter, error) {
			return NewTokenBucket(rdb, Limit{Rate: 300, Period: time.Second, Burst: 300}, o)
		}, 300 + 300*run.Seconds()},
		{"fixed window 3000/min", func(rdb redis.UniversalClient, o Option) (*RateLimiter, error) {
			return NewFixedWindow(rdb, PerMinute(3000), o)
		}, 3000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // the fixed window may wait for a minute's start meanwhile
			g := startRegions(t, 3, 2, rtt, c.mk)
			if c.limit == 3000 { // the run within one minute's window
				if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < run+time.Second {
					time.Sleep(left + 100*time.Millisecond)
				}
			}
			o := g.offer(t, "customer", 100, run)
			bound := overBound(3, 600, rtt)
			p50, p99 := percentiles(o.latencies)
			t.Logf("admitted %d (%v by region) of a limit of %.0f, bound %.0f; decisions p50 %v, p99 %v; degraded %d, stale %d",
				o.total(), o.admitted, c.limit, bound, p50, p99, o.degraded, o.stale)
			assert.LessOrEqual(t, float64(o.total()), c.limit+bound, "past the limit and the bound")
			assert.GreaterOrEqual(t, float64(o.total()), 0.9*c.limit, "usage counted twice")
			assert.Less(t, p99, 20*time.Millisecond, "a decision waited on a link")
			assert.Zero(t, o.degraded)
			assert.Zero(t, o.stale)
		})
	}
}

// TestRegionsHangingPeersRedis: with every link to the peers hanging
// (connections accepted, nothing delivered), a region decides at local
// speed, from its own Redis, and says its peers are silent, to the
// observer too.
func TestRegionsHangingPeersRedis(t *testing.T) {
	testlane.MarkAlone(t)
	var observed atomic.Int64 // decisions the observer saw stale
	g := startRegions(t, 3, 1, 50*time.Millisecond, func(rdb redis.UniversalClient, o Option) (*RateLimiter, error) {
		return NewTokenBucket(rdb, Limit{Rate: 300, Period: time.Second, Burst: 300}, o, WithObserver(func(d Decision) {
			if d.Stale {
				observed.Add(1)
			}
		}))
	})
	for i := range g.links {
		for _, p := range g.links[i] {
			if p != nil {
				p.Blackhole(true)
			}
		}
	}
	o := g.offer(t, "customer", 100, 3*time.Second) // silent a second (a first delivery's deadline) and 4 intervals in
	p50, p99 := percentiles(o.latencies)
	t.Logf("decisions p50 %v, p99 %v; admitted %v; stale %d of %d", p50, p99, o.admitted, o.stale, len(o.latencies))
	assert.Less(t, p99, 20*time.Millisecond)
	assert.Zero(t, o.degraded)
	assert.Positive(t, o.stale, "no decision said its peers were silent")
	assert.Equal(t, o.stale, observed.Load(), "stale decisions observed (Decision.Stale)")
	ages := g.lims[0][0].PeerAges()
	require.Len(t, ages, 2)
	for name, age := range ages {
		assert.Greater(t, age, staleSyncs*rigSync, name)
	}
	t0 := time.Now()
	for _, lims := range g.lims {
		for _, l := range lims {
			require.NoError(t, l.Close())
		}
	}
	t.Logf("closed in %v", time.Since(t0))
	assert.Less(t, time.Since(t0), time.Second, "Close waited on hanging peers")
}

// TestRegionsPartitionRedis: a 4 s partition of one region from the two
// others while every region offers twice its third of the limit: the
// regions admit at most the limit and 15%; three intervals after the
// link heals, with no traffic, they agree; then the region that was cut
// off uses its bucket up in one call, and within three intervals every
// region shows it.
func TestRegionsPartitionRedis(t *testing.T) {
	testlane.MarkAlone(t)
	const rtt = 50 * time.Millisecond
	const rate = 300
	g := startRegions(t, 3, 2, rtt, func(rdb redis.UniversalClient, o Option) (*RateLimiter, error) {
		return NewTokenBucket(rdb, Limit{Rate: rate, Period: time.Second, Burst: rate}, o)
	})
	// The bucket used up at once in one region, then by every region's
	// traffic: never full in any region from then on, so that what the
	// regions hold apart is the partition's doing, not refill lost while
	// the bucket was full in one region and charged in another (see
	// docs/regions.md).
	res, err := g.lims[0][0].AllowN(context.Background(), "customer", rate)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	time.Sleep(3 * rigSync)
	g.offer(t, "customer", 100, 2*time.Second)
	g.cut(0, true)
	o := g.offer(t, "customer", 100, 4*time.Second)
	limit := rate * 4.0
	t.Logf("partition: admitted %d (%v by region) against %.0f; stale %d", o.total(), o.admitted, limit, o.stale)
	assert.LessOrEqual(t, float64(o.total()), 1.15*limit)
	assert.Positive(t, o.stale)

	g.cut(0, false)
	time.Sleep(3 * rigSync)
	// Within the refill of an interval and a round trip, and of 20 ms of
	// scheduling noise (measured: the same Remaining in every region).
	const noise = 20 * time.Millisecond
	refill := rate * (rigSync + rtt + noise).Seconds()
	agree := func(what string) []Result {
		t.Helper()
		st := g.state(t, "customer")
		for i := range st {
			t.Logf("%s: %s Remaining %d ResetAfter %v", what, g.names[i], st[i].Remaining, st[i].ResetAfter)
		}
		for i := 1; i < len(st); i++ {
			for j := range i {
				assert.InDelta(t, st[j].Remaining, st[i].Remaining, refill, "%s: Remaining of %s and %s", what, g.names[j], g.names[i])
				assert.InDelta(t, st[j].ResetAfter.Seconds(), st[i].ResetAfter.Seconds(), (rigSync + rtt + noise).Seconds(), "%s: ResetAfter of %s and %s", what, g.names[j], g.names[i])
			}
		}
		return st
	}
	st := agree("healed")
	res, err = g.lims[0][0].AllowN(context.Background(), "customer", st[0].Remaining)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	time.Sleep(3 * rigSync)
	agree("used up")
}

func TestWithRegionsRefuses(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var nilClient *redis.Client
	peers := map[string]redis.UniversalClient{"us": rdb}
	cases := []struct {
		name string
		r    Regions
	}{
		{"empty name", Regions{Peers: peers}},
		{"no peers", Regions{Name: "eu"}},
		{"peer named as this region", Regions{Name: "us", Peers: peers}},
		{"empty peer name", Regions{Name: "eu", Peers: map[string]redis.UniversalClient{"": rdb}}},
		{"nil peer", Regions{Name: "eu", Peers: map[string]redis.UniversalClient{"us": nilClient}}},
		{"negative interval", Regions{Name: "eu", Peers: peers, Sync: -time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewTokenBucket(rdb, PerSecond(10), WithRegions(c.r))
			require.ErrorIs(t, err, ErrInvalidArgument)
		})
	}
	ok := Regions{Name: "eu", Peers: peers}
	_, err := NewSlidingLog(rdb, PerSecond(10), WithRegions(ok))
	require.ErrorIs(t, err, ErrInvalidLimit, "a sliding log's timestamps do not add up")
	_, err = NewConcurrency(rdb, 10, time.Second, WithRegions(ok))
	require.ErrorIs(t, err, ErrInvalidArgument)
	lim, err := NewTokenBucket(rdb, PerSecond(10), WithRegions(ok))
	require.NoError(t, err)
	require.NoError(t, lim.Close())
}

// peerRegion is WithRegions for region self with one peer, name, on
// peer, exchanging every 10 ms.
func peerRegion(self, name string, peer redis.UniversalClient) Option {
	return WithRegions(Regions{Name: self, Peers: map[string]redis.UniversalClient{name: peer}, Sync: 10 * time.Millisecond})
}

// TestRegionsApplyOnce: what one region admits reaches the other once,
// however many of its instances deliver it and however often.
func TestRegionsApplyOnce(t *testing.T) {
	for _, s := range []Strategy{FixedWindow, SlidingCounter, SubWindowCounter, TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			eu, _ := miniBackend(t) // clocks standing still: nothing refills
			us, _ := miniBackend(t)
			in := func(self string, own, peer redis.UniversalClient, name string) *RateLimiter {
				return newLimiter(t, own, s, PerMinute(100), peerRegion(self, name, peer))
			}
			eu1, eu2 := in("eu", eu.rdb, us.rdb, "us"), in("eu", eu.rdb, us.rdb, "us")
			other := in("us", us.rdb, eu.rdb, "eu")
			ctx := context.Background()
			for lim, n := range map[*RateLimiter]int{eu1: 30, eu2: 20} {
				res, err := lim.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.True(t, res.Allowed)
			}
			remaining := func() int {
				res, err := other.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				return res.Remaining
			}
			require.Eventually(t, func() bool { return remaining() == 50 }, 5*time.Second, 10*time.Millisecond)
			// The journal delivered again, by hand, from both instances.
			first := eu1.engine.stateKey("k", &eu1.own.rules[0])
			v, err := eu.rdb.Get(ctx, eu1.regions.journalKey(first, eu1.own)).Result()
			require.NoError(t, err)
			j, ok := parseJournal(v)
			require.True(t, ok, v)
			require.EqualValues(t, 50, j[1], "events")
			require.EqualValues(t, 2, j[2], "calls")
			for _, x := range []*exchange{eu1.regions, eu2.regions} {
				keys, args := x.applyArgs(eu1.own, "eu", "u", []string{first}, j[:])
				charged, err := regionScript.Run(ctx, us.rdb, keys, args...).Int64()
				require.NoError(t, err)
				require.Zero(t, charged)
			}
			time.Sleep(100 * time.Millisecond) // ten more rounds
			require.Equal(t, 50, remaining())
		})
	}
}

// TestRegionsSilentPeerCharged: a peer that cannot be reached is taken to
// spend its share of the limit, and the decisions say so.
func TestRegionsSilentPeerCharged(t *testing.T) {
	m := miniredis.RunT(t) // the real clock
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	gone := miniredis.RunT(t)
	peer := redis.NewClient(&redis.Options{Addr: gone.Addr(), DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = peer.Close() })
	gone.Close()
	lim, err := NewFixedWindow(rdb, PerMinute(6000), WithRegions(Regions{
		Name: "eu", Peers: map[string]redis.UniversalClient{"us": peer}, Sync: 10 * time.Millisecond,
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close() })
	ctx := context.Background()
	var last Result
	require.Eventually(t, func() bool {
		last, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		return last.Stale && last.Remaining <= 6000-20 // its share: 50/s
	}, 5*time.Second, 10*time.Millisecond)
	assert.False(t, last.Degraded)
	assert.Greater(t, lim.PeerAges()["us"], staleSyncs*10*time.Millisecond)
}

// TestRegionsClusterRedis: a region on a Redis Cluster journals and applies
// each key in its own slot (no cross-slot script, no key of the exchange's
// own), exchanging with a region on a single server.
func TestRegionsClusterRedis(t *testing.T) {
	c := realCluster(t)
	cl := redis.NewClusterClient(redistest.TunedClusterOptions(c.Addrs()))
	t.Cleanup(func() { _ = cl.Close() })
	single := redistest.Start(t).Client(t)
	mk := func(own redis.UniversalClient, self, name string, peer redis.UniversalClient) *RateLimiter {
		return newLimiter(t, own, TokenBucket, Limit{Rate: 100, Period: time.Minute, Burst: 100}, WithRegions(Regions{
			Name: self, Peers: map[string]redis.UniversalClient{name: peer}, Sync: 20 * time.Millisecond,
		}))
	}
	onCluster, onSingle := mk(cl, "eu", "us", single), mk(single, "us", "eu", cl)
	ctx := context.Background()
	for i, key := range []string{"a", "b", "c", "d"} { // keys on different masters
		res, err := onCluster.AllowN(ctx, key, 10+i)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		res, err = onSingle.AllowN(ctx, key, 5)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	for i, key := range []string{"a", "b", "c", "d"} {
		want := 100 - 10 - i - 5 // a minute's refill is 100: within the test, at most a token or two
		for _, lim := range []*RateLimiter{onCluster, onSingle} {
			require.Eventually(t, func() bool {
				res, err := lim.AllowN(ctx, key, 0)
				require.NoError(t, err)
				return res.Remaining <= want+3 && res.Remaining >= want
			}, 5*time.Second, 20*time.Millisecond, "key %s", key)
		}
	}
}

// TestRegionsPolicyAndCalendar: every rule of a policy is shared (a rule
// per call with the calls, the others with the events), and a calendar
// quota's window.
func TestRegionsPolicyAndCalendar(t *testing.T) {
	eu, _ := miniBackend(t)
	us, _ := miniBackend(t)
	rules := []Rule{
		{Strategy: TokenBucket, Limit: PerMinute(100)},
		{Strategy: SlidingCounter, Limit: PerMinute(2), PerCall: true},
		{Strategy: FixedWindow, Limit: PerHour(1000)},
	}
	pe, err := NewPolicy(eu.rdb, rules, peerRegion("eu", "us", us.rdb))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pe.Close() })
	pu, err := NewPolicy(us.rdb, rules, peerRegion("us", "eu", eu.rdb))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pu.Close() })
	ce := newLimiter(t, eu.rdb, FixedWindow, Daily(100, time.UTC), peerRegion("eu", "us", us.rdb))
	cu := newLimiter(t, us.rdb, FixedWindow, Daily(100, time.UTC), peerRegion("us", "eu", eu.rdb))
	ctx := context.Background()
	res, err := pe.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = ce.AllowN(ctx, "k", 30)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Eventually(t, func() bool {
		res, err := pu.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		return res.Remaining == 97
	}, 5*time.Second, 10*time.Millisecond, "the bucket's 3 events")
	res, err = pe.AllowN(ctx, "k", 3) // the per-call rule's second and last call
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Eventually(t, func() bool {
		res, err := pu.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		return !res.Allowed && res.Rule == pu.Rules()[1].Name
	}, 5*time.Second, 10*time.Millisecond, "the per-call rule's two calls")
	require.Eventually(t, func() bool {
		res, err := cu.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		return res.Remaining == 70
	}, 5*time.Second, 10*time.Millisecond, "the day's 30")
}

// TestRegionsJournalEpochs: a journal lives as long as its rules remember
// an event after its last admission, and its epochs (ten minutes) are
// applied exactly once across their turn.
func TestRegionsJournalEpochs(t *testing.T) {
	eu, _ := miniBackend(t)
	us, _ := miniBackend(t)
	in := func(self string, own, peer redis.UniversalClient, name string) *RateLimiter {
		return newLimiter(t, own, TokenBucket, PerMinute(10), peerRegion(self, name, peer))
	}
	here, there := in("eu", eu.rdb, us.rdb, "us"), in("us", us.rdb, eu.rdb, "eu")
	ctx := context.Background()
	remainingThere := func(want int) {
		t.Helper()
		require.Eventually(t, func() bool {
			res, err := there.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			return res.Remaining == want
		}, 5*time.Second, 10*time.Millisecond, "want %d remaining", want)
	}
	res, err := here.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	remainingThere(7)
	first := here.engine.stateKey("k", &here.own.rules[0])
	jk := here.regions.journalKey(first, here.own)
	life := here.regions.life(here.own)
	require.Equal(t, 2*time.Minute+time.Millisecond, life, "a bucket of Burst = Rate: two periods")
	ttl, err := eu.rdb.PTTL(ctx, jk).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, life, "the journal outlives its rules' memory")

	// Admissions a minute apart keep the journal (a life after each) and
	// its epoch, until one ten minutes after it began starts the next:
	// the old one's events are not charged again.
	for step := 1; step <= 10; step++ {
		eu.advance(time.Minute) // both buckets full again
		us.advance(time.Minute)
		res, err = here.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		v, err := eu.rdb.Get(ctx, jk).Result()
		require.NoError(t, err, "step %d", step)
		j, ok := parseJournal(v)
		require.True(t, ok, v)
		if step < 10 {
			require.EqualValues(t, 3+step, j[1], "step %d: the epoch's events", step)
		} else {
			require.EqualValues(t, 1, j[1], "the new epoch's events")
			require.EqualValues(t, 3+9, j[5], "the previous epoch's")
		}
		remainingThere(9)
	}
	time.Sleep(100 * time.Millisecond) // ten more rounds
	remainingThere(9)
}

// TestRegionsBatches: the exchange applies many keys a batch per call, each
// batch of one slot and one rule set, and every key's usage arrives.
func TestRegionsBatches(t *testing.T) {
	eu, _ := miniBackend(t)
	us, _ := miniBackend(t)
	in := func(self string, own, peer redis.UniversalClient, name string) *RateLimiter {
		return newLimiter(t, own, FixedWindow, PerHour(100), peerRegion(self, name, peer))
	}
	here, there := in("eu", eu.rdb, us.rdb, "us"), in("us", us.rdb, eu.rdb, "eu")
	ctx := context.Background()
	states := map[string]*ruleSet{}
	for i := range 1000 {
		key := fmt.Sprint("user:", i)
		states[here.stateKey(key)] = here.own
		res, err := here.AllowN(ctx, key, 1+i%5)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}) // never dialled
	t.Cleanup(func() { _ = cluster.Close() })
	for _, c := range []struct {
		rdb    redis.UniversalClient
		bySlot bool
	}{{us.rdb, false}, {cluster, true}} {
		groups := batches(c.rdb, states, func(rs *ruleSet) *ruleSet { return rs })
		n := 0
		for _, g := range groups {
			require.NotEmpty(t, g)
			require.LessOrEqual(t, len(g), maxRegionBatch)
			for _, s := range g {
				if c.bySlot {
					require.Equal(t, hashslot.Of(g[0]), hashslot.Of(s), "a batch spans slots")
				}
			}
			n += len(g)
		}
		require.Equal(t, len(states), n)
		if !c.bySlot {
			require.Len(t, groups, (len(states)+maxRegionBatch-1)/maxRegionBatch, "full batches to one server")
		}
	}
	require.Eventually(t, func() bool {
		for i := range 1000 {
			res, err := there.AllowN(ctx, fmt.Sprint("user:", i), 0)
			require.NoError(t, err)
			if res.Remaining != 100-(1+i%5) {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond)
}

// TestRegionsSilentShareGivenBackRedis: the share charged for a peer while
// it was silent is set against what it used once it is heard again, even
// when it used nothing (and so has nothing to deliver).
func TestRegionsSilentShareGivenBackRedis(t *testing.T) {
	const sync = 20 * time.Millisecond
	g := startRegionsSync(t, 2, 1, 0, sync, func(rdb redis.UniversalClient, o Option) (*RateLimiter, error) {
		return NewFixedWindow(rdb, PerMinute(60_000), o)
	})
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 10*time.Second {
		time.Sleep(left + 100*time.Millisecond) // one window
	}
	eu := g.lims[0][0]
	ctx := context.Background()
	remaining := func() int {
		res, err := eu.AllowN(ctx, "quiet", 0) // decided here, never admitted anywhere
		require.NoError(t, err)
		return res.Remaining
	}
	require.Equal(t, 60_000, remaining())
	g.cut(0, true)
	require.Eventually(t, func() bool { return remaining() < 60_000-100 }, 5*time.Second, sync, "the silent peer's share charged")
	g.cut(0, false)
	require.Eventually(t, func() bool { return remaining() == 60_000 }, 5*time.Second, sync, "its share given back")
}
