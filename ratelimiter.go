package redlimit

import (
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
	engine
	limit Limit // the constructor's limit, with Burst filled in
}

func newRateLimiter(s Strategy, rdb redis.UniversalClient, limit Limit, opts []Option) (*RateLimiter, error) {
	alg, _ := algorithmOf(s)
	r, err := newRule("", alg, limit)
	if err != nil {
		return nil, err
	}
	l := &RateLimiter{limit: r.limit}
	if err := l.init(rdb, s.String(), []rule{r}, strategyScript(s), opts); err != nil {
		return nil, err
	}
	if l.cfg.rulesFunc != nil {
		_ = l.Close() // it joined the client's watches; unused, it has nothing to report
		return nil, errorf("%v: WithRulesFunc is for NewPolicy; use WithLimitFunc: %w", s, ErrInvalidArgument)
	}
	bake(l.own, &l.cfg)
	return l, nil
}

// Strategy returns the limiter's strategy.
func (l *RateLimiter) Strategy() Strategy { return l.own.rules[0].alg.strategy }

// Limit returns the limiter's limit, with Burst (and a sub-window
// counter's SubWindows) filled in. With
// [WithLimitFunc], calls may be decided by other limits.
func (l *RateLimiter) Limit() Limit { return l.limit }

// stateKey returns the Redis key that holds key's state under the
// limiter's own limit.
func (l *RateLimiter) stateKey(key string) string {
	return l.engine.stateKey(key, &l.own.rules[0])
}

// scripts holds the decision script of each strategy, made on first use:
// common.lua, the strategy's part, args.lua, decide.lua, the checks of
// rules passed as arguments and reply.lua (see decisionScript).
var scripts struct {
	once    [SubWindowCounter + 1]sync.Once
	byStrat [SubWindowCounter + 1]*redis.Script
	allOnce sync.Once
	all     *redis.Script

	calendar sync.Map // the files' names -> *redis.Script (see calendarScript)
}

var strategyFiles = [...]string{
	FixedWindow:      "fixedwindow.lua",
	SlidingLog:       "slidinglog.lua",
	SlidingCounter:   "slidingcounter.lua",
	TokenBucket:      "bucket.lua",
	LeakyBucket:      "bucket.lua",
	SubWindowCounter: "subwindow.lua",
}

// allStrategyFiles are the strategies' files, each once, in the order the
// scripts hold them.
var allStrategyFiles = []string{"fixedwindow.lua", "slidinglog.lua", "slidingcounter.lua", "bucket.lua", "subwindow.lua"}

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
		scripts.byStrat[s] = decisionScript([]string{strategyFiles[s]}, "", argumentChecks([]string{strategyFiles[s]}))
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
	s, _ := scripts.calendar.LoadOrStore(name, decisionScript(files, "", argumentChecks(files)))
	return s.(*redis.Script)
}

// policyScript returns the script that decides rules of every strategy.
func policyScript() *redis.Script {
	scripts.allOnce.Do(func() {
		scripts.all = decisionScript(allStrategyFiles, "", argumentChecks(allStrategyFiles))
	})
	return scripts.all
}
