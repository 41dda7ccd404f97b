package redlimit

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/localsem"
)

// Tests of a Concurrency's in-process semaphores (FallbackLocal) at their
// default bound of 100,000 keys: how fast a full fallback answers, and
// what the semaphores cost and when they go.

// downConc returns a Concurrency of max 10 and ttl an hour on a miniredis
// that answers LOADING (a node marked down by the first call), and the
// miniredis.
func downConc(t *testing.T, opts ...Option) (*Concurrency, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	c := newConc(t, rdb, 10, time.Hour, opts...)
	m.SetError("LOADING Redis is loading the dataset in memory")
	l, res, err := c.TryAcquire(context.Background(), "first")
	require.NoError(t, err)
	require.True(t, res.Degraded, "the fallback answers: %+v", res)
	require.True(t, c.e.rescue.anyDown())
	require.NoError(t, l.Release(context.Background()))
	return c, m
}

// percentiles returns the median and the 99th percentile of ds.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}

// A full fallback answers at once: with every semaphore of the default
// 100,000 holding a lease, a new key is denied in microseconds (it looks at
// a few semaphores, not at its whole shard of 6,250 under the shard's
// lock), and the calls for keys that hold a lease, made meanwhile, are not
// held up.
func TestConcurrencyLimitFallbackFullFast(t *testing.T) {
	c, _ := downConc(t, WithPingInterval(time.Hour))
	ctx := context.Background()
	bound := defaultConfig().localKeys
	// downConc released the lease of "first", whose semaphore stays, idle:
	// were its shard the last to fill, the first new key of that shard
	// would take its place (a semaphore whose leases all ended may go).
	first, _, err := c.TryAcquire(ctx, "first")
	require.NoError(t, err)
	require.NotNil(t, first)
	held := []string{"first"}
	for i := 0; c.local.Len() < bound && i < 2*bound; i++ {
		key := fmt.Sprintf("held-%d", i)
		l, res, err := c.TryAcquire(ctx, key)
		require.NoError(t, err)
		require.True(t, res.Degraded)
		if l != nil {
			held = append(held, key)
		}
	}
	require.Equal(t, bound, c.local.Len(), "every semaphore")
	idle := 0
	c.local.Sweep(func(s *localsem.Sem) bool { // drops none
		if s.Live(c.e.cfg.now()) == 0 {
			idle++
		}
		return false
	})
	require.Zero(t, idle, "every semaphore holds a lease")

	const calls = 2000
	var (
		newKeys = make([]time.Duration, 0, calls)
		heldOps []time.Duration
		stop    = make(chan struct{})
		started = make(chan struct{}) // closed after its first call
		wg      sync.WaitGroup
	)
	begun := sync.OnceFunc(func() { close(started) })
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	// A require that fails below stops the goroutine too.
	defer halt()
	wg.Go(func() { // the calls for keys that hold a lease, meanwhile
		defer begun()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			l, res, err := c.TryAcquire(ctx, held[(i*7919)%len(held)])
			d := time.Since(start)
			if !assert.NoError(t, err) || !assert.True(t, res.Allowed, "a second lease of 10: %+v", res) {
				return
			}
			heldOps = append(heldOps, d)
			assert.NoError(t, l.Release(ctx))
			begun()
		}
	})
	<-started // on a busy machine the goroutine could start after the last new key
	for i := range calls {
		start := time.Now()
		l, res, err := c.TryAcquire(ctx, fmt.Sprintf("new-%d", i))
		newKeys = append(newKeys, time.Since(start))
		require.NoError(t, err)
		require.Nil(t, l, "a new key while every semaphore holds a lease: %+v", res)
		require.True(t, res.Degraded)
	}
	halt()
	require.NotEmpty(t, heldOps)
	n50, n99 := percentiles(newKeys)
	h50, h99 := percentiles(heldOps)
	t.Logf("full fallback (%d semaphores): a new key %v median, %v p99; meanwhile %d calls for keys holding a lease: %v median, %v p99",
		c.local.Len(), n50, n99, len(heldOps), h50, h99)
	assert.Less(t, n50, 500*time.Microsecond, "a new key's median call")
	assert.Less(t, h50, 500*time.Microsecond, "a held key's median call")
}

// heapAfterGC returns the heap's live bytes and in-use bytes after a
// collection.
func heapAfterGC() (alloc, inuse int64) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.HeapInuse)
}

// The in-process semaphores cost about 250 bytes a key (the caller's Lease
// apart), and what the outage made is freed once Redis answers again: the
// semaphores left idle at once, the ones holding a lease as each lease is
// released.
func TestConcurrencyLimitFallbackMemory(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{10, 5000, 100_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			alloc0, inuse0 := heapAfterGC()
			c, m := downConc(t, WithPingInterval(10*time.Millisecond))
			var leases []*Lease
			for i := range n {
				l, res, err := c.TryAcquire(ctx, fmt.Sprintf("user-%d", i))
				require.NoError(t, err)
				require.True(t, res.Degraded, "%+v", res)
				if l != nil {
					leases = append(leases, l)
				}
			}
			// 100,000 keys: a shard that more than its 6,250 fall into
			// denies the rest (each holds a lease).
			require.GreaterOrEqual(t, len(leases), n*99/100, "keys granted")
			keys := int64(len(leases))
			allocHeld, inuseHeld := heapAfterGC()
			for _, l := range leases[1:] {
				require.NoError(t, l.Release(ctx))
			}
			kept := leases[0] // held across the outage's end
			leases = nil
			allocIdle, inuseIdle := heapAfterGC()

			m.SetError("")
			require.Eventually(t, func() bool { return !c.e.rescue.anyDown() }, 5*time.Second, 5*time.Millisecond, "back on Redis")
			l, res, err := c.TryAcquire(ctx, "on-redis") // Redis answers
			require.NoError(t, err)
			require.False(t, res.Degraded)
			require.NoError(t, l.Release(ctx))
			idleGone := within(time.Second, func() bool { return c.local.Len() <= 1 })
			left := c.local.Len()
			allocBack, inuseBack := heapAfterGC()
			require.NoError(t, kept.Release(ctx))
			allGone := within(time.Second, func() bool { return c.local.Len() == 0 })
			runtime.KeepAlive(c)

			per := func(b int64) int64 { return b / keys }
			t.Logf("%d keys: %d B a key with its lease held (HeapAlloc +%.2f MB, HeapInuse +%.2f MB); %d B a key idle (+%.2f MB, +%.2f MB); a second after Redis answers, %d semaphores left, +%.2f MB, +%.2f MB",
				keys, per(allocHeld-alloc0), mb(allocHeld-alloc0), mb(inuseHeld-inuse0), per(allocIdle-alloc0), mb(allocIdle-alloc0), mb(inuseIdle-inuse0),
				left, mb(allocBack-alloc0), mb(inuseBack-inuse0))
			assert.True(t, idleGone, "the idle semaphores dropped once Redis answers: %d left", left)
			assert.True(t, allGone, "the last semaphore dropped with its lease: %d left", c.local.Len())
			if n == 100_000 {
				assert.LessOrEqual(t, per(allocIdle-alloc0), int64(300), "bytes a semaphore")
				assert.Less(t, allocBack-alloc0, (allocIdle-alloc0)/10, "left once Redis answered")
			}
		})
	}
}

// within reports whether f becomes true within d, asked every 5 ms.
func within(d time.Duration, f func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if f() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
