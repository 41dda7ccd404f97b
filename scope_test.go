package redlimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/hashslot"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// Every slot has a probe tag of at most 3 characters, in that slot.
func TestScopeProbeTags(t *testing.T) {
	seen := make(map[string]bool, hashslot.Count)
	for slot := range hashslot.Count {
		tag := hashslot.Tag(slot)
		require.NotEmpty(t, tag)
		require.LessOrEqual(t, len(tag), 3, "slot %d", slot)
		require.Equal(t, slot, redistest.Slot("{"+tag+"}"), "tag %q", tag)
		require.False(t, seen[tag], "tag %q twice", tag)
		seen[tag] = true
	}
	for _, key := range append(oddKeys(), "a", "{a}b", "x{}y", "}{z}", strings.Repeat("k", 10_000)) {
		assert.Equal(t, redistest.Slot(key), hashslot.Of(key), "hashslot.Of(%.20q)", key)
	}
}

// probeRecorder records the keys of the probes sent through a client.
type probeRecorder struct {
	passHooks // only ProcessHook does something
	recorder[string]
}

func (p *probeRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA <sha> 1 <key>, or EVAL <source> 1 <key>.
		if a := cmd.Args(); len(a) == 4 && (a[1] == probeScript.Hash() || strings.Contains(fmt.Sprint(a[1]), "redis.call('SET', KEYS[1], '1'")) {
			p.record(fmt.Sprint(a[3]))
		}
		return next(ctx, cmd)
	}
}

// A probe never carries the caller's key: a huge key (hashed in its Redis
// key) and a 200-byte key are decided by Redis, and while Redis is cut
// off their node is probed with a short key of the same slot.
func TestScopeProbeKey(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := tunedClient(t, proxy.Addr)
	probes := &probeRecorder{}
	rdb.AddHook(probes)
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(1000), WithPingInterval(10*time.Millisecond))
	ctx := context.Background()
	keys := map[string]string{
		"4 MB key":     strings.Repeat("x", 4<<20),
		"200-byte key": strings.Repeat("y", 200),
	}
	for name, key := range keys {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			t.Logf("decided by Redis in %v", time.Since(start))
			res, err = lim.Allow(ctx, "other")
			require.NoError(t, err)
			require.False(t, res.Degraded, "another key")

			proxy.Cut()
			res, err = lim.Allow(ctx, key)
			require.NoError(t, err)
			require.True(t, res.Degraded, "with Redis cut off")
			require.Eventually(t, func() bool { return len(probes.list()) >= 3 }, 3*time.Second, 5*time.Millisecond)
			proxy.Restore()
			require.Eventually(t, func() bool {
				res, err := lim.Allow(ctx, key)
				return err == nil && !res.Degraded
			}, 3*time.Second, 5*time.Millisecond, "back on Redis")

			state := lim.stateKey(key)
			for _, p := range probes.list() {
				assert.LessOrEqual(t, len(p), len("redlimit:{abc}:p"), "probe key %.40q", p)
				assert.NotContains(t, p, key[:10])
				assert.Equal(t, hashslot.Of(state), hashslot.Of(p), "probe key %q is not in the slot of %.40q", p, state)
			}
			probes.mu.Lock()
			probes.got = nil
			probes.mu.Unlock()
		})
	}
}

// One slow call does not take the other keys off Redis. Redis stalls for
// 150ms (DEBUG SLEEP, standing for an expensive key, a fork or another
// client's slow command): the call caught in it times out and is decided
// by the fallback; a probe sent at once finds the node healthy, so nothing
// is marked down and the other keys, called right after, are decided by
// Redis.
func TestScopeSlowCall(t *testing.T) {
	testlane.MarkAlone(t)
	var args []string
	if v, err := redistest.ServerVersion(); err == nil && v.AtLeast(7, 0) {
		args = []string{"--enable-debug-command", "yes"} // DEBUG is off by default from 7.0; 6.0 has no such option
	}
	srv := redistest.Start(t, args...)
	admin := srv.Client(t)
	rdb := tunedClient(t, srv.Addr)
	var tr transitions
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(1000), WithOnTransition(tr.record))
	ctx := context.Background()
	others := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, k := range append(others, "slow") {
		_, err := lim.Allow(ctx, k)
		require.NoError(t, err)
	}
	caught := false
	for attempt := 0; attempt < 5 && !caught; attempt++ {
		stalled := make(chan error, 1)
		go func() { stalled <- admin.Do(ctx, "DEBUG", "SLEEP", "0.15").Err() }()
		time.Sleep(20 * time.Millisecond) // DEBUG SLEEP reaches Redis first
		start := time.Now()
		res, err := lim.Allow(ctx, "slow")
		require.NoError(t, err)
		caught = res.Degraded
		t.Logf("attempt %d: the call in the stall took %v, degraded %v", attempt, time.Since(start).Round(time.Millisecond), res.Degraded)
		if !caught {
			// The call came before DEBUG SLEEP (a late goroutine on a
			// loaded machine): the others would meet the stall, not its
			// end. Let it pass and try again.
			require.NoError(t, <-stalled)
			continue
		}
		degraded := 0
		for _, k := range others {
			res, err := lim.Allow(ctx, k)
			require.NoError(t, err)
			if res.Degraded {
				degraded++
			}
		}
		require.NoError(t, <-stalled)
		t.Logf("attempt %d: %d of %d other keys degraded right after the slow call", attempt, degraded, len(others))
		assert.Zero(t, degraded, "other keys were sent to the fallback")
	}
	require.True(t, caught, "no call was caught in the stall in 5 attempts")
	time.Sleep(300 * time.Millisecond)
	assert.Empty(t, tr.list(), "a slow call marked Redis down")
	assert.False(t, lim.rescue.anyDown())
	res, err := lim.Allow(ctx, "slow")
	require.NoError(t, err)
	assert.False(t, res.Degraded, "the slow key itself, after the stall")
}

// On a Redis Cluster, trouble with one slot or one master keeps the keys
// of the others on Redis: a TRYAGAIN during a slot migration sends only
// that call to the fallback, and a failed master (with
// cluster-require-full-coverage no) only the keys of its slots.
func TestScopeCluster(t *testing.T) {
	c, err := redistest.StartCluster(3, 0, "--cluster-require-full-coverage", "no")
	redistest.SkipOrFail(t, err)
	defer c.Close()
	rdb := clusterClient(t, c, time.Second)
	var tr transitions
	// WithBlock makes each call name two keys, the state and the block.
	// PerMinute: a state key lives a minute (a bucket's time to refill).
	lim := newLimiter(t, rdb, TokenBucket, PerMinute(1000), WithBlock(time.Minute), WithOnTransition(tr.record))
	ctx := context.Background()

	// Keys on every master, a few per master.
	byMaster := map[*redistest.Server][]string{}
	for i := 0; len(byMaster) < 3 || len(byMaster[c.Masters[0]]) < 3 || len(byMaster[c.Masters[1]]) < 3 || len(byMaster[c.Masters[2]]) < 3; i++ {
		k := fmt.Sprintf("key%d", i)
		m, err := c.MasterOf(hashslot.Of(lim.stateKey(k)))
		require.NoError(t, err)
		byMaster[m] = append(byMaster[m], k)
	}
	var all []string
	for _, ks := range byMaster {
		all = append(all, ks...)
	}
	// decideAll calls every key but skip, and counts fallback decisions.
	decideAll := func(skip map[string]bool) (calls, degraded int) {
		for _, k := range all {
			if skip[k] {
				continue
			}
			res, err := lim.Allow(ctx, k)
			require.NoError(t, err, "key %s", k)
			calls++
			if res.Degraded {
				degraded++
			}
		}
		return calls, degraded
	}
	_, degraded := decideAll(nil)
	require.Zero(t, degraded, "before any trouble")

	t.Run("TRYAGAIN", func(t *testing.T) {
		const key = "migrating"
		_, err := lim.Allow(ctx, key) // its state exists now, its block key does not
		require.NoError(t, err)
		slot := hashslot.Of(lim.stateKey(key))
		src, err := c.MasterOf(slot)
		require.NoError(t, err)
		dst := c.Masters[0]
		if dst == src {
			dst = c.Masters[1]
		}
		srcID, err := src.CLI("CLUSTER", "MYID")
		require.NoError(t, err)
		dstID, err := dst.CLI("CLUSTER", "MYID")
		require.NoError(t, err)
		s := fmt.Sprint(slot)
		_, err = dst.CLI("CLUSTER", "SETSLOT", s, "IMPORTING", srcID)
		require.NoError(t, err)
		_, err = src.CLI("CLUSTER", "SETSLOT", s, "MIGRATING", dstID)
		require.NoError(t, err)
		defer func() {
			for _, n := range []*redistest.Server{src, dst} {
				_, err := n.CLI("CLUSTER", "SETSLOT", s, "NODE", srcID)
				assert.NoError(t, err)
			}
		}()

		reply := rdb.EvalSha(ctx, "0000000000000000000000000000000000000000", []string{lim.stateKey(key), lim.stateKey(key) + blockSuffix})
		require.True(t, redis.IsTryAgainError(reply.Err()), "a call with the state key but not the block key: %v, want TRYAGAIN", reply.Err())
		// A key of the same slot with no state yet: ASK to the importing
		// node, which cannot run a call on two missing keys either.
		fresh := ""
		for i := 0; fresh == ""; i++ {
			if k := fmt.Sprintf("fresh%d", i); hashslot.Of(lim.stateKey(k)) == slot {
				fresh = k
			}
		}

		var migrating, calls, freshDegraded int
		for range 20 {
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			if res.Degraded {
				migrating++
			}
			res, err = lim.Allow(ctx, fresh)
			require.NoError(t, err, "a new key in the migrating slot")
			if res.Degraded {
				freshDegraded++
			}
			n, d := decideAll(nil)
			calls += n
			degraded += d
		}
		t.Logf("TRYAGAIN: %d of 20 calls for the migrating key degraded (%d for a new key of its slot); %d of %d calls for other keys degraded", migrating, freshDegraded, degraded, calls)
		assert.Equal(t, 20, migrating, "calls for the key whose slot migrates")
		assert.Zero(t, degraded, "other keys (%d on the migrating slot's master) sent to the fallback", len(byMaster[src]))
		assert.Empty(t, tr.list(), "TRYAGAIN marked a node down")
	})

	t.Run("failed master", func(t *testing.T) {
		victim := c.Masters[1]
		onVictim := map[string]bool{}
		for _, k := range byMaster[victim] {
			onVictim[k] = true
		}
		require.NoError(t, victim.Kill())
		killed := time.Now()
		var calls, degraded, victimDegraded int
		// Past cluster-node-timeout (2 s), when the others mark it failed.
		for time.Since(killed) < 3*time.Second {
			n, d := decideAll(onVictim)
			calls += n
			degraded += d
			for k := range onVictim {
				res, err := lim.Allow(ctx, k)
				require.NoError(t, err)
				if res.Degraded {
					victimDegraded++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("failed master: %d of %d calls for keys on the other masters degraded; %d calls for its own keys degraded", degraded, calls, victimDegraded)
		assert.Zero(t, degraded, "keys on healthy masters sent to the fallback")
		assert.Positive(t, victimDegraded, "keys of the failed master")
		got := tr.list()
		require.NotEmpty(t, got)
		assert.Equal(t, victim.Addr, got[0].Node, "the node marked down")

		require.NoError(t, victim.Restart())
		start := time.Now()
		require.Eventually(t, func() bool {
			_, d := decideAll(nil)
			return d == 0
		}, 10*time.Second, 20*time.Millisecond, "back on Redis after the restart")
		t.Logf("failed master: back on Redis %v after the restart", time.Since(start).Round(time.Millisecond))
	})
}

// A ring that loses one shard keeps the other shard's keys on Redis.
func TestScopeRingShard(t *testing.T) {
	testlane.MarkAlone(t)
	a, b := redistest.Start(t), redistest.Start(t)
	o := redistest.TunedOptions(a.Addr)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:              map[string]string{"a": a.Addr, "b": b.Addr},
		HeartbeatFrequency: 100 * time.Millisecond,
		DialTimeout:        o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolTimeout: o.PoolTimeout, MaxRetries: o.MaxRetries, DialerRetries: o.DialerRetries,
		ContextTimeoutEnabled: true,
	})
	defer ring.Close()
	var tr transitions
	lim := newLimiter(t, ring, TokenBucket, PerSecond(1000), WithOnTransition(tr.record))
	ctx := context.Background()
	shardOf := func(k string) string {
		s, err := ring.GetShardClientForKey(lim.stateKey(k))
		require.NoError(t, err)
		return s.Options().Addr
	}
	var onA, onB []string
	for i := 0; len(onA) < 4 || len(onB) < 4; i++ {
		k := fmt.Sprintf("key%d", i)
		if shardOf(k) == a.Addr {
			onA = append(onA, k)
		} else {
			onB = append(onB, k)
		}
	}
	require.NoError(t, a.Kill())
	killed := time.Now()
	var aDegraded, bDegraded, bCalls int
	for time.Since(killed) < time.Second {
		for _, k := range onA {
			res, err := lim.Allow(ctx, k)
			require.NoError(t, err)
			if res.Degraded {
				aDegraded++
			}
		}
		for _, k := range onB {
			res, err := lim.Allow(ctx, k)
			require.NoError(t, err)
			bCalls++
			if res.Degraded {
				bDegraded++
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("ring, one shard killed: %d of %d calls for the other shard's keys degraded; %d calls for its own keys degraded (until the heartbeat moved them)", bDegraded, bCalls, aDegraded)
	assert.Zero(t, bDegraded, "keys of the healthy shard sent to the fallback")
	assert.Positive(t, aDegraded, "keys of the killed shard")
	got := tr.list()
	require.NotEmpty(t, got)
	assert.Equal(t, a.Addr, got[0].Node)
}
