package redlimit

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RateLimiter is a [Limiter] of one strategy, whose state lives in Redis,
// decided by one atomic Lua script per call. Every strategy constructor of
// this package returns one; its strategy is fixed at construction (its
// limit too, unless [WithLimitFunc] is given). It is safe for concurrent
// use.
//
// Call Close when done with it: it stops the goroutine that watches Redis
// during an outage.
type RateLimiter struct {
	*engine
	limit Limit // the constructor's limit, with Burst filled in
}

func newRateLimiter(s Strategy, rdb redis.UniversalClient, limit Limit, opts []Option) (*RateLimiter, error) {
	alg, _ := algorithmOf(s)
	r, err := newRule("", alg, limit)
	if err != nil {
		return nil, err
	}
	e, err := newEngine(rdb, s.String(), []rule{r}, strategyScript(s), opts)
	if err != nil {
		return nil, err
	}
	if e.cfg.rulesFunc != nil {
		return nil, errorf("%v: WithRulesFunc is for NewPolicy; use WithLimitFunc: %w", s, ErrInvalidArgument)
	}
	bake(e.own, e.cfg.functions)
	return &RateLimiter{engine: e, limit: r.limit}, nil
}

// Strategy returns the limiter's strategy.
func (l *RateLimiter) Strategy() Strategy { return l.own.rules[0].alg.strategy }

// Limit returns the limiter's limit, with Burst filled in. With
// [WithLimitFunc], calls may be decided by other limits.
func (l *RateLimiter) Limit() Limit { return l.limit }

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *RateLimiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.allowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and consumes them
// if so. See [Limiter].
func (l *RateLimiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.allowN(ctx, key, n)
}

// Wait is shorthand for WaitN(ctx, key, 1).
func (l *RateLimiter) Wait(ctx context.Context, key string) error {
	return l.waitN(ctx, key, 1)
}

// WaitN blocks until n events may happen for key and consumes them. It asks
// Redis about once per RetryAfter, never more often. When ctx has a deadline
// and the wait needed is longer than the time left, it returns at once an
// error wrapping context.DeadlineExceeded. A LeakyBucket limiter never takes
// a slot that it would have to wait for past the deadline.
func (l *RateLimiter) WaitN(ctx context.Context, key string, n int) error {
	return l.waitN(ctx, key, n)
}

// Reset forgets all state of key: its Redis key (counter, log or bucket),
// its penalty block, the pending reservations on that state, whichever
// limiter took them (settling one afterwards gives nothing back into the
// fresh state, and returns ErrSettled if it held nothing else) and so the
// unused events of prefetches, and this process's fallback and deny-cache
// entries.
func (l *RateLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, key)
}

// Close stops the limiter's fallback monitor, if one runs, and makes every
// later call return ErrClosed. It does not close the Redis client. It is
// safe to call more than once. With [WithPrefetch] it first gives back what
// the prefetches did not serve, within about 100 ms; its error (wrapping
// [ErrUnavailable]) says how many events of how many prefetches it could not
// give back, and the limiter is closed all the same.
func (l *RateLimiter) Close() error { return l.close() }

// stateKey returns the Redis key that holds key's state under the
// limiter's own limit.
func (l *RateLimiter) stateKey(key string) string {
	return l.engine.stateKey(key, &l.own.rules[0])
}

// scripts holds the decision script of each strategy, made on first use:
// common.lua, the strategy's part, args.lua, decide.lua, the checks of
// rules passed as arguments and reply.lua (see decisionScript).
var scripts struct {
	once    [LeakyBucket + 1]sync.Once
	byStrat [LeakyBucket + 1]*redis.Script
	allOnce sync.Once
	all     *redis.Script

	calendar sync.Map // the files' names -> *redis.Script (see calendarScript)
}

var strategyFiles = [...]string{
	FixedWindow:    "fixedwindow.lua",
	SlidingLog:     "slidinglog.lua",
	SlidingCounter: "slidingcounter.lua",
	TokenBucket:    "bucket.lua",
	LeakyBucket:    "bucket.lua",
}

// allStrategyFiles are the strategies' files, each once, in the order the
// scripts hold them.
var allStrategyFiles = []string{"fixedwindow.lua", "slidinglog.lua", "slidingcounter.lua", "bucket.lua"}

// everyFile is allStrategyFiles and the warm-up's file (warmup.go), which
// only the scripts of rules with a warm-up carry.
var everyFile = append(allStrategyFiles[:len(allStrategyFiles):len(allStrategyFiles)], warmFile)

// fileOf returns the strategy's file of an algorithm.
func fileOf(alg *algorithm) string {
	if alg.warm {
		return warmFile
	}
	return strategyFiles[alg.strategy]
}

// strategyScript returns the script that decides rules of strategy s only.
func strategyScript(s Strategy) *redis.Script {
	scripts.once[s].Do(func() {
		scripts.byStrat[s] = decisionScript([]string{strategyFiles[s]}, argumentChecks([]string{strategyFiles[s]}))
	})
	return scripts.byStrat[s]
}

// calendarFiles are the files of the settle script: every strategy's, the
// warm-up's and calendar.lua.
var calendarFiles = append(slices.Clip(everyFile), calendarFile)

// calendarScript returns the script that decides rules with a calendar
// rule among them, passed as arguments: calendar.lua and the files of the
// other rules' strategies (a script defines every function of its files on
// each call: with all of them, a calendar rule's decision cost Redis
// 85,446 instructions; with its own only, see docs/calendar.md).
func calendarScript(rules []rule) *redis.Script {
	var others []rule
	for _, r := range rules {
		if !r.limit.isCalendar() {
			others = append(others, r)
		}
	}
	files := append(strategyFilesOf(others), calendarFile)
	name := strings.Join(files, ",")
	if s, ok := scripts.calendar.Load(name); ok {
		return s.(*redis.Script)
	}
	s, _ := scripts.calendar.LoadOrStore(name, decisionScript(files, argumentChecks(files)))
	return s.(*redis.Script)
}

// policyScript returns the script that decides rules of every strategy.
func policyScript() *redis.Script {
	scripts.allOnce.Do(func() {
		scripts.all = decisionScript(allStrategyFiles, argumentChecks(allStrategyFiles))
	})
	return scripts.all
}
