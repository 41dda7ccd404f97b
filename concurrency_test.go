package redlimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	"github.com/redlimit/redlimit/internal/testlane"
)

// Tests of Concurrency (concurrency.go). Their names start with
// TestConcurrencyLimit: TestConcurrencyRedis and TestConcurrencyCluster are
// the rate limiters' load tests.

// newConc builds a Concurrency and closes it at the end of the test.
func newConc(t testing.TB, rdb redis.UniversalClient, maxHolders int, ttl time.Duration, opts ...Option) *Concurrency {
	t.Helper()
	c, err := NewConcurrency(rdb, maxHolders, ttl, opts...)
	require.NoError(t, err, "NewConcurrency(%d, %v)", maxHolders, ttl)
	t.Cleanup(func() { c.Close() })
	return c
}

// mustTry takes a lease, which must be granted.
func mustTry(t *testing.T, c *Concurrency, key string) (*Lease, Result) {
	t.Helper()
	l, res, err := c.TryAcquire(context.Background(), key)
	require.NoError(t, err)
	require.True(t, res.Allowed, "TryAcquire(%q) denied: %+v", key, res)
	require.NotNil(t, l)
	return l, res
}

// onRedis reports whether a lease is held in Redis (not in process).
func (l *Lease) onRedis() bool { return l.sem == nil && !l.free }

func TestConcurrencyLimitValidation(t *testing.T) {
	b, _ := miniBackend(t)
	tests := []struct {
		name string
		max  int
		ttl  time.Duration
		opts []Option
		ok   bool
	}{
		{"one", 1, time.Millisecond, nil, true},
		{"largest", MaxConcurrency, MaxLeaseTTL, nil, true},
		{"max 0", 0, time.Second, nil, false},
		{"max negative", -1, time.Second, nil, false},
		{"max too large", MaxConcurrency + 1, time.Second, nil, false},
		{"ttl 0", 1, 0, nil, false},
		{"ttl negative", 1, -time.Second, nil, false},
		{"ttl below 1ms", 1, 999 * time.Microsecond, nil, false},
		{"ttl too long", 1, MaxLeaseTTL + time.Second, nil, false},
		{"ttl not whole µs", 1, time.Second + 1, nil, false},
		{"bad option", 1, time.Second, []Option{WithFallbackShare(0)}, false},
		{"block", 1, time.Second, []Option{WithBlock(time.Second)}, false},
		{"deny cache", 1, time.Second, []Option{WithDenyCache(10)}, false},
		{"shadow", 1, time.Second, []Option{WithShadow()}, false},
		{"limit func", 3, time.Second, []Option{WithLimitFunc(func(context.Context, string) (Limit, error) { return Limit{}, nil })}, true}, // "one" and "largest" hold one each on the fixed clock
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewConcurrency(b.rdb, tt.max, tt.ttl, tt.opts...)
			if !tt.ok {
				want := ErrInvalidLimit // max and ttl are the limit
				if tt.opts != nil {
					want = ErrInvalidArgument // an option that cannot work, or does not apply
				}
				require.ErrorIs(t, err, want)
				assert.True(t, strings.HasPrefix(err.Error(), "redlimit: "), "error %q lacks the package prefix", err)
				return
			}
			require.NoError(t, err)
			defer c.Close()
			_, res, err := c.TryAcquire(context.Background(), "k")
			require.NoError(t, err)
			require.True(t, res.Allowed)
		})
	}
	_, err := NewConcurrency(nil, 1, time.Second)
	require.ErrorIs(t, err, ErrInvalidArgument, "nil client")
	_, err = NewConcurrency(b.rdb, 1, time.Second, nil)
	require.ErrorIs(t, err, ErrInvalidArgument, "nil option")

	c := newConc(t, b.rdb, 1, time.Second)
	_, _, err = c.TryAcquire(context.Background(), "")
	require.ErrorIs(t, err, ErrInvalidArgument, "empty key")
	_, err = c.Acquire(context.Background(), "")
	require.ErrorIs(t, err, ErrInvalidArgument, "empty key")
	var nilLease *Lease
	require.NoError(t, nilLease.Release(context.Background()))
	require.ErrorIs(t, nilLease.Extend(context.Background()), ErrInvalidArgument)
}

// Results step by step on an exact clock; the key's TTL follows the latest
// lease on every acquire, not only the first (a peer's bug let the key
// expire under a live lease).
func TestConcurrencyLimitResults(t *testing.T) {
	b, m := miniBackend(t)
	ctx := context.Background()
	c := newConc(t, b.rdb, 2, time.Second, WithPrefix("cc"))
	key := "a{b}"
	state := "cc:{a%7Bb%7D}:cc"
	limit := Limit{Rate: 2, Period: time.Second, Burst: 2}

	a, res := mustTry(t, c, key)
	require.Equal(t, Result{Allowed: true, Limit: limit, Remaining: 1, ResetAfter: time.Second, RuleResetAfter: time.Second}, res)
	require.Equal(t, time.Second, m.TTL(state), "TTL after the first acquire")

	b.advance(100 * time.Millisecond)
	_, res = mustTry(t, c, key)
	require.Equal(t, Result{Allowed: true, Limit: limit, Remaining: 0, ResetAfter: time.Second, RuleResetAfter: time.Second}, res)
	require.Equal(t, time.Second, m.TTL(state), "TTL after the second acquire: the latest lease's")

	b.advance(100 * time.Millisecond)
	l, res, err := c.TryAcquire(ctx, key)
	require.NoError(t, err)
	require.Nil(t, l)
	require.Equal(t, Result{Limit: limit, RetryAfter: 800 * time.Millisecond, ResetAfter: 900 * time.Millisecond, RuleResetAfter: 900 * time.Millisecond}, res,
		"denied: retry when the oldest lease expires, reset when the latest does")

	require.NoError(t, a.Release(ctx))
	c1, res := mustTry(t, c, key)
	require.Equal(t, Result{Allowed: true, Limit: limit, Remaining: 0, ResetAfter: time.Second, RuleResetAfter: time.Second}, res)

	// At 1.15 s the lease taken at 0.1 s has expired; the one taken at 0.2 s
	// (c1) has not: the key is still there, with its TTL.
	b.advance(950 * time.Millisecond)
	require.Equal(t, 50*time.Millisecond, m.TTL(state))
	_, res = mustTry(t, c, key)
	require.Equal(t, Result{Allowed: true, Limit: limit, Remaining: 0, ResetAfter: time.Second, RuleResetAfter: time.Second}, res)
	members, err := b.rdb.ZRange(ctx, state, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, members, 2, "the expired lease was pruned")
	require.Contains(t, members, c1.id)

	// Every lease gone: the key is gone (its TTL never outlives the latest lease).
	b.advance(time.Second)
	require.False(t, m.Exists(state), "key left after its last lease expired")
}

// Extend keeps a lease past its ttl; an expired lease cannot be extended;
// Release is idempotent and harmless after expiry.
func TestConcurrencyLimitExtendRelease(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := context.Background()
	c := newConc(t, b.rdb, 1, time.Second)

	l, _ := mustTry(t, c, "job")
	for range 5 { // 4 s in all, 4 × the ttl
		b.advance(800 * time.Millisecond)
		require.NoError(t, l.Extend(ctx))
	}
	_, res, err := c.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.False(t, res.Allowed, "the extended lease was lost")
	require.Equal(t, time.Second, res.RetryAfter, "RetryAfter after an extend: the renewed ttl")

	b.advance(time.Second) // exactly the ttl: expired
	require.ErrorIs(t, l.Extend(ctx), ErrLeaseExpired)
	require.ErrorIs(t, l.Extend(ctx), ErrLeaseExpired, "and again")

	// The slot is someone else's now; the old lease's Release must not free it.
	other, _ := mustTry(t, c, "job")
	require.NoError(t, l.Release(ctx), "Release after expiry")
	_, res, err = c.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.False(t, res.Allowed, "releasing an expired lease freed another holder's slot")

	// Release twice frees one slot, once.
	c2 := newConc(t, b.rdb, 2, time.Second, WithPrefix("two"))
	x, _ := mustTry(t, c2, "k")
	mustTry(t, c2, "k")
	require.NoError(t, x.Release(ctx))
	require.NoError(t, x.Release(ctx), "second Release")
	mustTry(t, c2, "k")
	_, res, err = c2.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed, "a second Release freed a second slot")
	require.ErrorIs(t, x.Extend(ctx), ErrLeaseExpired, "Extend after Release")

	// After Close: no new leases, no extends; releases still work.
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "second Close")
	_, _, err = c.TryAcquire(ctx, "job")
	require.ErrorIs(t, err, ErrClosed)
	_, err = c.Acquire(ctx, "job")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, other.Extend(ctx), ErrClosed)
	require.NoError(t, other.Release(ctx))
	n, err := b.rdb.ZCard(ctx, c.e.stateKey("job", &c.e.own.rules[0])).Result()
	require.NoError(t, err)
	require.Zero(t, n, "Release after Close left the lease")
}

// A deferred Release whose context was cancelled still frees the slot.
func TestConcurrencyLimitReleaseCancelledContext(t *testing.T) {
	m := miniredis.RunT(t)
	c := newConc(t, tunedClient(t, m.Addr()), 1, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	l, _, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	cancel()
	require.NoError(t, l.Release(ctx))
	mustTry(t, c, "k")
}

// With WithClientClock the leases live on the corrected client clock: the
// script gets the time, and the offset to the server's TIME is measured.
func TestConcurrencyLimitClientClock(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := context.Background()
	client := simAt(t0.Add(-time.Hour)) // an hour behind the server; read by measurements in the background too
	c := newConc(t, b.rdb, 1, time.Second, WithClientClock(), withClock(client.now))
	l, res := mustTry(t, c, "k")
	require.Equal(t, time.Second, res.ResetAfter)
	state := c.e.stateKey("k", &c.e.own.rules[0])
	score, err := b.rdb.ZScore(ctx, state, l.id).Result()
	require.NoError(t, err)
	require.Equal(t, float64(t0.Add(time.Second).UnixMicro()), score, "expiry on the corrected clock")

	// The client's clock moves 2 s, the server's does not: they disagree,
	// and the lease set decides on its key's time, which its expiry keeps
	// on the server's clock: the lease is live. (The script took the
	// client's time: expired.)
	client.add(2 * time.Second)
	require.NoError(t, l.Extend(ctx))
	// Both move 2 s: expired.
	client.add(2 * time.Second)
	b.advance(2 * time.Second)
	require.ErrorIs(t, l.Extend(ctx), ErrLeaseExpired)
}

// WithObserver sees every try, with Strategy 0.
func TestConcurrencyLimitObserver(t *testing.T) {
	b, _ := miniBackend(t)
	var rec recorder[Decision]
	c := newConc(t, b.rdb, 1, time.Second, WithObserver(rec.record))
	mustTry(t, c, "k")
	_, _, err := c.TryAcquire(context.Background(), "k")
	require.NoError(t, err)
	got := rec.list()
	require.Len(t, got, 2)
	for i, d := range got {
		assert.Equal(t, Strategy(0), d.Strategy, "decision %d", i)
		assert.Equal(t, "k", d.Key)
		assert.Equal(t, 1, d.N)
		assert.False(t, d.Degraded)
		assert.NoError(t, d.Err)
	}
	assert.True(t, got[0].Allowed)
	assert.Equal(t, NotDenied, got[0].DeniedBy)
	assert.False(t, got[1].Allowed)
	assert.Equal(t, DeniedByLimit, got[1].DeniedBy)
}

// Acquire wakes at once when this process releases a lease of the key:
// with the poll set to an hour, only the wake-up can end the wait.
func TestConcurrencyLimitAcquireWakes(t *testing.T) {
	m := miniredis.RunT(t)
	c := newConc(t, tunedClient(t, m.Addr()), 1, time.Minute)
	c.poll = time.Hour
	held, _ := mustTry(t, c, "k")
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), "k")
		if err == nil && l == nil {
			err = fmt.Errorf("nil lease")
		}
		got <- err
	}()
	waitForWaiter(t, c, "k")
	time.Sleep(20 * time.Millisecond) // let it be denied and wait
	start := time.Now()
	require.NoError(t, held.Release(context.Background()))
	select {
	case err := <-got:
		require.NoError(t, err)
		t.Logf("Acquire returned %v after the release", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire still waiting 5s after the release")
	}
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	require.Empty(t, c.waits, "a waiter was left registered")
}

func waitForWaiter(t *testing.T, c *Concurrency, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.waitMu.Lock()
		defer c.waitMu.Unlock()
		return c.waits[key] != nil
	}, 5*time.Second, time.Millisecond)
}

// A slot freed by another process (here another instance, whose release
// wakes nobody here) is found by polling, within about the poll interval,
// and the poll is not busy.
func TestConcurrencyLimitAcquirePolls(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	var tries atomic.Int64
	waiter := newConc(t, rdb, 1, time.Minute, WithObserver(func(Decision) { tries.Add(1) }))
	holder := newConc(t, rdb, 1, time.Minute)
	held, _ := mustTry(t, holder, "k")
	got := make(chan time.Time, 1)
	go func() {
		if _, err := waiter.Acquire(context.Background(), "k"); err == nil {
			got <- time.Now()
		}
		close(got)
	}()
	const wait = 500 * time.Millisecond
	time.Sleep(wait)
	n := tries.Load()
	released := time.Now()
	require.NoError(t, held.Release(context.Background()))
	at, ok := <-got
	require.True(t, ok, "Acquire failed")
	took := at.Sub(released)
	t.Logf("%d tries in %v; the slot was taken %v after its release", n, wait, took)
	// Each wait is at least acquirePollInterval/2: at most wait/25ms + 1 tries.
	assert.LessOrEqual(t, n, int64(wait/(acquirePollInterval/2))+1, "busy polling")
	assert.GreaterOrEqual(t, n, int64(3), "too few tries")
	assert.LessOrEqual(t, took, acquirePollInterval+500*time.Millisecond, "slot found late (margin 500ms: 2 busy cores)")
}

// Acquire respects the context's deadline, and Close ends it.
func TestConcurrencyLimitAcquireEnds(t *testing.T) {
	m := miniredis.RunT(t)
	c := newConc(t, tunedClient(t, m.Addr()), 1, time.Minute)
	mustTry(t, c, "k")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	l, err := c.Acquire(ctx, "k")
	took := time.Since(start)
	require.Nil(t, l)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, took, 100*time.Millisecond)
	assert.LessOrEqual(t, took, 600*time.Millisecond, "Acquire overran its deadline (margin 500ms: 2 busy cores)")

	c.poll = time.Hour
	got := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), "k")
		got <- err
	}()
	waitForWaiter(t, c, "k")
	require.NoError(t, c.Close())
	select {
	case err := <-got:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire still waiting 5s after Close")
	}
}

// While Redis is down: an in-process semaphore of floor(max × share) per
// key, whose slots the Redis leases held here take until released; a Redis
// lease cannot be extended, and its release is made again once Redis is
// back; in-process leases release in process, also after Redis is back.
func TestConcurrencyLimitFallbackLocal(t *testing.T) {
	verifyNoLeak(t) // the monitor stops when Redis is back, and at Close
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	ctx := context.Background()
	var tr transitions
	c := newConc(t, rdb, 10, time.Minute, WithFallbackShare(0.25), WithPingInterval(20*time.Millisecond), WithOnTransition(tr.record))
	require.Equal(t, 2, fallbackCapacity(10, 0.25), "floor(10 × 0.25)")
	onRedis, res := mustTry(t, c, "k")
	require.False(t, res.Degraded)
	state := c.e.stateKey("k", &c.e.own.rules[0])

	m.Close()
	require.ErrorIs(t, onRedis.Extend(ctx), ErrUnavailable, "Extend of a Redis lease, Redis down")
	require.True(t, c.e.rescue.anyDown())
	l1, res := mustTry(t, c, "k")
	require.True(t, res.Degraded)
	require.Equal(t, 0, res.Remaining, "capacity 2, one slot the Redis lease's")
	require.Equal(t, time.Minute, res.ResetAfter)
	require.False(t, l1.onRedis())
	l, res, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, l, "a second in-process lease beside the Redis lease, capacity 2")
	require.True(t, res.Degraded)
	require.InDelta(t, time.Minute, res.RetryAfter, float64(time.Second), "RetryAfter: the oldest lease's expiry")
	require.ErrorIs(t, onRedis.Extend(ctx), ErrUnavailable)

	require.NoError(t, onRedis.Release(ctx), "Release of a Redis lease during the outage")
	l2, _ := mustTry(t, c, "k")
	require.False(t, l2.onRedis())
	require.NoError(t, l1.Release(ctx))
	l3, _ := mustTry(t, c, "k")
	require.NoError(t, l3.Extend(ctx), "Extend of an in-process lease")

	require.NoError(t, m.Restart())
	require.Eventually(t, func() bool { return !c.e.rescue.anyDown() }, 5*time.Second, 5*time.Millisecond, "back on Redis")
	got := tr.list()
	require.Len(t, got, 2)
	require.Equal(t, Strategy(0), got[0].Strategy)

	// The release made during the outage is made again once Redis is back
	// (it held its slot until its ttl ended).
	require.Eventually(t, func() bool {
		_, err := rdb.ZScore(ctx, state, onRedis.id).Result()
		return errors.Is(err, redis.Nil)
	}, 5*time.Second, 5*time.Millisecond, "the Redis lease released during the outage is released in Redis once it is back")
	onRedis2, res := mustTry(t, c, "k")
	require.True(t, onRedis2.onRedis())
	require.Equal(t, 9, res.Remaining, "the slot of the release made during the outage is free")

	// In-process leases release in process after Redis is back, and the
	// semaphore that held them goes with the last.
	sem := l2.sem
	require.NoError(t, l2.Release(ctx))
	assert.Equal(t, 1, c.local.Len(), "a lease left on the semaphore")
	require.NoError(t, l3.Release(ctx))
	require.Zero(t, sem.Live())
	require.True(t, sem.Dead())
	assert.Zero(t, c.local.Len(), "the semaphore dropped with its last lease")
	require.NoError(t, onRedis2.Release(ctx))
}

// The other policies, for TryAcquire and for a Redis lease's Release.
func TestConcurrencyLimitFallbackPolicies(t *testing.T) {
	for _, p := range []FallbackPolicy{FallbackAllow, FallbackDeny, FallbackError} {
		t.Run(p.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			ctx := context.Background()
			c := newConc(t, tunedClient(t, m.Addr()), 1, time.Minute, WithFallback(p), WithPingInterval(time.Hour))
			held, _ := mustTry(t, c, "k")
			m.Close()
			for i := range 3 {
				l, res, err := c.TryAcquire(ctx, "k")
				switch p {
				case FallbackAllow:
					require.NoError(t, err)
					require.True(t, res.Allowed && res.Degraded, "try %d: %+v", i, res)
					require.NoError(t, l.Extend(ctx))
					require.NoError(t, l.Release(ctx))
				case FallbackDeny:
					require.NoError(t, err)
					require.Nil(t, l)
					require.Equal(t, Result{Limit: c.limit, RetryAfter: time.Hour, ResetAfter: time.Hour, RuleResetAfter: time.Hour, Degraded: true}, res)
				case FallbackError:
					require.ErrorIs(t, err, ErrUnavailable)
					require.Contains(t, err.Error(), "connect", "the error does not tell the cause")
				}
			}
			err := held.Release(ctx)
			if p == FallbackError {
				require.ErrorIs(t, err, ErrUnavailable)
			} else {
				require.NoError(t, err)
			}
			require.NoError(t, held.Release(ctx), "second Release")
		})
	}
}

func TestFallbackCapacity(t *testing.T) {
	tests := []struct {
		max   int
		share float64
		want  int
	}{
		{10, 1, 10}, {10, 0.25, 2}, {100, 0.25, 25}, {30, 1.0 / 3, 10}, {10, 0.1, 1}, {3, 0.25, 1}, {1, 0.01, 1},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, fallbackCapacity(tt.max, tt.share), "max %d share %v", tt.max, tt.share)
	}
}

// testLiveLeases runs 64 goroutines for 5 s that take a lease (Acquire),
// hold it 0-20 ms and release it, on one key of max 8, and checks that no
// more than max are ever held: counted by the clients (incremented after
// Acquire returns, decremented before Release) and by Redis (ZCARD of the
// key, sampled by a goroutine; with a ttl of 30 s no lease expires during
// the run, so every member is live).
func testLiveLeases(t *testing.T, rdb redis.UniversalClient) {
	const (
		maxLeases  = 8
		goroutines = 64
		runFor     = 5 * time.Second
	)
	var tr transitions
	c := newConc(t, rdb, maxLeases, 30*time.Second, WithPrefix(prefixFor(t)), WithOnTransition(tr.record))
	key := "hot"
	state := c.e.stateKey(key, &c.e.own.rules[0])
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()

	var (
		held, clientMax, acquired atomic.Int64
		errMu                     sync.Mutex
		errs                      []error
		wg                        sync.WaitGroup
	)
	fail := func(err error) {
		errMu.Lock()
		if len(errs) < 5 {
			errs = append(errs, err)
		}
		errMu.Unlock()
	}
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for ctx.Err() == nil {
				l, err := c.Acquire(ctx, key)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) { // the run's end
						fail(err)
					}
					return
				}
				if !l.onRedis() {
					fail(fmt.Errorf("a lease not from Redis"))
				}
				acquired.Add(1)
				n := held.Add(1)
				for {
					m := clientMax.Load()
					if n <= m || clientMax.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Duration(rng.IntN(21)) * time.Millisecond)
				held.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					fail(err)
				}
			}
		})
	}
	var redisMax, samples int64
	wg.Go(func() {
		for ctx.Err() == nil {
			n, err := rdb.ZCard(context.Background(), state).Result()
			if err != nil {
				fail(err)
				return
			}
			samples++
			redisMax = max(redisMax, n)
		}
	})
	wg.Wait()
	require.Empty(t, tr.list(), "fell back to the in-process semaphore")
	require.Empty(t, errs)
	t.Logf("%d leases taken; most held at once: %d by the clients, %d in Redis (%d samples); max %d",
		acquired.Load(), clientMax.Load(), redisMax, samples, maxLeases)
	require.LessOrEqual(t, clientMax.Load(), int64(maxLeases), "clients held more than max")
	require.LessOrEqual(t, redisMax, int64(maxLeases), "Redis held more than max")
	require.Equal(t, int64(maxLeases), clientMax.Load(), "the run never used every slot: not a test of the limit")
	require.Greater(t, samples, int64(100))
	require.False(t, c.e.rescue.anyDown(), "fell back during the run")
	// The acquires that the run's end cut short give their leases back in
	// the background.
	var n int64
	require.Eventually(t, func() bool {
		var err error
		n, err = rdb.ZCard(context.Background(), state).Result()
		return err == nil && n == 0
	}, 2*time.Second, 5*time.Millisecond, "leases left after every one was released: %d", n)
}

func TestConcurrencyLimitLiveRedis(t *testing.T) {
	opts := redistest.TunedOptions(realServer(t).Addr)
	// 65 goroutines dialling at once under -race on 2 busy cores: the
	// tuned 100 ms timeouts can fire and the run would fall back.
	opts.DialTimeout, opts.PoolTimeout = time.Second, time.Second
	opts.ReadTimeout, opts.WriteTimeout = time.Second, time.Second
	opts.PoolSize = 80
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	testLiveLeases(t, rdb)
}

func TestConcurrencyLimitLiveCluster(t *testing.T) {
	opts := redistest.TunedClusterOptions(realCluster(t).Addrs())
	opts.DialTimeout, opts.PoolTimeout = time.Second, time.Second // as above
	opts.ReadTimeout, opts.WriteTimeout = time.Second, time.Second
	opts.PoolSize = 80
	rdb := redis.NewClusterClient(opts)
	t.Cleanup(func() { rdb.Close() })
	testLiveLeases(t, rdb)
}

// Environment of the holder child process (TestHelperConcurrencyHolder).
const (
	holderAddrEnv   = "REDLIMIT_HOLDER_ADDR"
	holderPrefixEnv = "REDLIMIT_HOLDER_PREFIX"
)

const (
	holderMax = 4
	holderTTL = time.Second
)

// TestHelperConcurrencyHolder is not a test: TestConcurrencyLimitHolderKilled
// runs it in a child process (this test binary again) that takes every slot
// of a key, says "held", and keeps its leases alive with Extend every ttl/4
// until it is killed.
func TestHelperConcurrencyHolder(t *testing.T) {
	addr := os.Getenv(holderAddrEnv)
	if addr == "" {
		t.Skip("run by TestConcurrencyLimitHolderKilled")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c, err := NewConcurrency(rdb, holderMax, holderTTL, WithPrefix(os.Getenv(holderPrefixEnv)))
	require.NoError(t, err)
	ctx := context.Background()
	var leases []*Lease
	for range holderMax {
		l, res, err := c.TryAcquire(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
		leases = append(leases, l)
	}
	fmt.Println("held")
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		time.Sleep(holderTTL / 4)
		for _, l := range leases {
			if err := l.Extend(ctx); err != nil {
				fmt.Println("extend:", err)
			}
		}
	}
}

// A process holding every slot is SIGKILLed: all the slots come back
// within the ttl (the leases it kept extending expire), plus Acquire's poll
// interval, plus a 100 ms margin for a busy machine (-race, 2 shared
// cores).
func TestConcurrencyLimitHolderKilled(t *testing.T) {
	testlane.MarkAlone(t)
	s := realServer(t)
	prefix := prefixFor(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperConcurrencyHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderAddrEnv+"="+s.Addr, holderPrefixEnv+"="+prefix)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = cmd.Wait() // killed: an error, as expected
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case line := <-lines:
		require.Equal(t, "held", line, "the holder said")
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not take its leases within 30s")
	}

	rdb := tunedClient(t, s.Addr)
	c := newConc(t, rdb, holderMax, holderTTL, WithPrefix(prefix))
	ctx := context.Background()
	// The holder keeps its leases alive past their ttl.
	time.Sleep(holderTTL * 3 / 2)
	l, res, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, l, "a slot was free while the holder was alive and extending: %+v", res)

	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	killed := time.Now()
	actx, cancel := context.WithTimeout(ctx, 10*holderTTL)
	defer cancel()
	// Every slot, not only one (the holder's leases expire microseconds
	// apart, as it extended them one after the other).
	var first time.Duration
	for i := range holderMax {
		l, err = c.Acquire(actx, "k")
		require.NoError(t, err, "slot %d", i+1)
		require.NotNil(t, l)
		if i == 0 {
			first = time.Since(killed)
		}
	}
	back := time.Since(killed)
	bound := holderTTL + acquirePollInterval + 500*time.Millisecond // margin: 2 busy cores
	t.Logf("capacity back %v after the SIGKILL (first slot %v; ttl %v, holder extending every %v; bound %v)",
		back, first, holderTTL, holderTTL/4, bound)
	require.LessOrEqual(t, back, bound)
	require.GreaterOrEqual(t, first, holderTTL/2, "slots came back before the holder's last extend could expire")
	for line := range drain(lines) {
		assert.NotContains(t, line, "extend:", "the holder failed to extend")
	}
}

// drain returns what is already in ch, without waiting.
func drain(ch chan string) map[string]bool {
	got := map[string]bool{}
	for {
		select {
		case s, ok := <-ch:
			if !ok {
				return got
			}
			got[s] = true
		default:
			return got
		}
	}
}

// Redis memory of one key, by live leases (MEMORY USAGE … SAMPLES 0, exact).
func TestConcurrencyLimitMemory(t *testing.T) {
	rdb := tunedClient(t, realServer(t).Addr)
	ctx := context.Background()
	c := newConc(t, rdb, MaxConcurrency, time.Minute, WithPrefix(prefixFor(t)))
	// The bound: up to 128 leases the set is a listpack (16-byte ids,
	// integer scores), at most 150 bytes plus 40 a lease; beyond, a
	// skiplist and a dict, at most 130 bytes a lease. (Measured on Redis
	// 7.0.15: 136, 408, 3,160 and 117,920 bytes.)
	bound := func(n int) int64 {
		if n <= 128 {
			return 150 + 40*int64(n)
		}
		return 130 * int64(n)
	}
	for _, n := range []int{1, 10, 100, 1000} {
		key := "user:" + strconv.Itoa(n)
		for range n {
			mustTry(t, c, key)
		}
		state := c.e.stateKey(key, &c.e.own.rules[0])
		bytes, err := rdb.MemoryUsage(ctx, state, 0).Result()
		require.NoError(t, err)
		t.Logf("%4d live leases: %6d bytes (%.1f a lease)", n, bytes, float64(bytes)/float64(n))
		assert.LessOrEqual(t, bytes, bound(n), "%d leases", n)
	}
}

// cancelAfterScript cancels the caller's context just after the next
// script that ran in Redis, and makes the call fail as if the reply had
// come too late.
type cancelAfterScript struct {
	passHooks // only ProcessHook does something
	cancel    context.CancelFunc
	armed     atomic.Bool
}

func (h *cancelAfterScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		script := cmd.Name() == "evalsha" || cmd.Name() == "eval"
		if err == nil && script && h.armed.CompareAndSwap(true, false) {
			h.cancel()
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}
}

// An acquire whose context ends after the script ran gives its lease back
// (in the background): the slot is not lost until the ttl.
func TestConcurrencyLimitAcquireCancelledUndone(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	c := newConc(t, rdb, 1, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	hook := &cancelAfterScript{cancel: cancel}
	rdb.AddHook(hook)
	hook.armed.Store(true)
	l, _, err := c.TryAcquire(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, l)
	require.False(t, hook.armed.Load(), "the hook did not fire")
	require.Eventually(t, func() bool { return liveLeases(t, rdb, c, "k") == 0 },
		time.Second, time.Millisecond, "the lease of the cancelled acquire is still in Redis")
	mustTry(t, c, "k")
}

// A Lease that Acquire did not return (its zero value) is an error, not a
// panic; a nil one is harmless to release.
func TestZeroLease(t *testing.T) {
	ctx := context.Background()
	var l Lease
	require.ErrorIs(t, l.Release(ctx), ErrInvalidArgument)
	require.ErrorIs(t, l.Extend(ctx), ErrInvalidArgument)
	var nl *Lease
	require.NoError(t, nl.Release(ctx))
	require.ErrorIs(t, nl.Extend(ctx), ErrInvalidArgument)
}

// Expired leases go at most 16 a call, so that one acquire never clears a
// large batch at once (100,000 expiring together took one acquire 24.5
// ms); until they go they hold no slot, a denial's RetryAfter skips them,
// and an expired lease is never extended back to life.
func TestConcurrencyExpiredGoGradually(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	big := newConc(t, b.rdb, 1000, time.Minute, WithPrefix("expired"))
	small := newConc(t, b.rdb, 2, time.Minute, WithPrefix("expired"))
	var first *Lease
	for i := range 100 {
		l, _ := mustTry(t, big, "k")
		if i == 0 {
			first = l
		}
	}
	b.advance(30 * time.Second)
	mustTry(t, big, "k") // live until 1m30s; keeps the set alive
	b.advance(45 * time.Second)
	// 100 expired at 1m, one live: small (max 2) has one slot.
	key := small.e.stateKey("k", &small.e.own.rules[0])
	mustTry(t, small, "k")
	n, err := b.rdb.ZCard(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(101-16+1), n, "leases kept after one acquire")
	l, res, err := small.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, l, "a third live lease on max 2: %+v", res)
	assert.Equal(t, 15*time.Second, res.RetryAfter, "until the older live lease expires, at 1m30s: %+v", res)
	require.ErrorIs(t, first.Extend(ctx), ErrLeaseExpired, "an expired lease still in the set")
	score, err := b.rdb.ZScore(ctx, key, first.id).Result()
	assert.ErrorIs(t, err, redis.Nil, "the expired lease was extended back: score %v", score)
}

// In the fallback, a key's in-process semaphore that holds a lease is never
// dropped for other keys' (its key came back with every slot free: a
// second holder of a max-1 key, for an attacker who sends 200 other keys);
// with every semaphore holding one, a new key is denied instead.
func TestConcurrencyLimitFallbackKeepsHeld(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	ctx := context.Background()
	c := newConc(t, rdb, 1, time.Minute, WithFallbackKeys(16), WithPingInterval(time.Hour))
	m.Close()
	first, res, err := c.TryAcquire(ctx, "victim")
	require.NoError(t, err)
	require.True(t, res.Allowed && res.Degraded, "%+v", res)
	granted, denied := 0, 0
	for i := range 200 {
		l, res, err := c.TryAcquire(ctx, fmt.Sprintf("other-%d", i))
		require.NoError(t, err)
		require.True(t, res.Degraded, "%+v", res)
		if l != nil {
			granted++
		} else {
			denied++
			assert.Positive(t, res.RetryAfter, "a denial says when to retry: %+v", res)
		}
	}
	assert.Positive(t, granted, "other keys got leases while there was room")
	assert.Positive(t, denied, "other keys were denied once every semaphore held a lease")
	second, res, err := c.TryAcquire(ctx, "victim")
	require.NoError(t, err)
	assert.Nil(t, second, "max 1 with a live lease, yet a second was granted: %+v", res)
	require.NoError(t, first.Extend(ctx), "the first lease is live")
	require.NoError(t, first.Release(ctx))
	third, res, err := c.TryAcquire(ctx, "victim")
	require.NoError(t, err)
	assert.NotNil(t, third, "after the release, the slot is free: %+v", res)
}
