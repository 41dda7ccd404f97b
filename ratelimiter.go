package redlimit

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// algorithm is what one strategy adds to the shared engine.
type algorithm struct {
	strategy Strategy
	code     string        // in the Redis key, after the hash tag
	script   *redis.Script // common.lua + the strategy's script
	maxRate  int           // largest Rate accepted
	bucket   bool          // capacity is Burst (else Rate)
	queue    bool          // leaky bucket: admitted events get a Delay
}

// RateLimiter is a [Limiter] whose state lives in Redis, decided by one
// atomic Lua script per call. Every constructor of this package returns
// one; its strategy is fixed at construction. It is safe for concurrent use.
//
// Call Close when done with it: it stops the goroutine that watches Redis
// during an outage.
type RateLimiter struct {
	alg   *algorithm
	rdb   redis.UniversalClient
	limit Limit
	cfg   config

	suffix    string // "}:" + code + period in µs
	blockKey  string // suffix of the block key, appended to the state key
	argRate   any
	argPeriod any
	argBurst  any
	argBlock  any

	rescue *rescue
	denies *denyCache
	closed atomic.Bool
}

var argNoMaxDelay any = int64(-1)

// minBucketInterval is the shortest Period/Rate a TokenBucket or
// LeakyBucket accepts.
const minBucketInterval = 10 * time.Microsecond

func newRateLimiter(alg *algorithm, rdb redis.UniversalClient, limit Limit, opts []Option) (*RateLimiter, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redlimit: %v: nil Redis client: %w", alg.strategy, ErrInvalidArgument)
	}
	l, err := limit.validate(alg.maxRate)
	if err != nil {
		return nil, err
	}
	if alg.bucket && float64(l.Burst)*float64(l.Period)/float64(l.Rate) > float64(MaxPeriod) {
		// A full bucket's worth of time must fit the TAT's range.
		return nil, fmt.Errorf("redlimit: %v %v: Burst×Period/Rate, the time to refill a bucket, must be at most %v: %w",
			alg.strategy, l, MaxPeriod, ErrInvalidLimit)
	}
	if alg.bucket && l.Period < time.Duration(l.Rate)*minBucketInterval {
		// The buckets keep time in quarter microseconds and round each
		// admission up to one (see scripts/gcra.lua): finer intervals would
		// lose more than 2.5% to rounding.
		return nil, fmt.Errorf("redlimit: %v %v: Period/Rate must be at least %v (at most 100,000 events per second per key): %w",
			alg.strategy, l, minBucketInterval, ErrInvalidLimit)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	periodUS := int64(l.Period / time.Microsecond)
	rl := &RateLimiter{
		alg:       alg,
		rdb:       rdb,
		limit:     l,
		cfg:       cfg,
		suffix:    "}:" + alg.code + strconv.FormatInt(periodUS, 10),
		argRate:   int64(l.Rate),
		argPeriod: periodUS,
		argBurst:  int64(l.Burst),
		argBlock:  int64(cfg.block / time.Microsecond),
	}
	rl.rescue = newRescue(rl)
	if cfg.denyCache > 0 {
		rl.denies = newDenyCache(cfg.denyCache)
	}
	return rl, nil
}

// Strategy returns the limiter's strategy.
func (l *RateLimiter) Strategy() Strategy { return l.alg.strategy }

// Limit returns the limiter's limit, with Burst filled in.
func (l *RateLimiter) Limit() Limit { return l.limit }

// maxN is the most events one call can ever be allowed.
func (l *RateLimiter) maxN() int {
	if l.alg.bucket {
		return l.limit.Burst
	}
	return l.limit.Rate
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *RateLimiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and consumes them
// if so. See [Limiter].
func (l *RateLimiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	if err := l.check(key, n); err != nil {
		return Result{}, err
	}
	res, _, err := l.call(ctx, key, n, -1)
	return res, err
}

// Wait is shorthand for WaitN(ctx, key, 1).
func (l *RateLimiter) Wait(ctx context.Context, key string) error {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until n events may happen for key and consumes them. It asks
// Redis about once per RetryAfter, never more often. When ctx has a deadline
// and the wait needed is longer than the time left, it returns at once an
// error wrapping context.DeadlineExceeded. A LeakyBucket limiter never takes
// a slot that it would have to wait for past the deadline.
func (l *RateLimiter) WaitN(ctx context.Context, key string, n int) error {
	if err := l.check(key, n); err != nil {
		return err
	}
	for {
		maxDelay := time.Duration(-1)
		deadline, hasDeadline := ctx.Deadline()
		if hasDeadline {
			// Keep a margin for the round trip: a leaky bucket slot whose
			// delay ends past the deadline would be taken for nothing.
			maxDelay = time.Until(deadline) - waitMargin
			if maxDelay <= 0 {
				return fmt.Errorf("redlimit: wait for %q: %w", key, context.DeadlineExceeded)
			}
		}
		res, why, err := l.call(ctx, key, n, maxDelay)
		if err != nil {
			return err
		}
		if res.Allowed {
			return sleep(ctx, res.Delay)
		}
		wait := res.RetryAfter
		if why == reasonMaxDelay || (hasDeadline && wait > time.Until(deadline)) {
			return fmt.Errorf("redlimit: wait for %q needs %v more than the context allows: %w", key, wait, context.DeadlineExceeded)
		}
		if wait < time.Millisecond {
			wait = time.Millisecond
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// waitMargin is the time WaitN keeps, before ctx's deadline, for the round
// trip that takes a leaky bucket slot.
const waitMargin = time.Millisecond

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redlimit: wait: %w", ctx.Err())
	}
}

// Reset forgets all state of key: its Redis keys (counter, log or bucket,
// and penalty block), and this process's fallback and deny-cache entries.
func (l *RateLimiter) Reset(ctx context.Context, key string) error {
	if err := l.check(key, 0); err != nil {
		return err
	}
	l.rescue.forget(key)
	if l.denies != nil {
		l.denies.forget(key)
	}
	state := l.stateKey(key)
	if err := l.rdb.Del(ctx, state, state+blockSuffix).Err(); err != nil {
		return fmt.Errorf("redlimit: reset %q: %w", key, err)
	}
	return nil
}

// Close stops the limiter's fallback monitor, if one runs, and makes every
// later call return ErrClosed. It does not close the Redis client. It is
// safe to call more than once.
func (l *RateLimiter) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		l.rescue.close()
	}
	return nil
}

func (l *RateLimiter) check(key string, n int) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("redlimit: n = %d is negative: %w", n, ErrInvalidArgument)
	}
	if n > l.maxN() {
		return fmt.Errorf("redlimit: n = %d, but %v %v allows at most %d at once: %w",
			n, l.alg.strategy, l.limit, l.maxN(), ErrExceedsLimit)
	}
	return nil
}

const blockSuffix = ":b"

// stateKey returns the Redis key that holds key's state.
func (l *RateLimiter) stateKey(key string) string {
	return l.cfg.prefix + ":{" + escapeKey(key) + l.suffix
}

// reason says what decided: the last field of a script reply, or a local one.
type reason int8

const (
	reasonAllowed   reason = 0 // allowed
	reasonLimit     reason = 1 // denied by the limit
	reasonBlock     reason = 2 // denied by a penalty block
	reasonMaxDelay  reason = 3 // denied: the wait would pass the caller's deadline
	reasonDenyCache reason = 4 // denied by this process's deny cache
)

// decide makes one decision: from the deny cache, from Redis, or from the
// fallback while Redis is down.
func (l *RateLimiter) decide(ctx context.Context, key string, n int, maxDelay time.Duration) (Result, reason, error) {
	if l.denies != nil && n > 0 {
		if res, ok := l.denies.lookup(key, n, l.limit); ok {
			return res, reasonDenyCache, nil
		}
	}
	if l.rescue.isDown() {
		return l.rescue.decide(key, n, maxDelay)
	}
	state := l.stateKey(key)
	res, why, err := l.eval(ctx, state, n, maxDelay)
	if err != nil {
		if ctxErr := callerDone(ctx); ctxErr != nil {
			return Result{}, 0, fmt.Errorf("redlimit: %v %q: %w", l.alg.strategy, key, ctxErr)
		}
		if !isUnavailable(err) {
			return Result{}, 0, fmt.Errorf("redlimit: %v %q: %w", l.alg.strategy, key, err)
		}
		l.rescue.markDown(err, state)
		return l.rescue.decide(key, n, maxDelay)
	}
	if l.denies != nil && !res.Allowed && why != reasonMaxDelay {
		l.denies.remember(key, n, res.RetryAfter)
	}
	return res, why, nil
}

// callerDone returns the caller's context error, if the context is done or
// its deadline has passed (a socket deadline set from it can fire a moment
// before the context's own timer does).
func callerDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// evalArgs holds the keys and arguments of one script call. go-redis
// copies them into its command, so they are reused through a pool: a
// decision allocates only its key name.
type evalArgs struct {
	keys [2]string
	args [6]any
}

var evalArgsPool = sync.Pool{New: func() any { return new(evalArgs) }}

// eval runs the strategy's script for one decision.
func (l *RateLimiter) eval(ctx context.Context, state string, n int, maxDelay time.Duration) (Result, reason, error) {
	a := evalArgsPool.Get().(*evalArgs)
	defer func() {
		*a = evalArgs{}
		evalArgsPool.Put(a)
	}()
	a.keys[0] = state
	keys := a.keys[:1]
	if l.cfg.block > 0 {
		a.keys[1] = state + blockSuffix
		keys = a.keys[:2]
	}
	// The optional arguments (max delay, block) are sent only when needed.
	a.args = [6]any{l.argRate, l.argPeriod, l.argBurst, n, argNoMaxDelay, l.argBlock}
	args := a.args[:4]
	if maxDelay >= 0 && l.alg.queue {
		a.args[4] = int64(maxDelay / time.Microsecond)
		args = a.args[:5]
	}
	if l.cfg.block > 0 {
		args = a.args[:6]
	}
	reply, err := l.alg.script.Run(ctx, l.rdb, keys, args...).Slice()
	if err != nil {
		return Result{}, 0, err
	}
	return l.parse(reply)
}

// parse decodes a script reply (see scripts/common.lua): code, remaining,
// delay or retry after, reset after.
func (l *RateLimiter) parse(reply []any) (Result, reason, error) {
	if len(reply) != 4 {
		return Result{}, 0, fmt.Errorf("redlimit: %v: script replied %d values, want 4", l.alg.strategy, len(reply))
	}
	var v [4]int64
	for i, x := range reply {
		n, ok := x.(int64)
		if !ok {
			return Result{}, 0, fmt.Errorf("redlimit: %v: script reply %d is %T, want an integer", l.alg.strategy, i, x)
		}
		v[i] = n
	}
	why := reason(v[0])
	wait := time.Duration(max(v[2], 0)) * time.Microsecond
	res := Result{
		Allowed:    why == reasonAllowed,
		Limit:      l.limit,
		Remaining:  int(max(v[1], 0)),
		ResetAfter: time.Duration(max(v[3], 0)) * time.Microsecond,
	}
	if res.Allowed {
		res.Delay = wait
	} else {
		res.RetryAfter = wait
	}
	return res, why, nil
}
