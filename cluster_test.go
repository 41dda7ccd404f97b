package redlimit

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Redis Cluster tests, on real redis-server processes: the shared cluster
// (3 masters, 1 replica each) for what does not break it, and clusters of
// their own for failover.

// clusterClient returns a client of c with the README's options. reload is
// the ClusterStateReloadInterval; 0 keeps go-redis's default (60s).
func clusterClient(t *testing.T, c *redistest.Cluster, reload time.Duration) *redis.ClusterClient {
	opts := redistest.TunedClusterOptions(c.Addrs())
	opts.ClusterStateReloadInterval = reload
	opts.ReadTimeout, opts.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond // -race on 2 cores
	rdb := redis.NewClusterClient(opts)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestBehaviourCluster(t *testing.T) {
	testBehaviour(t, func(t *testing.T) *backend {
		rdb := clusterClient(t, realCluster(t), time.Second)
		return &backend{name: "cluster", rdb: rdb, advance: time.Sleep}
	})
}

func TestConcurrencyCluster(t *testing.T) {
	testConcurrency(t, func(t *testing.T) redis.UniversalClient {
		return clusterClient(t, realCluster(t), time.Second)
	}, 2*time.Second)
}

// Every Redis key one call touches is in one slot, for any key; no call
// meets CROSSSLOT; keys spread over every master; two limited keys never
// share a Redis key.
func TestClusterKeySlots(t *testing.T) {
	c := realCluster(t)
	rdb := clusterClient(t, c, time.Second)
	ctx := context.Background()
	keys := append(oddKeys(), "", "}{", "{{}}", "a{b}c{d}")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		b := make([]byte, 1+rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		if rng.IntN(4) == 0 {
			b[rng.IntN(len(b))] = '{'
			b[rng.IntN(len(b))] = '}'
		}
		keys = append(keys, string(b))
	}
	for _, s := range Strategies() {
		lim := newLimiter(t, rdb, s, Limit{Rate: 1, Period: time.Hour}, WithPrefix("slots"), WithBlock(time.Minute))
		seen := map[string]string{}
		masters := map[string]bool{}
		done := map[string]bool{}
		for _, key := range keys {
			if done[key] {
				continue // the random keys may repeat one
			}
			done[key] = true
			if key == "" {
				if _, err := lim.Allow(ctx, key); err == nil {
					t.Fatal("the empty key was accepted")
				}
				continue
			}
			// Two calls: the first admits, the second is denied and writes
			// the block key, so the script touches both keys.
			for range 2 {
				if res, err := lim.Allow(ctx, key); err != nil || res.Degraded {
					t.Fatalf("%v key %.30q: %+v, %v", s, key, res, err)
				}
			}
			state := lim.stateKey(key)
			if other, dup := seen[state]; dup {
				t.Fatalf("keys %q and %q share Redis key %q", key, other, state)
			}
			seen[state] = key
			touched := []string{state, state + blockSuffix, state + probeSuffix}
			var slots []int64
			for _, k := range touched {
				slot, err := rdb.ClusterKeySlot(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if int(slot) != redistest.Slot(k) {
					t.Fatalf("CLUSTER KEYSLOT %q = %d, but the CRC16 of its hash tag is %d", k, slot, redistest.Slot(k))
				}
				slots = append(slots, slot)
			}
			if slots[0] != slots[1] || slots[0] != slots[2] {
				t.Fatalf("key %.30q: its Redis keys are in slots %v", key, slots)
			}
			if n, err := rdb.Exists(ctx, state, state+blockSuffix).Result(); err != nil || n != 2 {
				t.Fatalf("key %.30q: %d of its 2 Redis keys exist (%v)", key, n, err)
			}
			m, err := c.MasterOf(int(slots[0]))
			if err != nil {
				t.Fatal(err)
			}
			masters[m.Addr] = true
		}
		if len(masters) != 3 {
			t.Errorf("%v: keys landed on %d masters, want all 3", s, len(masters))
		}
	}
}

// SCRIPT FLUSH on every master in the middle of a load is invisible.
func TestClusterScriptFlush(t *testing.T) {
	rdb := clusterClient(t, realCluster(t), time.Second)
	lim, err := NewTokenBucket(rdb, PerSecond(100_000), WithPrefix("flush"))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ld := startLoadKeys(lim, 16, func(g int) string { return "key" + strconv.Itoa(g) })
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		if err := scriptFlush(context.Background(), rdb); err != nil {
			t.Fatal(err)
		}
	}
	r := report(ld.finish(), 0, 0)
	t.Logf("SCRIPT FLUSH x5 under load: %v", r)
	if r.errors > 0 || r.degraded > 0 {
		t.Fatalf("%d errors and %d fallback decisions, want none (first error %v)", r.errors, r.degraded, r.firstErr)
	}
}

// slotOwner returns the master that serves key's state for lim.
func slotOwner(t *testing.T, c *redistest.Cluster, lim *RateLimiter, key string) *redistest.Server {
	t.Helper()
	m, err := c.MasterOf(redistest.Slot(lim.stateKey(key)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Failover: SIGKILL the master that owns the test key's slot; its replica
// is promoted. Callers see no error, and decisions for that slot come from
// Redis again within 6 s of the kill, although go-redis, left alone, keeps
// sending the slot to the dead master until its state reload (60s by
// default, which this client keeps): the limiter asks for a reload while
// Redis is marked down.
func TestClusterFailover(t *testing.T) {
	c, err := redistest.StartCluster(3, 1)
	redistest.SkipOrFail(t, err)
	defer c.Close()
	rdb := clusterClient(t, c, 0)
	lim, err := NewTokenBucket(rdb, PerSecond(100_000))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	const key = "failover"
	master := slotOwner(t, c, lim, key)
	ld := startLoadKeys(lim, 32, func(int) string { return key })
	time.Sleep(500 * time.Millisecond)
	killAt := ld.now()
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	// Run until decisions come from Redis again, or 10 s.
	deadline := time.Now().Add(10 * time.Second)
	back := time.Duration(-1)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if !lim.rescue.anyDown() {
			if res, err := lim.Allow(context.Background(), key); err == nil && !res.Degraded {
				back = ld.now() - killAt
				break
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	r := report(ld.finish(), killAt, 0)
	t.Logf("failover: %v; decisions for the slot back on Redis %v after the kill", r, back)
	if r.errors > 0 {
		t.Errorf("%d errors returned to callers, first %v", r.errors, r.firstErr)
	}
	if back < 0 || back > 6*time.Second {
		t.Errorf("decisions for the failed-over slot came back %v after the kill, want within 6s", back)
	}
}

// A cluster with no replicas loses a master: every key gets fallback
// decisions (CLUSTERDOWN), and comes back within 6 s of the restart.
func TestClusterMasterDownNoReplicas(t *testing.T) {
	c, err := redistest.StartCluster(3, 0)
	redistest.SkipOrFail(t, err)
	defer c.Close()
	rdb := clusterClient(t, c, time.Second)
	lim, err := NewTokenBucket(rdb, PerSecond(100_000))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ld := startLoadKeys(lim, 16, func(g int) string { return "key" + strconv.Itoa(g) })
	time.Sleep(300 * time.Millisecond)
	victim := c.Masters[0]
	killAt := ld.now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	// With full coverage required, the survivors answer CLUSTERDOWN after
	// about 2×node-timeout.
	time.Sleep(5 * time.Second)
	downCalls := 0
	for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
		res, err := lim.Allow(context.Background(), key)
		if err != nil || !res.Degraded {
			t.Fatalf("key %s with the cluster down: %+v, %v; want a fallback decision", key, res, err)
		}
		downCalls++
	}
	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	upAt := ld.now()
	deadline := time.Now().Add(10 * time.Second)
	for lim.rescue.anyDown() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	r := report(ld.finish(), killAt, upAt)
	t.Logf("no replicas, master down: %v", r)
	if r.errors > 0 {
		t.Errorf("%d errors returned to callers, first %v", r.errors, r.firstErr)
	}
	if r.back < 0 || r.back > 6*time.Second {
		t.Errorf("back on Redis %v after the restart, want within 6s", r.back)
	}
}

// Lost writes: replication is asynchronous, so a failover can lose
// acknowledged updates and the limiter then over-admits, by at most what
// the lost writes held. The test reproduces it and records the figure; the
// README documents it.
func TestClusterLostWrites(t *testing.T) {
	c, err := redistest.StartCluster(3, 1)
	redistest.SkipOrFail(t, err)
	defer c.Close()
	rdb := clusterClient(t, c, time.Second)
	lim, err := NewTokenBucket(rdb, PerHour(100), WithPrefix("lost"))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	const key = "user"
	admit := func(n int) int {
		got := 0
		for range n {
			res, err := lim.Allow(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				got++
			}
		}
		return got
	}
	if got := admit(10); got != 10 {
		t.Fatalf("admitted %d of the first 10", got)
	}
	master := slotOwner(t, c, lim, key)
	replica, err := c.ReplicaOf(master)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.CLI("WAIT", "1", "1000"); err != nil {
		t.Fatal(err)
	}
	// Cut replication: stop the replica, and drop its link on the master.
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := master.CLI("CLIENT", "KILL", "TYPE", "replica"); err != nil {
		t.Fatal(err)
	}
	const lost = 90
	if got := admit(lost + 10); got != lost {
		t.Fatalf("admitted %d, want the %d left of the limit", got, lost)
	}
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Decide until Redis answers again, then count what it admits.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := lim.AllowN(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not back on Redis 10s after the failover")
		}
		time.Sleep(20 * time.Millisecond)
	}
	over := admit(100)
	t.Logf("lost writes: %d admissions acknowledged by the old master were lost; the promoted replica admitted %d more (limit 100/h, all used before the failover)", lost, over)
	if over > lost {
		t.Errorf("over-admitted %d, more than the %d lost writes", over, lost)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "Lost writes") {
		t.Error("README.md does not document lost writes after a failover")
	}
}
