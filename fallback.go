package redlimit

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/redlimit/redlimit/internal/subring"
	"github.com/redlimit/redlimit/internal/warmcurve"
)

// localSet is the in-process stand-in of one key while Redis is down: one
// golang.org/x/time/rate limiter per rule, decided all or nothing under mu.
type localSet struct {
	mu   sync.Mutex
	sig  uint64 // the limits the stand-ins were made for
	lims []localRule
	// blockEnd is when a penalty block (WithBlock) that Redis answered for
	// the key ends, as time since monoBase: until then every call is
	// denied. 0: none known.
	blockEnd time.Duration
	// recalled is when the stand-ins last looked for Redis's answers about
	// the key (see recall), as monoNow; 0: never.
	recalled int64
}

// monoBase is the origin of localSet.blockEnd: a reading with the
// monotonic clock, so that blocks are timed by it.
var monoBase = time.Now()

type localRule struct {
	state    string // the rule's state in Redis (rule.suffix: strategy and Period)
	lim      *rate.Limiter
	every    float64 // events per second
	burst    int     // capacity of lim (1 for a queue)
	capacity int     // a queue's capacity in events; else burst
	queue    bool
	perCall  bool             // counts a call as one event (Rule.PerCall)
	warm     *warmcurve.Curve // a limit with a WarmUp: the stand-in follows its curve (lim is unused)
	sub      *subring.Ring    // a sub-window counter: the stand-in counts its sub-windows (lim is unused)
	// taken is the events the stand-in admitted since it started (from
	// Redis's answer, or full): what a late answer cannot count (see
	// rescue.lower).
	taken int
}

// ahead is how long an event would wait in a queue's stand-in at now:
// one reservation, cancelled at once.
func (lr *localRule) ahead(now time.Time) time.Duration {
	rv := lr.lim.ReserveN(now, 1)
	defer rv.CancelAt(now)
	return rv.DelayFrom(now)
}

// count is the events the stand-in counts for a call of n.
func (lr *localRule) count(n int) int {
	if lr.perCall {
		return min(n, 1)
	}
	return n
}

// block records that Redis denied state's key under a penalty block
// (WithBlock) that ends within d, so that its stand-in denies it as long,
// should the key's node go down meanwhile. Only a denial calls it: an
// admitted call pays nothing for it.
func (r *rescue) block(state string, rs *ruleSet, d time.Duration) {
	if r.e.cfg.fallback != FallbackLocal || d <= 0 {
		return
	}
	end := time.Since(monoBase) + d
	set := r.locals.GetOrAdd(state, func() *localSet { return r.newLocal(rs) })
	set.mu.Lock()
	set.blockEnd = max(set.blockEnd, end)
	set.mu.Unlock()
}

// forget drops the in-process stand-in of the key whose first state key
// is state.
func (r *rescue) forget(state string) {
	r.locals.Remove(state)
	if r.answers != nil {
		r.answers.Forget(state)
	}
}

// stage decides a call with the fallback while its node is marked down,
// and when Redis fails to answer it; the others go on to Redis.
func (r *rescue) stage(q *request, next decider) error {
	if r.isDown(q.state) {
		return r.decide(q, nil)
	}
	err := next(q)
	if err == nil {
		return nil
	}
	e := r.e
	if ctxErr := callerDone(q.ctx); ctxErr != nil {
		return errorf("%s %q: %w", e.kind, q.key, ctxErr)
	}
	if !r.outage(err, q.state) {
		return errorf("%s %q: %w", e.kind, q.key, err)
	}
	return r.decide(q, err)
}

// decide answers q without Redis, by the fallback policy. cause is the
// error of the call, or nil for a call not sent because its node is down;
// q.rc, when not nil, takes an admitted call as an in-process reservation.
func (r *rescue) decide(q *request, cause error) error {
	var err error
	q.res, q.why, err = r.decideState(q.state, q.n, q.maxDelay, q.rs, q.rc, cause, q.share)
	return err
}

// decideState is decide for n events of the key whose first state key is
// state, under rs; share is the call's priority share (see callShare).
func (r *rescue) decideState(state string, n int, maxDelay time.Duration, rs *ruleSet, rc *reserveCall, cause error, share int64) (Result, reason, error) {
	e := r.e
	first := &rs.rules[0]
	if r.gone.Load() {
		// The program closed the client while the node was down.
		return Result{}, 0, errorf("%s %q: %w", e.kind, state, redis.ErrClosed)
	}
	switch e.cfg.fallback {
	case FallbackAllow:
		return Result{Allowed: true, Limit: first.limit, Rule: first.name, Remaining: rs.maxN, Degraded: true}, reasonAllowed, nil
	case FallbackDeny:
		wait := e.cfg.pingInterval
		return Result{Limit: first.limit, Rule: first.name, RetryAfter: wait, ResetAfter: wait, RuleResetAfter: wait, Degraded: true}, reasonLimit, nil
	case FallbackError:
		if cause == nil {
			cause = r.downCause(state)
		}
		if cause == nil {
			return Result{}, 0, errorf("%s %q: %w", e.kind, state, ErrUnavailable)
		}
		return Result{}, 0, errorf("%s %q: %w: %w", e.kind, state, ErrUnavailable, cause)
	}
	set := r.locals.GetOrAdd(state, func() *localSet { return r.newLocal(rs) })
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.sig != rs.sig {
		// WithLimitFunc gave this key other limits: follow the latest.
		had := len(set.lims)
		r.follow(set, rs, time.Now())
		if len(set.lims) != had {
			r.locals.Reweigh(state) // set.mu, then the shard's lock: never the other way
		}
	}
	r.recall(set, state, rs, time.Now())
	return r.decideLocked(set, n, maxDelay, rs, rc, share)
}

// standIns is what a key's stand-ins weigh in the fallback's bound
// (WithFallbackKeys): one per rule. It runs with the LRU's shard locked,
// on a set not yet shared or under set.mu.
func standIns(set *localSet) int { return len(set.lims) }

// standIn returns set's stand-in of state, or nil. set.mu is held.
func (set *localSet) standIn(state string) *localRule {
	for i := range set.lims {
		if set.lims[i].state == state {
			return &set.lims[i]
		}
	}
	return nil
}

// follow gives set the stand-ins of rs, each carrying over what was used
// in set's stand-in of the same state (strategy and Period), as Redis
// shares that state between limits that differ in Rate or Burst: a key
// whose limits alternate no longer starts full on every switch (2 and 3 a
// minute in turn admitted 100 of 100 calls). set.mu is held.
func (r *rescue) follow(set *localSet, rs *ruleSet, now time.Time) {
	fresh := r.newLocal(rs).lims
	for i := range fresh {
		nl := &fresh[i]
		ol := set.standIn(nl.state)
		if ol == nil {
			continue
		}
		if ol.sub != nil && nl.sub != nil { // the same state: the same sub-windows
			nl.sub = ol.sub
			continue
		}
		if ol.warm != nil && nl.warm != nil { // the same state: a warm-up's
			// As warmup.lua's warm_read: the stored permits scaled by
			// the new rate over the old (Guava's setRate), so that the
			// key is as cold as it was, up to the new most.
			nl.warm.Follow(ol.warm, now)
			continue
		}
		var used float64 // events in use: taken from a bucket, or queued
		if ol.queue {
			used = ol.ahead(now).Seconds() * ol.every
		} else {
			used = float64(ol.burst) - ol.lim.TokensAt(now)
		}
		nl.lim = rate.NewLimiter(rate.Limit(nl.every), nl.burst)
		if k := int(math.Ceil(used - 1e-9)); k > 0 {
			reserveAt(nl.lim, now, k)
		}
	}
	set.sig, set.lims = rs.sig, fresh
}

// verdict is one stand-in's answer, before the set commits or cancels it.
type verdict struct {
	ok                   bool
	why                  reason
	avail                int
	wait                 time.Duration // delay when ok, else retry after
	resetNow, resetAfter time.Duration
	rv                   []*rate.Reservation // a queue's reservations
}

// decideLocked decides a call of n on the key's stand-ins, all or nothing,
// as the script decides on Redis; set is locked.
func (r *rescue) decideLocked(set *localSet, n int, maxDelay time.Duration, rs *ruleSet, rc *reserveCall, share int64) (Result, reason, error) {
	now := time.Now()
	left := blockLeftLocked(set, now)
	var verdicts [MaxRules]verdict
	denied, why := false, reasonAllowed
	for i := range set.lims {
		v := r.check(&set.lims[i], now, set.lims[i].count(n), maxDelay, share)
		verdicts[i] = v
		if !v.ok {
			denied = true
			if v.why == reasonLimit || why == reasonAllowed || why == reasonMaxDelay && v.why == reasonPriority {
				why = v.why
			}
		}
	}
	if left > 0 {
		cancelAll(set, &verdicts, now)
		res, why := blockedLocked(set, &verdicts, n, denied, rs, left)
		return res, why, nil
	}
	res, longest := combine(set, &verdicts, n, denied, rs)
	if denied && n > 0 {
		cancelAll(set, &verdicts, now)
		res.RetryAfter = longest
		res.Delay = 0
		res.ByPriority = why == reasonPriority
		return res, why, nil
	}
	if n == 0 {
		res.Delay = 0
		res.Allowed = true
		cancelAll(set, &verdicts, now)
		return res, reasonAllowed, nil
	}
	takeLocked(set, &verdicts, n, rc, now)
	res.Allowed = true
	return res, reasonAllowed, nil
}

// takeLocked takes n events, which every stand-in of set admitted (their
// verdicts), and, for a reservation (rc not nil), holds what it needs to
// give them back. set.mu is held.
func takeLocked(set *localSet, verdicts *[MaxRules]verdict, n int, rc *reserveCall, now time.Time) {
	if rc != nil {
		hold := &localHold{set: set, states: make([]string, len(set.lims)), paidAt: make([]time.Time, len(set.lims)), tags: make([]int64, len(set.lims))}
		for i := range set.lims {
			hold.states[i] = set.lims[i].state
			hold.paidAt[i] = now.Add(verdicts[i].resetNow) // full again, but for this call
		}
		rc.local = hold
	}
	for i := range set.lims {
		lr := &set.lims[i]
		lr.taken += lr.count(n)
		switch {
		case lr.warm != nil:
			lr.warm.Take(lr.count(n), now)
			if rc != nil {
				rc.local.paidAt[i] = lr.warm.Next() // the reservation's time ends
			}
		case lr.sub != nil:
			tag := lr.sub.Take(lr.count(n), now)
			if rc != nil {
				rc.local.tags[i] = tag
			}
		case !lr.queue:
			lr.lim.AllowN(now, lr.count(n)) // checked above, under the set's lock
		}
	}
}

// blockLeftLocked returns how long the key's penalty block lasts from now;
// 0 when none does (it clears one that ended). set is locked.
func blockLeftLocked(set *localSet, now time.Time) time.Duration {
	if set.blockEnd == 0 {
		return 0
	}
	left := set.blockEnd - now.Sub(monoBase)
	if left <= 0 {
		set.blockEnd = 0
		return 0
	}
	return left
}

// blockedLocked answers a call of n on a key whose penalty block lasts
// left more, as Redis answers it (scripts/reply.lua): denied (n = 0
// reports), Remaining 0, RetryAfter the block's time left or, if later,
// when the stand-ins would admit n (their verdicts; the longest wait then
// decides, else the first rule), ResetAfter the later of the block's end
// and the stand-ins' reset. The verdicts took nothing (cancelAll); set is
// locked.
func blockedLocked(set *localSet, verdicts *[MaxRules]verdict, n int, denied bool, rs *ruleSet, left time.Duration) (Result, reason) {
	res, longest := combine(set, verdicts, n, true, rs)
	res.Remaining, res.Delay = 0, 0
	res.ResetAfter = max(res.ResetAfter, left)
	res.RuleResetAfter = max(res.RuleResetAfter, left)
	if n == 0 || !denied || longest <= left {
		first := &rs.rules[0]
		res.Limit, res.Rule = first.limit, first.name
		res.RuleResetAfter = res.ResetAfter // the block decides
		longest = left
	}
	if n == 0 {
		res.Allowed = true
		return res, reasonAllowed
	}
	res.RetryAfter = longest
	return res, reasonBlock
}

// combine makes the stand-ins' verdicts on a call of n one Result, as the
// script combines its rules': Remaining the least over the rules, the
// deciding rule (the longest wait of those that deny; else the fewest
// left), ResetAfter and Delay the longest, RuleResetAfter the deciding
// rule's. longest is the deciding denial's wait.
func combine(set *localSet, verdicts *[MaxRules]verdict, n int, denied bool, rs *ruleSet) (res Result, longest time.Duration) {
	res.Degraded = true
	deciding, fewest := 0, math.MaxInt
	longest = -1
	for i := range set.lims {
		v := &verdicts[i]
		avail := v.avail
		if !denied && n > 0 {
			avail -= set.lims[i].count(n)
		}
		if set.lims[i].perCall && rs.counting && avail >= 1 {
			avail = math.MaxInt // limits the call's n only with no call left
		}
		res.Remaining = min(res.Remaining, avail)
		if i == 0 {
			res.Remaining = avail
		}
		switch {
		case denied && !v.ok:
			if v.wait > longest {
				deciding, longest = i, v.wait
			}
			res.ResetAfter = max(res.ResetAfter, v.resetNow)
		case denied:
			res.ResetAfter = max(res.ResetAfter, v.resetNow)
		default:
			if avail < fewest {
				deciding, fewest = i, avail
			}
			res.ResetAfter = max(res.ResetAfter, v.resetAfter)
			res.Delay = max(res.Delay, v.wait)
		}
	}
	res.Remaining = max(res.Remaining, 0)
	res.Limit, res.Rule = rs.rules[deciding].limit, rs.rules[deciding].name
	res.RuleResetAfter = verdicts[deciding].resetAfter
	if denied {
		res.RuleResetAfter = verdicts[deciding].resetNow
	}
	return res, longest
}

// cancelAll gives back the queues' reservations of the verdicts, latest
// first, for a call that takes nothing.
func cancelAll(set *localSet, verdicts *[MaxRules]verdict, now time.Time) {
	for i := range set.lims {
		for j := len(verdicts[i].rv) - 1; j >= 0; j-- {
			verdicts[i].rv[j].CancelAt(now)
		}
	}
}

// check asks one stand-in whether n events fit, without taking them (a
// queue takes its reservations; the set cancels them on a denial). With a
// priority share (see callShare), the events must fit in the share of the
// stand-in's capacity, as in Redis: the part of it the share leaves out
// is kept (a denial that only this makes is reasonPriority). A warming
// bucket's stand-in (checkWarm) follows its curve and ignores shares.
func (r *rescue) check(lr *localRule, now time.Time, n int, maxDelay time.Duration, share int64) verdict {
	if lr.warm != nil {
		return checkWarm(lr, now, n, maxDelay)
	}
	kept := 0
	if share != 0 {
		kept = lr.capacity - int(shareOf(int64(lr.capacity), share))
	}
	if lr.sub != nil {
		return checkSub(lr, now, n, kept, r.e.cfg.pingInterval)
	}
	if lr.queue {
		return r.checkQueue(lr, now, n, maxDelay, kept)
	}
	full := lr.lim.TokensAt(now)
	tokens := full - float64(kept)
	v := verdict{ok: float64(n) <= tokens, avail: int(max(tokens, 0))}
	v.resetNow = seconds((float64(lr.burst) - tokens) / lr.every)
	v.resetAfter = seconds((float64(lr.burst) - tokens + float64(n)) / lr.every)
	switch {
	case v.ok:
	case n > lr.burst-kept:
		// This instance's share of the limit can never admit n at once.
		v.why, v.wait = reasonLimit, r.e.cfg.pingInterval
	default:
		v.why, v.wait = reasonLimit, seconds((float64(n)-tokens)/lr.every)
	}
	if !v.ok && kept > 0 && float64(n) <= full {
		v.why = reasonPriority
	}
	return v
}

// checkQueue is the leaky bucket's stand-in: lim has burst 1, so
// consecutive reservations are spaced by T, and at most the queue's
// capacity may wait.
func (r *rescue) checkQueue(lr *localRule, now time.Time, n int, maxDelay time.Duration, kept int) verdict {
	interval := seconds(1 / lr.every)
	capacity := lr.capacity - kept // the call's share of the queue
	if n == 0 {
		d := lr.ahead(now)
		return verdict{ok: true, avail: max(capacity-int(d/interval), 0), resetNow: d, resetAfter: d}
	}
	// The first event, then the others in one reservation: the same as n
	// reservations of one, in constant time and memory whatever n.
	rvs := []*rate.Reservation{lr.lim.ReserveN(now, 1)}
	if n > 1 {
		rvs = append(rvs, reserveAt(lr.lim, now, n-1))
	}
	delay, lastDelay := rvs[0].DelayFrom(now), rvs[len(rvs)-1].DelayFrom(now)
	v := verdict{ok: true, rv: rvs, wait: delay, resetNow: delay}
	v.avail = max(capacity-int(delay/interval), 0)
	over := lastDelay - time.Duration(capacity-1)*interval
	switch {
	case over > 0 || n > capacity:
		v.ok, v.why, v.wait = false, reasonLimit, max(over, interval)
		if kept > 0 && n <= lr.capacity && lastDelay <= time.Duration(lr.capacity-1)*interval {
			v.why = reasonPriority
		}
	case maxDelay >= 0 && delay > maxDelay:
		v.ok, v.why, v.wait = false, reasonMaxDelay, delay-maxDelay
	}
	if v.ok {
		v.avail = capacity - int(lastDelay/interval) - 1 + n // the caller takes n off
		v.resetAfter = lastDelay + interval
	}
	return v
}

// checkWarm is the stand-in of a limit with a WarmUp, as
// scripts/warmup.lua decides it: a token bucket admits when the next free
// time has come, a leaky bucket when its wait and n stable intervals fit
// in its capacity's. It takes nothing (decideLocked takes the events).
func checkWarm(lr *localRule, now time.Time, n int, maxDelay time.Duration) verdict {
	c := lr.warm
	wait := c.Wait(now)
	v := verdict{ok: true, resetNow: c.UntilCold(now)}
	if lr.queue {
		interval := c.Stable()
		room := time.Duration(lr.capacity)*interval - wait
		v.wait, v.avail = wait, max(int(room/interval), 0)
		over := time.Duration(n)*interval - room
		switch {
		case n > 0 && over > 0:
			v.ok, v.why, v.wait = false, reasonLimit, over
		case n > 0 && maxDelay >= 0 && wait > maxDelay:
			v.ok, v.why, v.wait = false, reasonMaxDelay, wait-maxDelay
		}
	} else {
		v.avail = lr.capacity
		switch {
		case wait > 0 && n > 0:
			v.ok, v.why, v.wait, v.avail = false, reasonLimit, wait, 0
		case wait > 0:
			v.avail = 0
		case n > 0:
			v.avail = n // the next call waits for what this one costs
		}
	}
	if v.ok && n > 0 {
		after := *c
		after.Take(n, now)
		v.resetAfter = after.UntilCold(now)
	}
	return v
}

// reserveAt takes n events from lim at now in one reservation, with the
// state and the last event's time that n reservations of one would leave
// (a debt where the tokens are not there), also where n passes lim's
// burst: the burst is raised for it at now, after lim has been brought to
// now at its own burst, so that no token accrues past it.
func reserveAt(lim *rate.Limiter, now time.Time, n int) *rate.Reservation {
	b := lim.Burst()
	if n <= b {
		return lim.ReserveN(now, n)
	}
	lim.SetBurstAt(now, b) // refill up to now, capped at b
	lim.SetBurstAt(now, n)
	rv := lim.ReserveN(now, n)
	lim.SetBurstAt(now, b)
	return rv
}

// newLocal makes the in-process stand-ins for one key.
//
// The stand-ins: FixedWindow, SlidingLog and SlidingCounter become a token
// bucket of Rate/Period per second with burst Rate (a calendar quota's
// Period is its nominal one, see calendar.go); TokenBucket keeps
// Rate/Period and Burst; LeakyBucket keeps its queue; SubWindowCounter
// keeps its sub-windows (subring.Ring), never more than its capacity in any
// Period. Rates and capacities are scaled by the fallback share. A capacity that the share makes
// fractional, c = capacity × share, is kept on average: the bucket holds
// ceil(c) but starts one token short with probability ceil(c) - c. So 20
// instances sharing PerHour(5) with a share of 1/20 (c = 0.25) admit about
// 5 at once between them, not 20.
func (r *rescue) newLocal(rs *ruleSet) *localSet {
	share := r.e.cfg.share
	set := &localSet{sig: rs.sig, lims: make([]localRule, len(rs.rules))}
	now := time.Now()
	for i := range rs.rules {
		ru := &rs.rules[i]
		lr := localRule{
			state:   ru.suffix,
			every:   float64(ru.limit.Rate) / ru.limit.Period.Seconds() * share,
			queue:   ru.alg.queue,
			burst:   1,
			perCall: ru.perCall,
		}
		c := float64(ru.capacity()) * share
		lr.capacity = max(int(math.Ceil(c)), 1)
		if !lr.queue {
			lr.burst = lr.capacity
		}
		lr.lim = rate.NewLimiter(rate.Limit(lr.every), lr.burst)
		if ru.alg.strategy == SubWindowCounter {
			// Its sub-windows, at the share's capacity: a fraction kept on
			// average, as one event more with its probability.
			lr.sub = subring.New(ru.limit.Period, ru.limit.SubWindows)
			lr.capacity = int(c)
			if rand.Float64() < c-float64(lr.capacity) {
				lr.capacity++
			}
			set.lims[i] = lr
			continue
		}
		if ru.alg.warm {
			// The curve at the share's rate, cold: a fractional capacity
			// needs no correction (a warming bucket starts slowly anyway).
			lr.warm = warmcurve.New(lr.every, ru.limit.WarmUp, now)
			set.lims[i] = lr
			continue
		}
		// A fractional capacity is kept on average: the stand-in starts
		// one event short with the probability of the fraction left out
		// (a queue too: with 1 slot for a capacity of 0.25 each, 20
		// instances at 1/20 of 5 took 20 at once).
		if rand.Float64() < float64(lr.capacity)-c {
			if lr.queue {
				lr.lim.ReserveN(now, 1) // a slot taken: the next waits its interval
			} else {
				lr.lim.AllowN(now, 1)
			}
		}
		set.lims[i] = lr
	}
	return set
}

func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}
