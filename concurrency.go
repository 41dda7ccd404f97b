package redlimit

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/localsem"
	"github.com/redlimit/redlimit/internal/lru"
	"github.com/redlimit/redlimit/internal/outage"
	"github.com/redlimit/redlimit/internal/requeue"
)

// Limits on the values of a [Concurrency]: NewConcurrency refuses values
// outside them with an error wrapping ErrInvalidLimit.
const (
	// MaxConcurrency is the largest max accepted: each live lease is a
	// sorted-set member in Redis (about 30 bytes up to 128 leases on a
	// key, about 120 beyond; see the README).
	MaxConcurrency = 100_000
	// MinLeaseTTL is the shortest lease ttl accepted.
	MinLeaseTTL = time.Millisecond
	// MaxLeaseTTL is the longest lease ttl accepted. A crashed holder's slot
	// comes back only when its lease expires, so keep ttl short and call
	// Extend for long work.
	MaxLeaseTTL = 24 * time.Hour
)

// acquirePollInterval is the longest Acquire waits before asking Redis
// again whether a slot is free (less when the oldest lease expires
// sooner; each wait is drawn between half of it and all of it).
const acquirePollInterval = 50 * time.Millisecond

// Concurrency limits how many leases per key are held at once, across
// every instance that shares its Redis and key prefix: at most max
// requests in flight per user, max jobs running per tenant. It is a
// distributed semaphore per key, whose naming follows
// golang.org/x/sync/semaphore: [Concurrency.Acquire] waits for a slot,
// [Concurrency.TryAcquire] does not.
//
// A lease lives for ttl after it is taken or last extended
// ([Lease.Extend]), on the Redis server's clock (TIME, µs; see
// [WithClientClock] for servers that refuse it). A lease that is neither
// released nor extended within ttl expires, so a crashed holder's slot
// comes back within ttl, with nobody cleaning up. Each limited key is one
// sorted set, <prefix>:{<key>}:cc (key escaped as for the rate limiters,
// one Redis Cluster slot), with a member per live lease and its expiry as
// the score; one script counts live leases, prunes at most 16 expired
// ones and adds, in one round trip. The key's own TTL is the latest
// lease's expiry, set on every acquire and extend.
//
// When Redis is unavailable (see [FallbackPolicy]), calls are answered in
// process with Result.Degraded set, and a monitor brings them back to
// Redis as for the rate limiters. FallbackLocal is a semaphore per key in
// this process, of capacity floor(max × share) but at least 1 (see
// [WithFallbackShare]), whose slots the Redis leases this instance still
// holds on the key take too, until released or expired by their ttl
// (counted from the reply that granted or extended them): with N instances
// and a share of 1/N the fleet holds at most max leases of a key when
// max ≥ N and no instance held more than its share of them when Redis
// failed (in general, the sum over instances of the larger of its share
// and the Redis leases it held), and N when max < N. Its leases expire
// after ttl like those in Redis; they are released in process, and are not
// copied to Redis: when Redis is back, new leases are counted in Redis
// only, so a key can briefly have up to max in Redis plus those still held
// in process. A lease taken on Redis and released while Redis is
// unavailable cannot be removed from Redis then (Release returns nil, or an
// error wrapping ErrUnavailable under FallbackError): the release is made
// again every ping interval once Redis is back, so its slot comes back
// then, or when its ttl ends if that is sooner (up to 10,000 such releases
// pending, until Close); it cannot be extended (Extend returns an error
// wrapping ErrUnavailable).
//
// The options that apply are WithPrefix, WithFallback, WithPingInterval,
// WithFallbackShare, WithFallbackKeys, WithOnTransition, WithObserver,
// WithClientClock and WithLimitFunc (a max per key: see
// [Concurrency.TryAcquire]). The observer sees every try to take a lease with
// Strategy 0 and N 1; transitions have Strategy 0. WithBlock,
// WithDenyCache, WithShadow, WithRulesFunc and WithPrefetch are
// refused; WithRedisFunctions and WithReservationTTL are accepted and
// change nothing (a concurrency limit runs its own scripts).
//
// A Concurrency is safe for concurrent use. Call Close when done with it.
type Concurrency struct {
	e      *engine
	limit  Limit // Rate = max, Period = ttl, Burst = max
	ttlArg int64 // µs

	local *lru.Cache[*localsem.Sem] // FallbackLocal's semaphores, by state key
	held  *localsem.Held            // FallbackLocal: the Redis leases held here, by state key; else nil
	// sweepAt says when to drop the semaphores that hold no live lease, at
	// a call Redis answers (see sweepIdle): sweepNone, sweepNow, sweeping,
	// or the time (ns, cfg.now's clock) when the leases left expire.
	sweepAt atomic.Int64
	sweepMu sync.Mutex     // orders a sweep's start before Close's wait
	sweepWG sync.WaitGroup // the sweeps in progress

	poll    time.Duration // Acquire's longest wait between tries
	waitMu  sync.Mutex
	waits   map[string]*waiters // keys that Acquire waits for in this process
	wakeCap int
	done    chan struct{} // closed by Close
	once    sync.Once

	// releases makes again the releases of Redis leases that did not
	// complete (see queueRelease).
	releases *requeue.Queue
}

// maxPendingReleases bounds the releases a Concurrency keeps to make
// again; past it, a lease's slot comes back when its ttl ends.
const maxPendingReleases = 10_000

// concurrencyAlg is the rule a Concurrency gives its engine: the engine
// supplies the options, the key scheme and the fallback monitor; the
// decisions are concurrency.lua's. Strategy 0 names it in decisions and
// transitions.
var concurrencyAlg = &algorithm{code: "cc", maxRate: MaxConcurrency}

var concurrencyScript = sync.OnceValue(func() *redis.Script { return redis.NewScript(readScripts("concurrency.lua")) })

// The operations of concurrency.lua, and its reply codes.
const (
	opAcquire = 1
	opExtend  = 2
	opRelease = 3

	leaseDone    = 0
	leaseDenied  = 1
	leaseShed    = 5 // denied by the priority share only: a slot of max is free
	leaseMissing = 4
)

// releaseTimeout bounds a Release whose ctx was already done.
const releaseTimeout = time.Second

// NewConcurrency limits how many leases per key are held at once across
// every instance. A lease not released or extended within ttl expires, so a
// crashed holder's slot comes back. maxHeld (the max) must be in [1, MaxConcurrency] and
// ttl in [MinLeaseTTL, MaxLeaseTTL], a whole number of microseconds; else
// the error wraps ErrInvalidLimit. An invalid option, or one that does not
// apply (see [Concurrency]), is an error wrapping ErrInvalidArgument.
func NewConcurrency(rdb redis.UniversalClient, maxHeld int, ttl time.Duration, opts ...Option) (*Concurrency, error) {
	bad := func(format string, args ...any) (*Concurrency, error) {
		return nil, errorf("concurrency: %s: %w", fmt.Sprintf(format, args...), ErrInvalidLimit)
	}
	switch {
	case maxHeld < 1 || maxHeld > MaxConcurrency:
		return bad("max %d must be between 1 and %d", maxHeld, MaxConcurrency)
	case ttl < MinLeaseTTL || ttl > MaxLeaseTTL:
		return bad("ttl %v must be between %v and %v", ttl, MinLeaseTTL, MaxLeaseTTL)
	case ttl%time.Microsecond != 0:
		return bad("ttl %v must be a whole number of microseconds", ttl)
	}
	limit := Limit{Rate: maxHeld, Period: ttl, Burst: maxHeld}
	r := rule{alg: concurrencyAlg, limit: limit, suffix: "}:" + concurrencyAlg.code}
	e, err := newEngine(rdb, "concurrency", []rule{r}, concurrencyScript(), opts)
	if err != nil {
		return nil, err
	}
	var refused string
	switch cfg := &e.cfg; {
	case cfg.block > 0:
		refused = "WithBlock"
	case cfg.denyCache > 0:
		refused = "WithDenyCache"
	case cfg.shadow:
		refused = "WithShadow"
	case cfg.rulesFunc != nil:
		refused = "WithRulesFunc"
	case cfg.regions != nil:
		refused = "WithRegions"
	}
	if refused != "" {
		_ = e.Close() // never used: nothing to report
		return nil, errorf("concurrency: %s does not apply to a concurrency limit: %w", refused, ErrInvalidArgument)
	}
	c := &Concurrency{
		e:        e,
		limit:    limit,
		ttlArg:   int64(ttl / time.Microsecond),
		local:    lru.New[*localsem.Sem](e.cfg.localKeys),
		poll:     acquirePollInterval,
		waits:    make(map[string]*waiters),
		wakeCap:  min(maxHeld, 64),
		done:     make(chan struct{}),
		releases: requeue.New(e.rescue.isDown, e.cfg.pingInterval, maxPendingReleases),
	}
	if e.cfg.fallback == FallbackLocal {
		c.held = localsem.NewHeld(e.cfg.now, ttl)
	}
	return c, nil
}

// fallbackCapacity is an instance's share of maxHeld (the max) for the in-process
// semaphores: floor(max × share), at least 1. Unlike a rate (newLocal keeps
// a fractional capacity on average), a semaphore's capacity is a hard
// bound, so it is rounded down: N instances with a share of 1/N never hold
// more than max between them unless max < N.
func fallbackCapacity(maxHeld int, share float64) int {
	return int(math.Max(math.Floor(float64(maxHeld)*share+1e-9), 1))
}

// TryAcquire takes a lease on key if one is free, without waiting. When
// none is, the lease is nil and the Result says so, with RetryAfter the
// time until the oldest lease expires (a holder may release sooner). When
// granted, Remaining is the slots still free and ResetAfter the time until
// every lease expires. err is non-nil only when no decision was made: an
// empty key, Close, ctx done, a script or server error, or Redis down with
// FallbackError.
//
// With [WithLimitFunc], the key's max is the Rate of the Limit the function
// returns for ctx and key (a plan's cap), checked as NewConcurrency checks
// max; its Period must be 0 or the ttl, its Burst 0 or the Rate, and a zero
// Limit means the Concurrency's own max. The script counts the key's leases
// against that max, and the in-process fallback's semaphore of the key has
// floor(max × share) slots. A key whose max is lowered keeps the leases it
// holds until they are released; no new one is granted until fewer than
// the new max are live.
//
// When ctx ends during the call, TryAcquire returns then, and the lease the
// script may have added is given back in the background, as a release
// that did not complete (see [Lease.Release]); so is one whose reply is
// lost to a timeout or a cut connection (the call is answered by the
// fallback).
func (c *Concurrency) TryAcquire(ctx context.Context, key string) (*Lease, Result, error) {
	var start time.Time
	if c.e.cfg.observer != nil {
		start = time.Now()
	}
	l, res, err := c.tryAcquire(ctx, key)
	res.RuleResetAfter = res.ResetAfter // one limit
	if f := c.e.cfg.observer; f != nil {
		d := Decision{Context: ctx, Key: key, N: 1, Allowed: res.Allowed, Degraded: res.Degraded, Latency: time.Since(start), Err: err}
		_, d.Priority = c.e.callShare(ctx)
		if err == nil && !res.Allowed {
			d.DeniedBy = DeniedByLimit
			if res.ByPriority {
				d.DeniedBy = DeniedByPriority
			}
		}
		f(d)
	}
	return l, res, err
}

func (c *Concurrency) tryAcquire(ctx context.Context, key string) (*Lease, Result, error) {
	if c.e.closed.Load() {
		return nil, Result{}, ErrClosed
	}
	if err := checkKey(key); err != nil {
		return nil, Result{}, err
	}
	if err := checkContext(ctx); err != nil {
		return nil, Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, Result{}, errorf("concurrency %q: %w", key, err)
	}
	limit, err := c.limitFor(ctx, key)
	if err != nil {
		return nil, Result{}, err
	}
	state := c.e.stateKey(key, &c.e.own.rules[0])
	share, prio := c.e.callShare(ctx)
	if share != 0 && shareOf(int64(limit.Rate), share) < 1 {
		return nil, Result{}, errorf("concurrency %q: a %v call may hold none of max %d: %w", key, prio, limit.Rate, ErrExceedsLimit)
	}
	if c.e.rescue.isDown(state) {
		return c.fallback(key, state, limit, share)
	}
	id := newLeaseID()
	res, code, err := c.eval(ctx, opAcquire, state, id, limit, share)
	if err != nil {
		if ctxErr := callerDone(ctx); ctxErr != nil {
			// The script may have run, its reply come too late: give the
			// lease back in the background rather than leave its slot
			// taken until ttl, or keep the caller past its deadline.
			c.queueRelease(key, state, id, true)
			return nil, Result{}, errorf("concurrency %q: %w", key, ctxErr)
		}
		if !c.e.rescue.outage(err, state) {
			return nil, Result{}, errorf("concurrency %q: %w", key, err)
		}
		if mayHaveRun(err) {
			c.queueRelease(key, state, id, false) // given back once Redis answers
		}
		return c.fallback(key, state, limit, share)
	}
	c.sweepIdle()
	if code != leaseDone {
		return nil, res, nil
	}
	l := &Lease{c: c, key: key, state: state, id: id, limit: limit}
	c.held.Add(&l.held, l.state)
	return l, res, nil
}

// Acquire takes a lease on key, waiting until one is free or ctx is done
// (then the error wraps ctx's error). It does not poll busily: after a
// denial it waits for the shorter of the RetryAfter Redis gave (the oldest
// lease's expiry) and a random time between acquirePollInterval/2 and
// acquirePollInterval, then tries again; a lease of key released by this
// Concurrency (in this process) wakes one waiter at once. So a slot freed
// in this process is taken within a round trip, one freed by another
// process within about acquirePollInterval. Waiters are not served in
// order. Each try is one TryAcquire, seen by the observer.
func (c *Concurrency) Acquire(ctx context.Context, key string) (*Lease, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	w := c.watch(key)
	defer c.unwatch(key, w)
	for {
		l, res, err := c.TryAcquire(ctx, key)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		wait := min(res.RetryAfter, c.poll/2+rand.N(c.poll/2+1))
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-t.C:
		case <-w.ch:
			t.Stop()
		case <-c.done:
			t.Stop()
			return nil, ErrClosed
		case <-ctx.Done():
			t.Stop()
			return nil, errorf("acquire %q: %w", key, ctx.Err())
		}
	}
}

// Close stops the fallback monitor, if one runs, and makes later calls
// return ErrClosed (Acquire returns at once). Leases still held can be
// released after Close, not extended; releases that did not complete and
// were not made again yet (see [Lease.Release]) are dropped, and the one
// being made ends: their slots come back when their ttls end. It does not close the Redis client. It is safe to
// call more than once.
func (c *Concurrency) Close() error {
	c.once.Do(func() { close(c.done) })
	c.releases.Close(false)
	err := c.e.Close()
	// A barrier: a sweep that started before done closed has been
	// counted in sweepWG; one starting now sees done closed.
	c.sweepMu.Lock()
	c.sweepMu.Unlock() //nolint:staticcheck // SA2001: the barrier above
	c.sweepWG.Wait()
	return err
}

// limitFor returns the limit of key: the Concurrency's own, or the one
// WithLimitFunc gives, checked.
func (c *Concurrency) limitFor(ctx context.Context, key string) (Limit, error) {
	f := c.e.cfg.limitFunc
	if f == nil {
		return c.limit, nil
	}
	l, err := f(ctx, key)
	if err != nil {
		return Limit{}, errorf("concurrency limit for %q: %w", key, err)
	}
	if l == (Limit{}) {
		return c.limit, nil
	}
	switch {
	case l.Rate < 1 || l.Rate > MaxConcurrency:
		return Limit{}, errorf("concurrency limit for %q: max (Rate) %d must be between 1 and %d: %w", key, l.Rate, MaxConcurrency, ErrInvalidLimit)
	case l.Period != 0 && l.Period != c.limit.Period:
		return Limit{}, errorf("concurrency limit for %q: Period %v must be 0 or the lease ttl %v: %w", key, l.Period, c.limit.Period, ErrInvalidLimit)
	case l.Burst != 0 && l.Burst != l.Rate:
		return Limit{}, errorf("concurrency limit for %q: Burst %d must be 0 or the Rate %d: %w", key, l.Burst, l.Rate, ErrInvalidLimit)
	}
	return Limit{Rate: l.Rate, Period: c.limit.Period, Burst: l.Rate}, nil
}

// eval runs concurrency.lua for one lease of a key whose limit is limit
// (Rate = max); share, for an acquire, is the call's priority share (see
// callShare): it may take a slot only while floor(share × max) are not all
// taken.
func (c *Concurrency) eval(ctx context.Context, op int, state, id string, limit Limit, share int64) (Result, int64, error) {
	now := argZero
	if c.e.clock != nil && op == opRelease {
		now = 1 // a release needs no time, only to know the clock is the client's
	} else if c.e.clock != nil {
		us, err := c.e.clock.NowMicros(ctx)
		if err != nil {
			return Result{}, 0, err
		}
		now = us
	}
	var reply []any
	var err error
	if share != 0 {
		reply, err = concurrencyScript().Run(ctx, c.e.rdb, []string{state}, op, id, now, limit.Rate, c.ttlArg, shareOf(int64(limit.Rate), share)).Slice()
	} else {
		reply, err = concurrencyScript().Run(ctx, c.e.rdb, []string{state}, op, id, now, limit.Rate, c.ttlArg).Slice()
	}
	if err != nil {
		return Result{}, 0, err
	}
	c.e.evict.Poke()
	if len(reply) != 4 {
		return Result{}, 0, errorf("concurrency: script replied %d values, want 4", len(reply))
	}
	var v [4]int64
	for i, x := range reply {
		n, ok := x.(int64)
		if !ok {
			return Result{}, 0, errorf("concurrency: script reply %d is %T, want an integer", i, x)
		}
		v[i] = n
	}
	if v[0] >= clockBehind { // the time sent disagreed with the key's
		v[0] -= clockBehind
		c.e.behind()
	}
	res := Result{
		Allowed:    op == opAcquire && v[0] == leaseDone,
		Limit:      limit,
		Remaining:  int(max(v[1], 0)),
		ResetAfter: micros(v[3]),
	}
	if v[0] == leaseDenied || v[0] == leaseShed {
		res.RetryAfter = micros(v[2])
		res.ByPriority = v[0] == leaseShed
	}
	return res, v[0], nil
}

// fallback answers TryAcquire while Redis is unavailable, by the policy,
// for a key whose limit is limit; share is the call's priority share (see
// callShare).
func (c *Concurrency) fallback(key, state string, limit Limit, share int64) (*Lease, Result, error) {
	cfg := &c.e.cfg
	wait := cfg.pingInterval
	denied := Result{Limit: limit, RetryAfter: wait, ResetAfter: wait, Degraded: true}
	switch cfg.fallback {
	case FallbackAllow:
		return &Lease{c: c, key: key, state: state, free: true, limit: limit},
			Result{Allowed: true, Limit: limit, Remaining: limit.Rate, Degraded: true}, nil
	case FallbackDeny:
		return nil, denied, nil
	case FallbackError:
		return nil, Result{}, errorf("concurrency %q: %w: %w", key, ErrUnavailable, c.cause(state))
	}
	// A semaphore that holds leases is never dropped for another key's:
	// its key would start again with every slot free. With every one
	// held, a new key is denied until one empties (an add looks at a few
	// semaphores only, so that a full map answers at once). The Redis
	// leases this instance holds on the key take slots too (c.held).
	now := cfg.now()
	capacity := fallbackCapacity(limit.Rate, cfg.share)
	held := c.held.At(state, now)
	kept := capacity - int(shareOf(int64(capacity), share))
	for {
		sem, ok := c.local.GetOrAddKeep(state, func() *localsem.Sem {
			c.sweepAt.Store(sweepNow) // made by the outage: dropped once Redis answers
			return localsem.New(capacity)
		}, func(s *localsem.Sem) bool { dead, _ := s.Retire(now); return !dead })
		if !ok {
			return nil, denied, nil
		}
		id, g, ok := sem.Acquire(now, c.limit.Period, held, capacity, kept)
		if !ok {
			continue // dropped meanwhile: the key's next one
		}
		res := Result{Allowed: g.Allowed, Limit: limit, Remaining: g.Remaining, RetryAfter: g.RetryAfter, ResetAfter: g.ResetAfter, Degraded: true, ByPriority: g.ByPriority}
		if !res.Allowed {
			return nil, res, nil
		}
		return &Lease{c: c, key: key, state: state, sem: sem, local: id, limit: limit}, res, nil
	}
}

// sweepNow is sweepAt when the in-process semaphores are to be swept at
// the next call Redis answers; sweeping is a sweep in progress.
const (
	sweepNow  = 1
	sweeping  = -1
	sweepNone = 0
)

// sweepIdle drops, once Redis answers again, the in-process semaphores
// that the outage made and that hold no live lease (see sweepAt): one
// goroutine, which Close waits for. A call that Redis answered calls it:
// one atomic load while there is nothing to sweep.
func (c *Concurrency) sweepIdle() {
	at := c.sweepAt.Load()
	if at == sweepNone || at == sweeping || (at != sweepNow && c.e.cfg.now().UnixNano() < at) {
		return
	}
	if !c.sweepAt.CompareAndSwap(at, sweeping) {
		return
	}
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	select {
	case <-c.done:
		return // closed: nothing is swept any more
	default:
	}
	c.sweepWG.Add(1)
	go func() {
		defer c.sweepWG.Done()
		now := c.e.cfg.now()
		var last time.Time // the latest expiry of a lease left
		left := c.local.Sweep(func(s *localsem.Sem) bool {
			dead, exp := s.Retire(now)
			if exp.After(last) {
				last = exp
			}
			return dead
		})
		next := int64(sweepNone)
		if left > 0 {
			// Leases still held: released ones drop their semaphore (see
			// Lease.Release); sweep again once every lease left has expired.
			next = max(last.UnixNano(), sweepNow+1)
		}
		c.sweepAt.CompareAndSwap(sweeping, next) // a semaphore made meanwhile set sweepNow
	}()
}

// cause returns the error that marked the node of state unavailable.
func (c *Concurrency) cause(state string) error {
	if err := c.e.rescue.downCause(state); err != nil {
		return err
	}
	return errors.New("marked unavailable")
}

// newLeaseID returns a random lease id: 64 bits, as 16 hex digits.
func newLeaseID() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// waiters is the wake-up channel of the Acquire calls waiting for one key
// in this process. A release sends one token (wakes one waiter); tokens
// that nobody takes only cause an early try.
type waiters struct {
	ch chan struct{}
	n  int
}

func (c *Concurrency) watch(key string) *waiters {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	w := c.waits[key]
	if w == nil {
		w = &waiters{ch: make(chan struct{}, c.wakeCap)}
		c.waits[key] = w
	}
	w.n++
	return w
}

func (c *Concurrency) unwatch(key string, w *waiters) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if w.n--; w.n == 0 {
		delete(c.waits, key)
	}
}

// wake tells one Acquire waiting for key, if any, that a slot was freed.
func (c *Concurrency) wake(key string) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if w := c.waits[key]; w != nil {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// Lease is one slot of a [Concurrency] key, held until Release, or until
// its ttl ends without an Extend. Its methods are safe for concurrent use.
type Lease struct {
	c     *Concurrency
	key   string
	state string
	id    string        // the member in Redis; empty for a lease taken in process
	sem   *localsem.Sem // FallbackLocal: the semaphore that holds it
	local uint64        // its id in sem, under sem's lock (Extend changes it)
	free  bool          // FallbackAllow: a lease that holds nothing
	limit Limit         // the key's limit when the lease was taken (Rate = max)
	done  atomic.Bool

	held localsem.Entry // a Redis lease's place in c.held
}

// releaseLocal ends l, a lease of the in-process fallback. Once Redis
// answers again, what the outage made goes as it empties (while it lasts,
// an idle semaphore is kept for the key's next lease, and dropped when
// room is needed).
func (c *Concurrency) releaseLocal(l *Lease) {
	if !l.sem.Release(&l.local) || c.e.rescue.isDown(l.state) {
		return
	}
	c.local.RemoveIf(l.state, func(s *localsem.Sem) bool {
		if s != l.sem {
			return false // dropped already, and made again
		}
		dead, _ := s.Retire(c.e.cfg.now())
		return dead
	})
}

// Release gives the slot back. It is idempotent: only the first call does
// anything, and releasing a lease that already expired is harmless (it
// cannot free another holder's slot). A Release whose ctx is already done
// (a deferred Release after the request's context was cancelled) still
// frees the slot, with a context detached from ctx and bounded by 1s. A
// release of a Redis lease that does not complete is made again in the
// background, at once and then every ping interval, until it succeeds, its
// ttl would have ended anyway, or Close (up to 10,000 pending): when ctx
// ends during the call (the error wraps ctx's error), and while Redis is
// unavailable (Release returns nil, or an error wrapping ErrUnavailable
// under FallbackError). A lease taken in process is released in process.
// Release works after Close. Releasing a nil Lease does nothing; a Lease
// that Acquire did not return (a zero Lease) is an error wrapping
// ErrInvalidArgument.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	if l.c == nil {
		return errorf("release a lease that Acquire did not return: %w", ErrInvalidArgument)
	}
	if err := checkContext(ctx); err != nil {
		return errorf("release lease of %q: %w", l.key, err)
	}
	if !l.done.CompareAndSwap(false, true) {
		return nil
	}
	c := l.c
	defer c.wake(l.key)
	switch {
	case l.sem != nil:
		c.releaseLocal(l)
		return nil
	case l.free:
		return nil
	}
	c.held.Remove(&l.held)
	if c.e.rescue.isDown(l.state) {
		return c.lostRelease(l)
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	_, _, err := c.eval(ctx, opRelease, l.state, l.id, l.limit, 0)
	switch {
	case err == nil:
		return nil
	case callerDone(ctx) != nil:
		// The command or its reply was lost, or is late: made again, so
		// that the caller's deadline does not keep the slot until ttl.
		c.queueRelease(l.key, l.state, l.id, true)
		return errorf("release %q (made again in the background): %w", l.key, callerDone(ctx))
	case c.e.rescue.outage(err, l.state):
		return c.lostRelease(l)
	}
	return errorf("release %q: %w", l.key, err)
}

// lostRelease is Release of a Redis lease while Redis is unavailable (or
// the call could not reach it, a full client pool included): the release
// is made again once Redis is back (queueRelease), so that the slot need
// not wait for the lease's ttl.
func (c *Concurrency) lostRelease(l *Lease) error {
	c.queueRelease(l.key, l.state, l.id, false)
	if c.e.cfg.fallback == FallbackError {
		return errorf("release %q (made again once Redis is back, or its slot comes back when its ttl ends): %w: %w", l.key, ErrUnavailable, c.cause(l.state))
	}
	return nil
}

// mayHaveRun reports whether a script call that failed with err, an
// outage, may have run in Redis: its command was sent, its reply lost. A
// refused connection or an error reply (LOADING, READONLY…) says it did
// not.
func mayHaveRun(err error) bool {
	var reply redis.Error
	return !outage.Unreachable(err) && !errors.As(err, &reply)
}

// queueRelease has the release of the Redis lease id of key made again
// in the background: at once if now is set, else at the next pass (the
// node is down: a try would be skipped), until it succeeds or its ttl
// would have ended anyway. Nothing is queued after Close, nor past
// maxPendingReleases: the slot comes back when its ttl ends. A release
// that Redis refuses with an error reply is dropped: made again it would
// fail again.
func (c *Concurrency) queueRelease(key, state, id string, now bool) {
	c.releases.Add(requeue.Call{Key: state, Until: time.Now().Add(c.limit.Period), Do: func(ctx context.Context) bool {
		_, _, err := c.eval(ctx, opRelease, state, id, c.limit, 0) // a release reads no max
		if err == nil {
			c.wake(key)
		}
		return outage.Is(err)
	}}, now)
}

// Extend renews the lease's ttl from now. A lease that expired (or was
// released) cannot be extended: the error wraps ErrLeaseExpired, and the
// slot may already be another holder's. While Redis is unavailable a lease
// taken on Redis cannot be extended either: the error wraps ErrUnavailable,
// and the lease keeps its old expiry in Redis. After Close, the error is
// ErrClosed.
func (l *Lease) Extend(ctx context.Context) error {
	if l == nil || l.c == nil {
		return errorf("extend a lease that Acquire did not return: %w", ErrInvalidArgument)
	}
	if err := checkContext(ctx); err != nil {
		return errorf("extend lease of %q: %w", l.key, err)
	}
	c := l.c
	if c.e.closed.Load() {
		return ErrClosed
	}
	if l.done.Load() {
		return errorf("extend lease of %q: released: %w", l.key, ErrLeaseExpired)
	}
	switch {
	case l.sem != nil:
		if !l.sem.Extend(&l.local, c.e.cfg.now(), c.limit.Period) {
			l.done.Store(true)
			return errorf("extend lease of %q: %w", l.key, ErrLeaseExpired)
		}
		return nil
	case l.free:
		return nil
	case c.e.rescue.isDown(l.state):
		return errorf("extend lease of %q: %w: %w", l.key, ErrUnavailable, c.cause(l.state))
	}
	_, code, err := c.eval(ctx, opExtend, l.state, l.id, l.limit, 0)
	if err != nil {
		if ctxErr := callerDone(ctx); ctxErr != nil {
			return errorf("extend lease of %q: %w", l.key, ctxErr)
		}
		if c.e.rescue.outage(err, l.state) {
			return errorf("extend lease of %q: %w: %w", l.key, ErrUnavailable, err)
		}
		return errorf("extend lease of %q: %w", l.key, err)
	}
	if code == leaseMissing {
		l.done.Store(true)
		c.held.Remove(&l.held)
		return errorf("extend lease of %q: %w", l.key, ErrLeaseExpired)
	}
	c.held.Extend(&l.held, &l.done)
	return nil
}
