package redlimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/hashslot"
)

// Keys, n and used come from clients (a header, a request's declared
// size): on the newer limiters (calendar quotas, warm-up buckets, priority
// shares, concurrency, a policy's written-out script) a bad one is an
// error wrapping the documented sentinel, never a panic, and changes
// nothing in Redis.

// hostileLimiter is one of the newer limiters on its own miniredis (a
// RateLimiter's or a Policy's engine), and the context its calls are made
// with (a priority).
type hostileLimiter struct {
	name   string
	lim    *engine
	m      *miniredis.Miniredis
	ctx    context.Context
	most   int // the most n a call may ask for: its capacity, or its share
	states int // the Redis keys of one limited key: one per rule
}

func hostileLimiters(t *testing.T) []hostileLimiter {
	t.Helper()
	tokyo := loadZone(t, "Asia/Tokyo")
	sheddable := ContextWithPriority(context.Background(), Sheddable)
	var out []hostileLimiter
	for _, c := range []struct {
		name string
		s    Strategy
		l    Limit
		ctx  context.Context
		most int
		opts []Option
	}{
		{"daily", FixedWindow, Daily(5, tokyo), context.Background(), 5, nil},
		{"monthly", FixedWindow, Monthly(5, nil, 31), context.Background(), 5, nil},
		{"warm-token-bucket", TokenBucket, Limit{Rate: 5, Period: time.Second, WarmUp: 10 * time.Second}, context.Background(), 5, nil},
		{"warm-leaky-bucket", LeakyBucket, Limit{Rate: 5, Period: time.Second, Burst: 5, WarmUp: 10 * time.Second}, context.Background(), 5, nil},
		{"sheddable-share", FixedWindow, PerMinute(10), sheddable, 5, []Option{WithPriorityShares(0.5, 0.8)}},
		{"sheddable-share-daily", FixedWindow, Daily(10, tokyo), sheddable, 5, []Option{WithPriorityShares(0.5, 0.8)}},
	} {
		b, m := miniBackend(t)
		out = append(out, hostileLimiter{c.name, &newLimiter(t, b.rdb, c.s, c.l, c.opts...).engine, m, c.ctx, c.most, 1})
	}
	// A policy on the script written out for its rules (policySource).
	b, m := miniBackend(t) // a clock standing still: nothing refills
	p := newPolicy(t, b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: Limit{Rate: 5, Period: time.Second, Burst: 5}},
		{Strategy: SlidingCounter, Limit: PerMinute(50)},
		{Strategy: FixedWindow, Limit: PerHour(500)},
	})
	_, ok := p.own.run.(specialisedRunner)
	require.True(t, ok, "the policy's runner %T", p.own.run)
	return append(out, hostileLimiter{"policy-script", &p.engine, m, context.Background(), 5, 3})
}

// redisState is every key's value and TTL on m: what a refused call must
// leave as it was.
func redisState(m *miniredis.Miniredis) string {
	keys := m.Keys()
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(m.Dump())
	for _, k := range keys {
		fmt.Fprintf(&b, "%q ttl %v\n", k, m.TTL(k))
	}
	return b.String()
}

// stateReport is what AllowN(ctx, key, 0) says of key, for comparing a key's
// state before and after a refused call.
func stateReport(t *testing.T, ctx context.Context, lim Limiter, key string) string {
	t.Helper()
	res, err := lim.AllowN(ctx, key, 0)
	require.NoError(t, err, "AllowN(%q, 0)", key)
	return fmt.Sprintf("remaining=%d retry=%v reset=%v", res.Remaining, res.RetryAfter, res.ResetAfter)
}

// n below 1 (for a reservation) or below 0, and n past the capacity or
// the call's share, up to MaxInt, are refused with their sentinel by
// AllowN, WaitN and Reserve, and write nothing.
func TestHostileN(t *testing.T) {
	for _, h := range hostileLimiters(t) {
		t.Run(h.name, func(t *testing.T) {
			res, err := h.lim.AllowN(h.ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			state, before := redisState(h.m), stateReport(t, h.ctx, h.lim, "k")
			for _, c := range []struct {
				n    int
				want error
			}{
				{-1, ErrInvalidArgument},
				{math.MinInt, ErrInvalidArgument},
				{h.most + 1, ErrExceedsLimit},
				{MaxRate + 1, ErrExceedsLimit},
				{math.MaxInt32, ErrExceedsLimit},
				{math.MaxInt, ErrExceedsLimit},
			} {
				calls := map[string]func() error{
					"AllowN":  func() error { _, err := h.lim.AllowN(h.ctx, "k", c.n); return err },
					"WaitN":   func() error { return h.lim.WaitN(h.ctx, "k", c.n) },
					"Reserve": func() error { _, err := h.lim.Reserve(h.ctx, "k", c.n); return err },
				}
				for name, call := range calls {
					var err error
					require.NotPanics(t, func() { err = call() }, "%s(n = %d)", name, c.n)
					require.ErrorIs(t, err, c.want, "%s(n = %d): %v", name, c.n, err)
					require.Equal(t, state, redisState(h.m), "%s(n = %d) changed Redis", name, c.n)
				}
			}
			// A reservation of nothing is refused; AllowN's n = 0 only
			// reports (stateReport).
			_, err = h.lim.Reserve(h.ctx, "k", 0)
			require.ErrorIs(t, err, ErrInvalidArgument, "Reserve(n = 0)")
			assert.Equal(t, before, stateReport(t, h.ctx, h.lim, "k"), "the key's state after the refused calls")
			assert.Equal(t, state, redisState(h.m), "Redis after the refused calls")

			// The most n is still admitted on a fresh key.
			res, err = h.lim.AllowN(h.ctx, "fresh", h.most)
			require.NoError(t, err)
			assert.True(t, res.Allowed, "AllowN(n = %d) on a fresh key", h.most)
		})
	}
}

// A settle's used below 0 is ErrInvalidArgument and one past MaxRate
// ErrExceedsLimit; neither writes, and the reservation stays pending, so
// that it settles with a sane used after. used above the reservation is
// charged.
func TestHostileSettle(t *testing.T) {
	for _, h := range hostileLimiters(t) {
		t.Run(h.name, func(t *testing.T) {
			rv, err := h.lim.Reserve(h.ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			state, before := redisState(h.m), stateReport(t, h.ctx, h.lim, "k")
			for _, c := range []struct {
				used int
				want error
			}{
				{-1, ErrInvalidArgument},
				{math.MinInt, ErrInvalidArgument},
				{MaxRate + 1, ErrExceedsLimit},
				{math.MaxInt, ErrExceedsLimit},
			} {
				var err error
				require.NotPanics(t, func() { _, err = rv.Settle(h.ctx, c.used) }, "Settle(%d)", c.used)
				require.ErrorIs(t, err, c.want, "Settle(%d): %v", c.used, err)
				require.Equal(t, state, redisState(h.m), "Settle(%d) changed Redis", c.used)
			}
			assert.Equal(t, before, stateReport(t, h.ctx, h.lim, "k"), "the key's state after the refused settles")

			_, err = rv.Settle(h.ctx, 3)
			require.NoError(t, err, "the reservation stayed pending")
			if !h.lim.own.rules[0].alg.warm { // a warming bucket's Remaining is all or nothing
				// Read with the call's context: Settle's own Result does
				// not apply a priority's share.
				res, err := h.lim.AllowN(h.ctx, "k", 0)
				require.NoError(t, err)
				assert.Equal(t, h.most-3, res.Remaining, "used 3 of a reservation of 2: 3 charged")
			}
			_, err = rv.Settle(h.ctx, 3)
			require.ErrorIs(t, err, ErrSettled, "a second settle")
			_, err = rv.Settle(h.ctx, -1)
			require.ErrorIs(t, err, ErrInvalidArgument, "a bad used is refused before the settled check")
		})
	}
}

// A huge used that the state may owe (a bucket's debt paid back within
// MaxPeriod) is charged in full on a warming bucket: the key is denied
// until the refill pays it back, not admitted by a wrapped or rounded
// debt.
func TestHostileSettleWarmDebt(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			l := Limit{Rate: 5, Period: time.Second, WarmUp: 10 * time.Second}
			lim := newLimiter(t, b.rdb, s, l)
			ctx := context.Background()
			for _, used := range []int{5 * 3600, 5 * int(MaxPeriod/time.Second)} {
				key := fmt.Sprint("k", used)
				rv, err := lim.Reserve(ctx, key, 1)
				require.NoError(t, err)
				_, err = rv.Settle(ctx, used)
				require.NoError(t, err, "Settle(%d)", used)
				res, err := lim.Allow(ctx, key)
				require.NoError(t, err)
				assert.False(t, res.Allowed, "in debt after settling %d", used)
				// The used-1 events past the reservation at the stable rate,
				// plus what the stored permits above the threshold cost more
				// (cold: at most WarmUp/2), plus the reservation's own.
				payback := seconds(float64(used-1) * l.Period.Seconds() / float64(l.Rate))
				assert.GreaterOrEqual(t, res.RetryAfter, payback, "used %d: RetryAfter against the debt's payback", used)
				assert.LessOrEqual(t, res.RetryAfter, payback+l.WarmUp/2+l.interval(), "used %d: RetryAfter against the debt's payback", used)
			}
		})
	}
}

// hostileKeys are keys an attacker can send: hash-tag characters, NUL
// bytes, the escape's own characters, and a key of 1 MiB.
func hostileKeys() []string {
	return []string{
		"{", "}", "{}", "{a}b", "a}b{c", "%7B", "%h" + strings.Repeat("0", 64),
		"\x00", "a\x00b", "a\x00", "\x00\x00", "\r\n*1\r\n$8\r\nFLUSHALL\r\n",
		strings.Repeat("k", MaxKeyLen+1), strings.Repeat("\x00", 1<<20), strings.Repeat("{", 1<<20),
	}
}

// Every hostile key has a state of its own (shared with no other key,
// hostile or not), whose Redis key stays short whatever the key's length;
// the empty key is ErrInvalidArgument and writes nothing.
func TestHostileKeys(t *testing.T) {
	for _, h := range hostileLimiters(t) {
		t.Run(h.name, func(t *testing.T) {
			res, err := h.lim.AllowN(h.ctx, "a", h.most)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			for i, key := range hostileKeys() {
				res, err := h.lim.AllowN(h.ctx, key, h.most)
				require.NoError(t, err, "key %d (%.20q)", i, key)
				assert.True(t, res.Allowed, "key %d (%.20q): a state of its own", i, key)
				res, err = h.lim.Allow(h.ctx, key)
				require.NoError(t, err, "key %d (%.20q)", i, key)
				assert.False(t, res.Allowed, "key %d (%.20q): its capacity used", i, key)
			}
			for _, k := range h.m.Keys() {
				assert.LessOrEqual(t, len(k), 3*MaxKeyLen, "a Redis key of %d bytes: %.40q", len(k), k)
			}
			assert.Len(t, h.m.Keys(), h.states*(len(hostileKeys())+1), "one state per rule and key")

			state := redisState(h.m)
			_, err = h.lim.AllowN(h.ctx, "", 1)
			require.ErrorIs(t, err, ErrInvalidArgument, "the empty key")
			_, err = h.lim.Reserve(h.ctx, "", 1)
			require.ErrorIs(t, err, ErrInvalidArgument, "the empty key")
			assert.Equal(t, state, redisState(h.m), "the empty key changed Redis")
		})
	}
}

// The concurrency limiter: each hostile key holds its own slots; the
// empty key is ErrInvalidArgument.
func TestHostileKeysConcurrency(t *testing.T) {
	b, m := miniBackend(t)
	sem, err := NewConcurrency(b.rdb, 2, time.Minute, WithPriorityShares(0.5, 1))
	require.NoError(t, err)
	t.Cleanup(func() { sem.Close() })
	ctx := context.Background()
	sheddable := ContextWithPriority(ctx, Sheddable)
	for i, key := range append(hostileKeys(), "a") {
		l1, res, err := sem.TryAcquire(sheddable, key)
		require.NoError(t, err, "key %d (%.20q)", i, key)
		require.True(t, res.Allowed, "key %d (%.20q): slots of its own", i, key)
		_, res, err = sem.TryAcquire(sheddable, key)
		require.NoError(t, err)
		assert.False(t, res.Allowed, "key %d (%.20q): the sheddable share (1 of 2) held", i, key)
		assert.True(t, res.ByPriority, "key %d (%.20q)", i, key)
		l2, res, err := sem.TryAcquire(ctx, key)
		require.NoError(t, err)
		assert.True(t, res.Allowed, "key %d (%.20q): a normal call takes the last slot", i, key)
		_, res, err = sem.TryAcquire(ctx, key)
		require.NoError(t, err)
		assert.False(t, res.Allowed, "key %d (%.20q): both slots held", i, key)
		require.NoError(t, l1.Release(ctx))
		require.NoError(t, l2.Extend(ctx))
	}
	for _, k := range m.Keys() {
		assert.LessOrEqual(t, len(k), 3*MaxKeyLen, "a Redis key of %d bytes: %.40q", len(k), k)
	}
	state := redisState(m)
	_, _, err = sem.TryAcquire(ctx, "")
	require.ErrorIs(t, err, ErrInvalidArgument, "TryAcquire of the empty key")
	_, err = sem.Acquire(ctx, "")
	require.ErrorIs(t, err, ErrInvalidArgument, "Acquire of the empty key")
	assert.Equal(t, state, redisState(m), "the empty key changed Redis")
}

// A Priority outside Sheddable..Critical (a value a middleware took from a
// request) is decided as Normal: it neither escalates to Critical nor
// errors.
func TestHostilePriority(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, PerMinute(10), WithPriorityShares(0.5, 0.8))
	ctx := context.Background()
	res, err := lim.AllowN(ctx, "k", 8)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	for _, p := range []Priority{0, -1, Critical + 1, math.MaxInt, math.MinInt} {
		pctx := ContextWithPriority(ctx, p)
		assert.Equal(t, Normal, PriorityFromContext(pctx), "PriorityFromContext of %v", p)
		assert.Equal(t, fmt.Sprintf("Priority(%d)", int(p)), p.String())
		var res Result
		require.NotPanics(t, func() { res, err = lim.Allow(pctx, "k") }, "priority %d", int(p))
		require.NoError(t, err, "priority %d", int(p))
		assert.False(t, res.Allowed, "priority %d: decided as Normal (8 of 10 used)", int(p))
		assert.True(t, res.ByPriority, "priority %d: denied by the Normal share", int(p))
		_, err = lim.AllowN(pctx, "k", 9)
		require.ErrorIs(t, err, ErrExceedsLimit, "priority %d: n past the Normal share", int(p))
	}
	res, err = lim.Allow(ContextWithPriority(ctx, Critical), "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "a Critical call after them")
	assert.Equal(t, 1, res.Remaining)
}

// FuzzEscapeKey: any user key becomes a Redis key part with no hash-tag
// character, at most 3×MaxKeyLen bytes, from which a short key comes back
// whole (so two keys never share a state), and a long one is its SHA-256.
func FuzzEscapeKey(f *testing.F) {
	for _, k := range append(oddKeys(), hostileKeys()[:12]...) {
		f.Add(k)
	}
	f.Add(strings.Repeat("{", MaxKeyLen))
	f.Add(strings.Repeat("%", MaxKeyLen+1))
	f.Fuzz(func(t *testing.T, key string) {
		got := escapeKey(key)
		require.False(t, strings.ContainsAny(got, "{}"), "escapeKey(%q) = %q has a hash-tag character", key, got)
		require.LessOrEqual(t, len(got), 3*MaxKeyLen, "escapeKey(%.40q): %d bytes", key, len(got))
		if len(key) > MaxKeyLen {
			sum := sha256.Sum256([]byte(key))
			require.Equal(t, "%h"+hex.EncodeToString(sum[:]), got)
			return
		}
		back, err := url.PathUnescape(got)
		require.NoError(t, err, "escapeKey(%q) = %q", key, got)
		require.Equal(t, key, back, "escapeKey(%q) = %q does not come back", key, got)
		require.False(t, strings.HasPrefix(got, "%h"), "a short key escaped as a hashed one: %q", got)
	})
}

// FuzzMissedWindow: the server's time comes back from any error text
// that carries it, and no other text is taken for one.
func FuzzMissedWindow(f *testing.F) {
	f.Add("ERR user_script:1: ", int64(1893456000000000), " script: 1a2b")
	f.Add("", int64(0), "")
	f.Add("redlimit-window-miss ", int64(math.MaxInt64), "9")
	f.Add("x", int64(-5), "redlimit-window-miss 12")
	f.Fuzz(func(t *testing.T, before string, us int64, after string) {
		var v int64
		var ok bool
		require.NotPanics(t, func() { v, ok = missedWindow(errors.New(before + after)) })
		if ok {
			require.Contains(t, before+after, windowMiss)
		}
		if us < 0 || strings.Contains(before, windowMiss) || (after != "" && after[0] >= '0' && after[0] <= '9') {
			return
		}
		v, ok = missedWindow(errors.New(before + windowMiss + strconv.FormatInt(us, 10) + after))
		require.True(t, ok, "missedWindow of %q", before+windowMiss+strconv.FormatInt(us, 10)+after)
		require.Equal(t, us, v)
	})
}

// A nil Context, a nil or zero Reservation and a nil Lease are errors
// wrapping ErrInvalidArgument, never panics, and change nothing in Redis.
func TestNilArgumentsAreErrors(t *testing.T) {
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 10}, WithPrefix("nil"))
	pol, err := NewPolicy(b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Second, Burst: 10}},
		{Strategy: FixedWindow, Limit: Limit{Rate: 100, Period: time.Hour}},
	}, WithPrefix("nil"))
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	sem, err := NewConcurrency(b.rdb, 2, time.Minute, WithPrefix("nil"))
	require.NoError(t, err)
	t.Cleanup(func() { sem.Close() })
	ctx := context.Background()
	res, err := lim.Reserve(ctx, "k", 1)
	require.NoError(t, err)
	lease, err := sem.Acquire(ctx, "k")
	require.NoError(t, err)
	before := m.Dump()

	var nilCtx context.Context
	calls := map[string]func() error{
		"RateLimiter.Allow":   func() error { _, err := lim.Allow(nilCtx, "k"); return err },
		"RateLimiter.AllowN":  func() error { _, err := lim.AllowN(nilCtx, "k", 1); return err },
		"RateLimiter.Wait":    func() error { return lim.Wait(nilCtx, "k") },
		"RateLimiter.WaitN":   func() error { return lim.WaitN(nilCtx, "k", 1) },
		"RateLimiter.Reset":   func() error { return lim.Reset(nilCtx, "k") },
		"RateLimiter.Reserve": func() error { _, err := lim.Reserve(nilCtx, "k", 1); return err },
		"Policy.Allow":        func() error { _, err := pol.Allow(nilCtx, "k"); return err },
		"Policy.WaitN":        func() error { return pol.WaitN(nilCtx, "k", 1) },
		"Policy.Reset":        func() error { return pol.Reset(nilCtx, "k") },
		"Policy.Reserve":      func() error { _, err := pol.Reserve(nilCtx, "k", 1); return err },
		"Reservation.Settle":  func() error { _, err := res.Settle(nilCtx, 1); return err },
		"Reservation.Cancel":  func() error { return res.Cancel(nilCtx) },
		"Concurrency.TryAcquire": func() error {
			_, _, err := sem.TryAcquire(nilCtx, "k")
			return err
		},
		"Concurrency.Acquire": func() error { _, err := sem.Acquire(nilCtx, "k"); return err },
		"Lease.Extend":        func() error { return lease.Extend(nilCtx) },
		"Lease.Release":       func() error { return lease.Release(nilCtx) },
		"nil Reservation.Settle": func() error {
			var r *Reservation
			_, err := r.Settle(ctx, 1)
			return err
		},
		"nil Reservation.Cancel": func() error { var r *Reservation; return r.Cancel(ctx) },
		"zero Reservation.Settle": func() error {
			_, err := (&Reservation{}).Settle(ctx, 1)
			return err
		},
	}
	for name, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, ErrInvalidArgument, "%s: %v", name, err)
		assert.Equal(t, before, m.Dump(), "%s changed Redis", name)
	}
	var nilRes *Reservation
	assert.Equal(t, Result{}, nilRes.Result(), "a nil Reservation's Result")

	// The reservation and the lease still work with a real context.
	_, err = res.Settle(ctx, 1)
	require.NoError(t, err, "the reservation after the nil-context calls")
	require.NoError(t, lease.Extend(ctx), "the lease after the nil-context calls")
	require.NoError(t, lease.Release(ctx), "the lease after the nil-context calls")
}

// With WithRegions, a hostile key has a journal and a peer record of its
// own, in its state's slot and short whatever the key's length; its usage
// reaches the peer region as any key's does (and no other key's); the
// empty key and a bad n change neither region's Redis.
func TestHostileKeysRegions(t *testing.T) {
	eu, mEU := miniBackend(t) // clocks standing still: nothing refills
	us, mUS := miniBackend(t)
	in := func(self string, own, peer redis.UniversalClient, name string) *RateLimiter {
		return newLimiter(t, own, TokenBucket, PerHour(10), peerRegion(self, name, peer))
	}
	here, there := in("eu", eu.rdb, us.rdb, "us"), in("us", us.rdb, eu.rdb, "eu")
	ctx := context.Background()
	keys := hostileKeys()
	for i, key := range keys {
		res, err := here.AllowN(ctx, key, 1+i%9)
		require.NoError(t, err, "key %d (%.20q)", i, key)
		require.True(t, res.Allowed, "key %d (%.20q)", i, key)
	}
	require.Eventually(t, func() bool {
		for i, key := range keys {
			res, err := there.AllowN(ctx, key, 0)
			require.NoError(t, err, "key %d (%.20q)", i, key)
			if res.Remaining != 10-(1+i%9) {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "every key's usage, and only its own, in the peer region")

	mine := map[string]bool{} // every Redis key the hostile keys may have
	for _, key := range keys {
		state := here.stateKey(key)
		for _, k := range []string{state, here.regions.journalKey(state, here.own), regionKey(state, here.own, peersSuffix)} {
			mine[k] = true
			assert.Equal(t, hashslot.Of(state), hashslot.Of(k), "%.40q: not in its state's slot", k)
			assert.LessOrEqual(t, len(k), 3*MaxKeyLen, "a Redis key of %d bytes: %.40q", len(k), k)
		}
		assert.True(t, mEU.Exists(here.regions.journalKey(state, here.own)), "%.20q: no journal", key)
		assert.True(t, mUS.Exists(regionKey(state, here.own, peersSuffix)), "%.20q: no peer record", key)
	}
	for _, m := range []*miniredis.Miniredis{mEU, mUS} {
		for _, k := range m.Keys() {
			assert.True(t, mine[k], "%.40q: a Redis key of no key's", k)
		}
	}

	before := [2]string{redisState(mEU), redisState(mUS)}
	_, err := here.AllowN(ctx, "", 1)
	require.ErrorIs(t, err, ErrInvalidArgument, "the empty key")
	for _, n := range []int{-1, 11, math.MaxInt} {
		_, err = here.AllowN(ctx, "k", n)
		require.Error(t, err, "n %d", n)
	}
	time.Sleep(50 * time.Millisecond) // five exchange rounds
	assert.Equal(t, before, [2]string{redisState(mEU), redisState(mUS)}, "a refused call changed Redis")
}
