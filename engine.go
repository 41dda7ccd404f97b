package redlimit

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/calldelay"
	"github.com/redlimit/redlimit/internal/evictwatch"
	"github.com/redlimit/redlimit/internal/requeue"
)

// algorithm is what one strategy adds to the shared engine.
type algorithm struct {
	strategy Strategy
	code     string // in the Redis key after the hash tag, and in the script's arguments
	maxRate  int    // largest Rate accepted
	bucket   bool   // capacity is Burst (else Rate)
	queue    bool   // leaky bucket: admitted events get a Delay
	warm     bool   // a bucket with a warm-up (warmup.go): its code carries Limit.WarmUp
}

// algorithms lists each strategy's algorithm, declared in its own file
// (fixedwindow.go, slidinglog.go, ...), by Strategy.
var algorithms = [...]*algorithm{
	FixedWindow:      fixedWindow,
	SlidingLog:       slidingLog,
	SlidingCounter:   slidingCounter,
	TokenBucket:      tokenBucket,
	LeakyBucket:      leakyBucket,
	SubWindowCounter: subWindowCounter,
}

func algorithmOf(s Strategy) (*algorithm, bool) {
	if s < FixedWindow || s > SubWindowCounter {
		return nil, false
	}
	return algorithms[s], true
}

// rule is one limit as the engine decides it: a single-strategy limiter has
// one, a Policy up to MaxRules.
type rule struct {
	name    string
	alg     *algorithm
	limit   Limit  // validated, Burst filled in
	suffix  string // "}:" + alg.code + period in µs: the state key after the tag
	code    string // the strategy code the check sees: alg.code, and a warm-up's µs (warmup.go)
	args    [4]any // the script's arguments for this rule: code, rate, period, burst
	perCall bool   // counts each call as one event (Rule.PerCall)
}

// newRule validates a limit for a strategy and prepares its arguments.
func newRule(name string, alg *algorithm, limit Limit) (rule, error) {
	l, err := limit.validate(alg.maxRate)
	if err != nil {
		return rule{}, errorf("%v: %w", alg.strategy, err)
	}
	code := alg.code
	if limit.WarmUp != 0 {
		if alg, err = warmAlgorithm(alg, limit); err != nil {
			return rule{}, err
		}
		code = alg.code + strconv.FormatInt(int64(l.WarmUp/time.Microsecond), 10)
	}
	sub, err := subWindows(alg, l)
	if err != nil {
		return rule{}, err
	}
	if l.isCalendar() {
		return newCalendarRule(name, alg, l)
	}
	if alg.bucket && float64(l.Burst)*float64(l.Period)/float64(l.Rate) > float64(MaxPeriod) {
		// The key's lifetime, the time to refill a whole bucket, must fit.
		return rule{}, errorf("%v %v: Burst×Period/Rate, the time to refill a bucket, must be at most %v: %w",
			alg.strategy, l, MaxPeriod, ErrInvalidLimit)
	}
	periodUS := int64(l.Period / time.Microsecond)
	if sub > 0 {
		// The sub-windows take the burst's place (see scripts/subwindow.lua).
		l.SubWindows = sub
		return rule{name: name, alg: alg, limit: l, suffix: subWindowSuffix(periodUS, sub), code: code,
			args: [4]any{code, int64(l.Rate), periodUS, int64(sub)}}, nil
	}
	return rule{
		name:   name,
		alg:    alg,
		limit:  l,
		suffix: "}:" + alg.code + strconv.FormatInt(periodUS, 10),
		code:   code,
		args:   [4]any{code, int64(l.Rate), periodUS, int64(l.Burst)},
	}, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// count is the events the rule counts for a call of n.
func (r *rule) count(n int) int {
	if r.perCall {
		return min(n, 1)
	}
	return n
}

// capacity is the most events one call can ever be allowed by the rule.
func (r *rule) capacity() int {
	if r.alg.bucket {
		return r.limit.Burst
	}
	return r.limit.Rate
}

// sigOf identifies the limits of rules (FNV-1a of their strategies, limits
// and calendars), for the deny cache and the fallback.
func sigOf(rules []rule) uint64 {
	h := uint64(14695981039346656037)
	mix := func(v int64) {
		for i := 0; i < 8; i++ {
			h ^= uint64(byte(v >> (8 * i)))
			h *= 1099511628211
		}
	}
	for i := range rules {
		r := &rules[i]
		mix(int64(r.alg.strategy))
		mix(int64(r.limit.Rate))
		mix(int64(r.limit.Period))
		mix(int64(r.limit.Burst))
		mix(int64(r.limit.WarmUp))
		mix(int64(btoi(r.perCall)))
		if r.limit.SubWindows != 0 {
			mix(int64(r.limit.SubWindows))
		}
		if r.limit.isCalendar() {
			for _, c := range r.suffix {
				mix(int64(c))
			}
		}
	}
	return h
}

// ruleSet is the rules of one decision, with what the engine derives from
// them once.
type ruleSet struct {
	rules []rule
	maxN  int // the smallest capacity over the rules
	// block is the penalty block key after the hash tag (see blockKey):
	// the suffix of the rule whose suffix sorts first, then blockSuffix.
	block string
	sig   uint64 // identifies the limits, for the deny cache and the fallback
	logs  int    // sliding-log rules that count n: n·logs is at most MaxSlidingLogN
	queue bool   // a leaky-bucket rule: its calls' round trips are measured (see delayBound)
	warm  bool   // a rule with a warm-up: decided by warmScript when not written in
	// calendar: a calendar rule, whose window the call sends (see
	// appendRuleArgs): decided by calScript, with the rules as arguments.
	calendar  bool
	calScript *redis.Script
	// counting: a rule counts n (not only calls); per-call rules then
	// limit Remaining only when they have no call left.
	counting bool
	// script, when not nil, decides these rules with them written in (see
	// bake): the call passes no rule arguments; fn, set only with
	// WithRedisFunctions, is the same as a Redis Function.
	script *redis.Script
	fn     *redisFunction
	run    runner // asks Redis (runner.go)
}

func newRuleSet(rules []rule) *ruleSet {
	rs := &ruleSet{rules: rules, maxN: MaxRate, sig: sigOf(rules)}
	for i := range rules {
		r := &rules[i]
		if !r.perCall {
			rs.maxN = min(rs.maxN, r.capacity())
			rs.counting = true
		}
		if r.alg.strategy == SlidingLog && !r.perCall {
			rs.logs++
		}
		rs.queue = rs.queue || r.alg.queue
		rs.warm = rs.warm || r.alg.warm
		rs.calendar = rs.calendar || r.limit.isCalendar()
	}
	rs.run = argsRunner{warm: rs.warm}
	if rs.calendar {
		rs.calScript = calendarScript(rules)
		rs.run = calendarRunner{}
	}
	// The penalty block is the rule set's, whatever the order of its rules
	// (a WithRulesFunc may build them from a map): it is kept beside the
	// state of the rule whose suffix (strategy code and period) sorts
	// first, so a single rule keeps its state key's.
	b := 0
	for i := range rules {
		if rules[i].suffix < rules[b].suffix {
			b = i
		}
	}
	rs.block = rules[b].suffix + blockSuffix
	return rs
}

// engine is what RateLimiter and Policy share: the Redis client, the
// options, the script, the fallback and the deny cache. Both embed it, so
// its exported methods (the [Limiter] methods, Reserve and PrefetchStats)
// are theirs, and are documented for both. They embed it as a value: its
// pointer methods are then those of *RateLimiter and *Policy only, as when
// each type declared them.
type engine struct {
	rdb    redis.UniversalClient
	cfg    config
	own    *ruleSet      // the limiter's own rules
	script *redis.Script // decides every strategy that the rules may use
	kind   string        // in errors: the strategy's name or "policy"
	clock  *clientClock  // nil: the server's TIME

	rescue     *rescue
	settles    *requeue.Queue    // settles that an outage interrupted (reserve.go)
	evict      *evictwatch.Watch // WithEvictionCheck (evict.go)
	denies     *denyCache
	prefetcher *prefetcher // WithPrefetch; nil when off
	regions    *exchange   // WithRegions; nil when off
	decide     decider     // the decision's stages (buildPipeline)
	limits     limitCache  // WithLimitFunc's limits, validated
	closed     atomic.Bool
	// noFunctions: the server cannot run the rules' Redis Function
	// (WithRedisFunctions); the script decides instead.
	noFunctions atomic.Bool
	// delayRTT is the round trip (ns) of the latest script call of rules
	// with a leaky bucket: the next call that bounds its Delay (WaitN's
	// with a deadline, or grpclimit's through calldelay) keeps twice it for
	// the reply (see delayBound).
	delayRTT atomic.Int64
	// serverAhead (µs) is how far the server's clock was ahead of this
	// process's at the latest call of a calendar rule that missed its
	// window (see evalCalendar): later calls estimate the server's time
	// with it.
	serverAhead atomic.Int64
}

// newEngine returns a new engine (see init).
func newEngine(rdb redis.UniversalClient, kind string, rules []rule, script *redis.Script, opts []Option) (*engine, error) {
	e := new(engine)
	if err := e.init(rdb, kind, rules, script, opts); err != nil {
		return nil, err
	}
	return e, nil
}

// init makes the zero engine e, in the limiter that holds it, ready, or
// says why the arguments cannot make one.
func (e *engine) init(rdb redis.UniversalClient, kind string, rules []rule, script *redis.Script, opts []Option) error {
	if isNilClient(rdb) {
		return errorf("%s: nil Redis client: %w", kind, ErrInvalidArgument)
	}
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return errorf("%s: option %d is nil: %w", kind, i, ErrInvalidArgument)
		}
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := cfg.prefetch.check(kind, rules, cfg.reserveTTL); err != nil {
		return err
	}
	if cfg.regions != nil {
		if err := cfg.regions.check(rules); err != nil {
			return errorf("%s: %w", kind, err)
		}
	}
	if err := checkClient(rdb); err != nil {
		return errorf("%s: %w", kind, err)
	}
	e.rdb, e.cfg, e.own, e.script, e.kind = rdb, cfg, newRuleSet(rules), script, kind
	if cfg.clientClock {
		e.clock = newClientClock(rdb, cfg.now)
	}
	e.rescue = newRescue(e)
	e.settles = requeue.New(e.rescue.isDown, cfg.pingInterval, maxPendingSettles)
	e.evict = joinEvictWatch(e, cfg.evictEvery)
	if cfg.denyCache > 0 {
		e.denies = newDenyCache(cfg.denyCache)
	}
	if cfg.prefetch.size > 0 {
		e.prefetcher = newPrefetcher(e)
	}
	if cfg.regions != nil {
		e.regions = newExchange(e, cfg.regions)
	}
	e.decide = e.buildPipeline()
	// A node that another limiter on the client marked down is down for
	// this one too: its hook is told at once.
	e.rescue.Flush()
	return nil
}

// check rejects calls that cannot be decided.
func (e *engine) check(key string, n int, rs *ruleSet) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	return e.checkCount("n", n, rs)
}

// checkCount rejects a count of events that rs cannot take in one call:
// a call's n, or the used of a settle (name says which).
func (e *engine) checkCount(name string, n int, rs *ruleSet) error {
	switch {
	case n < 0:
		return errorf("%s = %d is negative: %w", name, n, ErrInvalidArgument)
	case n > rs.maxN:
		return errorf("%s = %d, but %s allows at most %d at once: %w",
			name, n, e.describe(rs), rs.maxN, ErrExceedsLimit)
	case rs.logs > 0 && n > MaxSlidingLogN/rs.logs:
		return errorf("%s = %d: sliding logs take at most %d events per call between them, here %d each (use a sliding counter or a bucket to weigh calls): %w",
			name, n, MaxSlidingLogN, MaxSlidingLogN/rs.logs, ErrInvalidArgument)
	}
	return nil
}

func (e *engine) describe(rs *ruleSet) string {
	if len(rs.rules) == 1 {
		return rs.rules[0].alg.strategy.String() + " " + rs.rules[0].limit.String()
	}
	s := "policy"
	for i := range rs.rules {
		s += " " + rs.rules[i].name + "=" + rs.rules[i].limit.String()
	}
	return s
}

// rulesFor returns the rules that decide key: the limiter's own, or those
// of the limit function (see WithLimitFunc and WithRulesFunc).
func (e *engine) rulesFor(ctx context.Context, key string) (*ruleSet, error) {
	if e.cfg.limitFunc == nil && e.cfg.rulesFunc == nil {
		return e.own, nil
	}
	return e.dynamicRules(ctx, key)
}

// rulesChecked returns the rules that decide n events for key, or why the
// call cannot be decided.
func (e *engine) rulesChecked(ctx context.Context, key string, n int) (*ruleSet, error) {
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	rs, err := e.rulesFor(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := e.check(key, n, rs); err != nil {
		if e.cfg.observer != nil && errors.Is(err, ErrExceedsLimit) {
			e.observeExceeds(ctx, key, n, rs, err)
		}
		return nil, err
	}
	return rs, nil
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (e *engine) Allow(ctx context.Context, key string) (Result, error) {
	return e.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and consumes them
// if so; for a [Policy], under every rule, and in every rule. See [Limiter].
// n larger than the smallest capacity among the rules (a [RateLimiter]'s
// limit) is an error wrapping ErrExceedsLimit.
func (e *engine) AllowN(ctx context.Context, key string, n int) (Result, error) {
	rs, err := e.rulesChecked(ctx, key, n)
	if err != nil {
		return Result{}, err
	}
	maxDelay := time.Duration(-1)
	if d, deadline, ok := calldelay.From(ctx); ok { // httplimit's or grpclimit's bound
		maxDelay = d // a longest Delay
		if !deadline.IsZero() {
			maxDelay = e.delayBound(time.Until(deadline) - waitMargin)
		}
	}
	res, _, err := e.call(ctx, key, n, maxDelay, rs, nil)
	return res, err
}

// delayBound is the Delay a call may be given when its caller must be done
// waiting it, from the reply, within d: d less twice the latest round trip
// of a leaky bucket's rules (its Delay runs from when the script ran, the
// wait from the reply). At 0, the call still asks Redis (a bucket that
// delays nothing allows), and its round trip is measured again, so one
// slow call does not end later ones for good.
func (e *engine) delayBound(d time.Duration) time.Duration {
	return max(d-2*time.Duration(e.delayRTT.Load()), 0)
}

// Wait is shorthand for WaitN(ctx, key, 1).
func (e *engine) Wait(ctx context.Context, key string) error {
	return e.WaitN(ctx, key, 1)
}

// WaitN blocks until n events may happen for key (for a [Policy], until
// every rule allows them) and consumes them. It asks Redis about once per
// RetryAfter, never more often. When ctx has a deadline and the wait needed
// is longer than the time left, it returns at once an error wrapping
// context.DeadlineExceeded. n = 0 returns at once (ctx's error, if it is
// done). A LeakyBucket limiter, or a policy's
// LeakyBucket rule, never takes a slot that it would have to wait for past
// the deadline.
func (e *engine) WaitN(ctx context.Context, key string, n int) error {
	rs, err := e.rulesChecked(ctx, key, n)
	if err != nil {
		return err
	}
	if n == 0 {
		// Zero events may always happen: no call, and no sleep until a
		// leaky bucket's next slot, which AllowN(ctx, key, 0) reports.
		return ctx.Err()
	}
	for {
		maxDelay := time.Duration(-1)
		deadline, hasDeadline := ctx.Deadline()
		if hasDeadline {
			left := time.Until(deadline) - waitMargin
			if left <= 0 {
				return errorf("wait for %q: %w", key, context.DeadlineExceeded)
			}
			// A slot whose sleep would end past the deadline would be
			// taken for nothing.
			maxDelay = e.delayBound(left)
		}
		res, why, err := e.call(ctx, key, n, maxDelay, rs, nil)
		if err != nil {
			return err
		}
		if res.Allowed {
			return sleep(ctx, res.Delay)
		}
		wait := res.RetryAfter
		if why == reasonMaxDelay || (hasDeadline && wait > time.Until(deadline)) {
			return errorf("wait for %q needs %v more than the context allows: %w", key, wait, context.DeadlineExceeded)
		}
		if wait < time.Millisecond {
			wait = time.Millisecond
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// waitMargin is the least time WaitN keeps, before ctx's deadline, for the
// round trip that takes a leaky bucket slot; delayBound keeps more for a
// slow one (with 1 ms only, a 2 ms round trip took slots whose sleep then
// ended past the deadline).
const waitMargin = time.Millisecond

// detach returns a context with ctx's values but not its end, which ends
// after timeout or when life does: work that others wait for, or that
// must land, goes on when the call that started it returns, and stops at
// the limiter's Close (a prefetch being taken, a client-clock measurement).
func detach(ctx, life context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	stop := context.AfterFunc(life, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

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
		return errorf("wait: %w", ctx.Err())
	}
}

// Reset forgets all state of key: its Redis key under each rule (counter,
// log or bucket), its penalty block, the pending reservations on that
// state, whichever limiter took them (settling one afterwards gives
// nothing back into the fresh state, and returns ErrSettled if it held
// nothing else) and so the unused events of prefetches, and this process's
// fallback and deny-cache entries.
func (e *engine) Reset(ctx context.Context, key string) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkContext(ctx); err != nil {
		return err
	}
	rs, err := e.rulesFor(ctx, key)
	if err != nil {
		return err
	}
	first := e.stateKey(key, &rs.rules[0])
	if e.prefetcher != nil {
		e.prefetcher.drop(ctx, first)
	}
	e.rescue.forget(first)
	if e.denies != nil {
		e.denies.Forget(first)
	}
	keys := make([]string, 0, 2*len(rs.rules)+1)
	for i := range rs.rules {
		keys = append(keys, ruleKey(first, rs, i))
	}
	// The reservations too (and so the prefetches): settled after the reset,
	// one would give its events back into the fresh state.
	keys = append(keys, blockKeyOf(first, rs))
	keys = appendReserveKeys(keys, first, rs)
	if err := e.rdb.Del(ctx, keys...).Err(); err != nil {
		return errorf("reset %q: %w", key, err)
	}
	// Again: a call sent between the first forget and the DEL was decided
	// on the old state, and its denial, or a prefetch it took, must not
	// outlive it (the prefetch's reservation went with the DEL: given back,
	// it gives nothing).
	if e.prefetcher != nil {
		e.prefetcher.drop(ctx, first)
	}
	if e.denies != nil {
		e.denies.Forget(first)
	}
	return nil
}

// Close stops the limiter's fallback monitor, if one runs, and makes every
// later call return ErrClosed. It does not close the Redis client. It is
// safe to call more than once. With [WithPrefetch] it first gives back what
// the prefetches did not serve, within about 100 ms; its error (wrapping
// [ErrUnavailable]) says how many events of how many prefetches it could not
// give back, and the limiter is closed all the same.
func (e *engine) Close() error {
	// Its error also says how many queued settles it could not make.
	var err error
	if e.closed.CompareAndSwap(false, true) {
		if e.prefetcher != nil {
			err = e.prefetcher.close() // gives back what the prefetches did not serve
		}
		if n := e.settles.Close(true); n > 0 {
			err = errors.Join(err, errorf("close: %d settles could not be made (Redis unavailable): their reservations stand as taken until their lifetime ends: %w", n, ErrUnavailable))
		}
		e.rescue.close()
		e.evict.Leave(e)
		if e.regions != nil {
			e.regions.close()
		}
		if e.clock != nil {
			e.clock.Close() // after the prefetches, whose give-back may read it
		}
	}
	return err
}

const (
	blockSuffix   = ":b"
	reserveSuffix = ":r"
)

// stateKey returns the Redis key of a rule's state for key.
func (e *engine) stateKey(key string, r *rule) string {
	return e.cfg.prefix + ":{" + escapeKey(key) + r.suffix
}

// ruleKey returns the state key of rule i of rs, from that of rule 0
// (which also names the key in this process's maps).
func ruleKey(first string, rs *ruleSet, i int) string {
	if i == 0 {
		return first
	}
	return first[:len(first)-len(rs.rules[0].suffix)] + rs.rules[i].suffix
}

// blockKey returns the penalty block key of rs for key (see WithBlock).
func (e *engine) blockKey(key string, rs *ruleSet) string {
	return blockKeyOf(e.stateKey(key, &rs.rules[0]), rs)
}

// blockKeyOf returns the penalty block key of rs from the state key of
// rule 0: the same for rs's rules in any order, in the key's slot, and
// for a single rule its state key and blockSuffix.
func blockKeyOf(first string, rs *ruleSet) string {
	return first[:len(first)-len(rs.rules[0].suffix)] + rs.block
}

// appendReserveKeys appends to keys the keys of the pending reservations of
// each rule of rs (see reserve.go), from the state key of rule 0: beside
// each rule's state, so that a Reset of that state forgets them.
func appendReserveKeys(keys []string, first string, rs *ruleSet) []string {
	for i := range rs.rules {
		keys = append(keys, ruleKey(first, rs, i)+reserveSuffix)
	}
	return keys
}

// reason says what decided: the first field of a script reply, or a local one.
type reason int8

const (
	reasonAllowed   reason = 0 // allowed
	reasonLimit     reason = 1 // denied by the limit
	reasonBlock     reason = 2 // denied by a penalty block
	reasonMaxDelay  reason = 3 // denied: the wait would pass the caller's deadline
	reasonDenyCache reason = 4 // denied by this process's deny cache
	reasonPriority  reason = 5 // denied by the call's priority share only (WithPriorityShares)
)

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
// copies them into its command, so they are reused (see request).
type evalArgs struct {
	keys []string
	args []any
}

var (
	argZero       any = int64(0)
	argNoMaxDelay any = int64(-1)
	argNoRID      any = ""
)

// defaultArgs are the decision script's first arguments when they are
// their defaults: n, the number of rules (with several written in, the
// script's own: see run), now, max delay, block, reservation id and life
// (see scripts/common.lua). eval compares them as
// interfaces, so each has the type eval passes (int for n and the number
// of rules; TestBakedScriptSendsNoRules fails if they drift apart).
var defaultArgs = [...]any{1, 1, argZero, argNoMaxDelay, argZero, argNoRID, argZero}

// eval asks Redis for r's decision with its rule set's runner (see
// scripts/common.lua for the script's keys and arguments). Every reply,
// whichever runner made it, goes through answered.
func (e *engine) eval(r *request) error {
	sent := monoNow()
	rs := r.rs
	a := &r.args
	for i := range rs.rules {
		a.keys = append(a.keys, ruleKey(r.state, rs, i))
	}
	r.now = argZero
	if e.clock != nil {
		us, err := e.clock.NowMicros(r.ctx)
		if err != nil {
			return err
		}
		r.now = us
	}
	md := argNoMaxDelay
	if r.maxDelay >= 0 {
		md = int64(r.maxDelay / time.Microsecond)
	}
	block := argZero
	if e.cfg.block > 0 {
		block = e.cfg.argBlock
		a.keys = append(a.keys, blockKeyOf(r.state, rs))
	}
	ridArg, life := argNoRID, argZero
	if r.rc != nil {
		ridArg, life = r.rc.id, e.cfg.argReserveTTL
		a.keys = appendReserveKeys(a.keys, r.state, rs)
	}
	if e.regions != nil { // the key's journal (scripts/region.lua)
		a.keys = append(a.keys, e.regions.journalKey(r.state, rs))
	}
	a.args = append(a.args, r.n, len(rs.rules), r.now, md, block, ridArg, life)
	if rs.queue { // a leaky bucket: the next bounded Delay keeps twice this round trip (delayBound)
		defer func(start time.Time) { e.delayRTT.Store(int64(time.Since(start))) }(time.Now())
	}
	reply, err := rs.run.run(e, r)
	if err != nil {
		return err
	}
	r.res, r.why, err = e.answered(r.state, reply, r.n, sent, rs, r.rc)
	if e.regions != nil {
		e.regions.note(r.state, rs)
	}
	return err
}

// evalState asks Redis, as eval, for n events of the key whose first state
// key is state, under rs (rc: as a reservation), for a caller outside the
// pipeline (the prefetcher taking a prefetch, or asking alone).
func (e *engine) evalState(ctx context.Context, state string, n int, rs *ruleSet, rc *reserveCall) (Result, reason, error) {
	r := newRequest(ctx, "", state, n, -1, rs, rc)
	defer r.free()
	err := e.eval(r)
	return r.res, r.why, err
}

// answered parses Redis's reply to a decision of n on rs, sent at sent
// (monoNow), for the key whose first state key is first, and notes it for
// the fallback (see answers, and noteBlock): the one place every
// decision's reply passes.
func (e *engine) answered(first string, reply any, n int, sent int64, rs *ruleSet, rc *reserveCall) (Result, reason, error) {
	e.noteBlock(first, rs, reply)
	var ra ruleAnswers
	res, why, err := e.parse(reply, rs, rc, &ra)
	if err == nil && e.rescue.answers != nil {
		noteAnswer(e.rescue.answers, first, rs, n, &res, &ra, sent)
	}
	return res, why, err
}

// noteBlock gives the fallback the penalty block of a reply to a decision
// on rs that a block denied (code 2, see scripts/common.lua): the key whose
// first state key is first is blocked for the reply's sixth value, the
// block's time left (its RetryAfter, the call's own, may be longer). A
// call that sets a block is noted where it is made (engine.decide).
func (e *engine) noteBlock(first string, rs *ruleSet, reply any) {
	r, ok := reply.([]any)
	if !ok || len(r) != 6 {
		return
	}
	if code, ok := r[0].(int64); !ok || code&^clockBehind != int64(reasonBlock) {
		return
	}
	if left, ok := r[5].(int64); ok {
		e.rescue.block(first, rs, micros(left))
	}
}

// behind makes the client clock, if any, measure again: a script found the
// time it sent behind its key's (see clockBehind).
func (e *engine) behind() {
	if e.clock != nil {
		e.clock.Behind()
	}
}

// micros converts a script's µs (a wait or a reset) to a Duration: never
// negative, and at most the longest Duration (about 292 years) rather than
// wrapping around.
func micros(v int64) time.Duration {
	switch {
	case v <= 0:
		return 0
	case v > math.MaxInt64/int64(time.Microsecond):
		return math.MaxInt64
	}
	return time.Duration(v) * time.Microsecond
}

// le64 reads a little-endian int64 from the start of s.
func le64(s string) int64 {
	_ = s[7] // one bounds check
	return int64(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
}

// clockBehind is added to a script reply's code (decision scripts and
// concurrency.lua) when the time the call sent (WithClientClock) is behind
// its key's time by more than the scripts' tolerance, 100 ms: the limiter
// then measures its clock again (clientClock.Behind).
const clockBehind = 64

// packedReply is the length of a reply packed in one string (see
// scripts/common.lua): code, remaining, delay or retry after, reset
// after, deciding rule, as a byte, three little-endian int64 and a byte;
// then, with several rules, the deciding rule's own reset after; then,
// for several rules or a call with a share, each rule's remaining
// allowance, each a little-endian int64.
const packedReply = 26

// parse decodes a script reply (see scripts/common.lua): code, remaining,
// delay or retry after, reset after, deciding rule, as an array or packed
// in one string; with several rules, the deciding rule's own reset after;
// for an admitted reservation (rc not nil, an array), each rule's tag;
// and, for several rules or a call with a share, each rule's remaining
// allowance, into ra (nil: not wanted).
func (e *engine) parse(reply any, rs *ruleSet, rc *reserveCall, ra *ruleAnswers) (Result, reason, error) {
	var v [5]int64
	own := int64(-1) // the deciding rule's own reset after, when the reply has it
	var err error
	switch r := reply.(type) {
	case string:
		own, err = e.parsePacked(r, &v, rs, rc, ra)
	case []any:
		own, err = e.parseArray(r, &v, rs, rc, ra)
	default:
		err = errorf("%s: script replied %T, want an array or a string", e.kind, reply)
	}
	if err != nil {
		return Result{}, 0, err
	}
	return resultOf(&v, own, rs, ra)
}

// parsePacked decodes a reply packed in one string into v (see parse),
// and returns the deciding rule's own reset after, or -1.
func (e *engine) parsePacked(r string, v *[5]int64, rs *ruleSet, rc *reserveCall, ra *ruleAnswers) (int64, error) {
	k := len(rs.rules)
	extra := 8 * k
	if k > 1 {
		extra += 8
	}
	if len(r) != packedReply && len(r) != packedReply+extra {
		return 0, errorf("%s: script replied %d bytes, want %d or %d", e.kind, len(r), packedReply, packedReply+extra)
	}
	if r[0] >= clockBehind {
		e.behind()
	}
	if rc != nil && r[0]&^clockBehind == byte(reasonAllowed) {
		return 0, errorf("%s: script replied an admitted reservation without its tags", e.kind)
	}
	*v = [5]int64{int64(r[0] &^ clockBehind), le64(r[1:]), le64(r[9:]), le64(r[17:]), int64(r[25])}
	own := int64(-1)
	if len(r) > packedReply {
		at := packedReply
		if k > 1 {
			own = le64(r[at:])
			at += 8
		}
		if ra != nil {
			ra.has = true
			for i := range k {
				ra.left[i] = le64(r[at+8*i:])
			}
		}
	}
	return own, nil
}

// parseArray decodes a reply of an array of integers into v, rc's tags and
// ra (see parse), and returns the deciding rule's own reset after, or -1.
func (e *engine) parseArray(r []any, v *[5]int64, rs *ruleSet, rc *reserveCall, ra *ruleAnswers) (int64, error) {
	k := len(rs.rules)
	if len(r) > 0 {
		if c, ok := r[0].(int64); ok && c >= clockBehind {
			e.behind()
			r[0] = c - clockBehind
		}
	}
	base, ownAt := 5, -1
	switch {
	case len(r) == 0:
	case r[0] == int64(reasonBlock):
		base++ // the block's time left (see noteBlock)
	case k > 1 && len(r) > base:
		ownAt = base
		base++
	}
	if len(r) > 0 && rc != nil && r[0] == int64(reasonAllowed) {
		base += k
	}
	if len(r) != base && len(r) != base+k {
		return 0, errorf("%s: script replied %d values, want %d or %d", e.kind, len(r), base, base+k)
	}
	var left []int64 // in ra, when the reply carries them
	if len(r) > base && ra != nil {
		ra.has = true
		left = ra.left[:k]
	}
	own := int64(-1)
	for i, x := range r {
		n, ok := x.(int64)
		if !ok {
			return 0, errorf("%s: script reply %d is %T, want an integer", e.kind, i, x)
		}
		switch {
		case i < 5:
			v[i] = n
		case v[0] == int64(reasonBlock):
			// i is 5: the block's time left, which noteBlock read
		case i == ownAt:
			own = n
		case i < base:
			rc.tags = append(rc.tags, n)
		case left != nil:
			left[i-base] = n
		}
	}
	return own, nil
}

// resultOf makes the Result of a decoded reply v (see parse).
func resultOf(v *[5]int64, own int64, rs *ruleSet, ra *ruleAnswers) (Result, reason, error) {
	why := reason(v[0])
	idx := int(v[4]) - 1
	if idx < 0 || idx >= len(rs.rules) {
		idx = 0 // a block: no rule decided
	}
	if ra != nil && (why == reasonBlock || v[4] == 0) {
		// A block's answer (a call it denied, which may name the rule
		// whose own retry is longer, or a look during one, which names
		// none) tells no rule's allowance: its Remaining is 0 for the
		// block.
		ra.none = true
	}
	wait := micros(v[2])
	res := Result{
		Allowed:        why == reasonAllowed,
		ByPriority:     why == reasonPriority,
		Limit:          rs.rules[idx].limit,
		Rule:           rs.rules[idx].name,
		Remaining:      int(max(v[1], 0)),
		ResetAfter:     micros(v[3]),
		RuleResetAfter: micros(v[3]),
	}
	if own >= 0 && why != reasonBlock && v[4] != 0 {
		// A block's answer has none: the block decides, till ResetAfter.
		res.RuleResetAfter = micros(own)
	}
	if res.Allowed {
		res.Delay = wait
	} else {
		res.RetryAfter = wait
	}
	return res, why, nil
}
