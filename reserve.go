package redlimit

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/requeue"
)

// Reservation is n events taken by Reserve, to be settled once with what
// was really used: an LLM request's maximum tokens, settled with the
// tokens it used; an upload's declared size, settled with the bytes sent.
// Until it is settled it stands as taken; nothing is refunded by itself.
//
// A Reservation is safe for concurrent use; it settles once.
type Reservation struct {
	e     *engine
	rs    *ruleSet
	key   string
	state string // the first rule's state key
	id    string
	n     int
	res   Result
	tags  []int64    // each rule's tag, from the script's reply
	local *localHold // taken in-process, by the fallback
	until time.Time  // when its lifetime in Redis ends (WithReservationTTL)

	mu   sync.Mutex
	done bool
}

// reserveCall carries a reservation through a decision: its id in, and
// out what settling needs.
type reserveCall struct {
	id    string
	tags  []int64
	local *localHold
}

// localHold is the in-process fallback's stand-ins that took a
// reservation.
type localHold struct {
	set *localSet
	// states are the states (localRule.state) of the stand-ins the
	// reservation took from: other limits for the key, from WithLimitFunc
	// or WithRulesFunc, replace the set's stand-ins, carrying over what
	// was used in each state (see rescue.follow), and settling goes to the
	// set's stand-in of each state now, if there is one.
	states []string
	// paidAt is, per stand-in, when its refill would have paid back what
	// was used before the reservation: from then on it pays back the
	// reservation's events (see settleLocal); for a warm-up's stand-in,
	// when the time the reservation's events cost ends.
	paidAt []time.Time
	// tags are, per stand-in of a sub-window counter, the sub-window the
	// reservation's events count in, where a refund goes back.
	tags []int64
}

// Reserve is AllowN that can be settled later with what was really used
// (see [Reservation]); for a [Policy], every rule takes n events, and
// settling adjusts every rule. n must be at least 1. A denied reservation
// (Result().Allowed false) holds nothing.
func (e *engine) Reserve(ctx context.Context, key string, n int) (*Reservation, error) {
	if n < 1 && !e.closed.Load() {
		return nil, errorf("reserve n = %d: a reservation takes at least 1 event: %w", n, ErrInvalidArgument)
	}
	rs, err := e.rulesChecked(ctx, key, n)
	if err != nil {
		return nil, err
	}
	// 64 random bits, at most 13 characters: the member of each rule's
	// sorted set of pending reservations, which must only differ from the
	// others pending on the key (two of 100,000 pending collide with a
	// probability of 3e-10; the second then stands as taken). 13 bytes keep
	// a member's string in jemalloc's 16-byte class once the set is a
	// skiplist; two numbers, 26 bytes, took 32.
	rc := &reserveCall{id: strconv.FormatUint(rand.Uint64(), 36)}
	res, _, err := e.call(ctx, key, n, -1, rs, rc)
	if err != nil {
		return nil, err
	}
	return &Reservation{
		e: e, rs: rs, key: key, state: e.stateKey(key, &rs.rules[0]),
		id: rc.id, n: n, res: res, tags: rc.tags, local: rc.local,
		until: time.Now().Add(e.cfg.reserveTTL),
	}, nil
}

// Result returns the decision made when the reservation was taken.
// A nil Reservation's is the zero Result.
func (r *Reservation) Result() Result {
	if r == nil {
		return Result{}
	}
	return r.res
}

// Settle records that used events really happened: used < n refunds the
// difference, used > n charges the difference even past the limit (the key
// owes it; later calls are denied until it is paid back: by a bucket's
// refill, by a fixed window's end, by a sliding counter's window as its
// weight falls, by a sliding log's entries leaving it). A sliding log is
// charged only what it can take in one call, an entry per event: at most
// Rate (more would leave the log together) and at most MaxSlidingLogN
// between a Policy's logs (MaxSlidingLogN/k each, for k logs); the rest of
// the overspend is not charged to it (the other rules are charged it all).
// used is bounded only where the state needs it: above MaxRate, or a
// bucket's debt that its refill would take more than MaxPeriod to pay
// back, it is an error wrapping ErrExceedsLimit. The reservation then
// stays unsettled, so that it can be settled again with a smaller used. A
// reservation settles once: a
// second Settle returns ErrSettled and changes nothing, also when the
// first one's reply was lost and the caller retries. Settling a denied
// reservation, a nil one, or with a nil Context is an error wrapping
// ErrInvalidArgument.
//
// A refund never gives back more than was taken, never lifts a key above
// its full allowance, and never re-credits refill or a window that has
// passed: FixedWindow and SlidingCounter refund only while the
// reservation's window counts, SlidingLog removes the reservation's own
// entries still in the log, the buckets return only the reservation's
// tokens that the refill cannot have paid back yet (counted from when
// what was used before the reservation would have been paid back). Reset
// forgets the pending reservations on the states it resets, whichever
// limiter took them: a rule whose state was reset since gets nothing back,
// and a reservation forgotten for every rule returns ErrSettled.
//
// A warm-up's refund (Limit.WarmUp) undoes the take of the unused events:
// their stored permits and their cost come back, the cost as time only
// while the reservation's own time lasts, the rest as stored permits (which
// slow later calls): Cancel at once leaves the key as it was.
//
// The Result is the key's state after settling, as AllowN(ctx, key, 0)
// reports it for a Critical call, which no share limits, whatever the
// reservation's priority: with [WithPriorityShares], its Remaining
// includes the headroom kept for higher priorities (a Normal call, the
// default, sees less). It is under the key's limits now: with
// [WithLimitFunc] or [WithRulesFunc], Settle calls the function, settles
// the rules the reservation took from and reports those it returns (or,
// if it fails, the reservation's); and during a penalty block
// ([WithBlock]) it has nothing left until the block ends. A reservation taken in shadow mode that the limit
// denied holds nothing: Settle returns its Result and touches nothing.
//
// Outages: a reservation taken by the in-process fallback (Result().Degraded)
// settles in-process (one that FallbackAllow admitted took nothing: Settle
// returns its Result, as in shadow mode). One taken on Redis cannot be
// settled while Redis is unavailable: the settle is queued and made again
// in the background once Redis is back (at every ping interval, within
// the reservation lifetime), and Settle returns an error wrapping
// ErrUnavailable that says so; the reservation counts as settled (a second
// Settle returns ErrSettled), and Redis applies the settle once, also when
// the first try's reply was lost. So does a settle whose ctx ends during
// the call (the error wraps ctx's error). At most 10,000 settles per
// limiter wait: past that, the error says the settle was not queued, and
// the reservation stays unsettled, for the caller to settle again. Close
// tries each queued settle once more (within 1s in all, also while its
// node is still marked down), and those it cannot make stand as taken
// until the reservation lifetime ends (its error counts them).
func (r *Reservation) Settle(ctx context.Context, used int) (Result, error) {
	if err := r.checkSettle(ctx, used); err != nil {
		return Result{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return Result{}, errorf("settle %q: %w", r.key, ErrSettled)
	}
	if r.e.closed.Load() {
		return Result{}, ErrClosed
	}
	switch {
	case r.res.Shadowed, r.res.Degraded && r.local == nil:
		// Shadow mode, or FallbackAllow while Redis was down: nothing
		// was taken, so nothing is settled.
		r.done = true
		return r.res, nil
	case r.local != nil:
		r.done = true
		return r.settleLocal(used), nil
	}
	if r.e.rescue.isDown(r.state) {
		err := errorf("settle %q: %w", r.key, ErrUnavailable)
		if cause := r.e.rescue.downCause(r.state); cause != nil {
			err = errorf("settle %q: %w: %w", r.key, ErrUnavailable, cause)
		}
		return Result{}, r.queueSettle(used, err)
	}
	res, err := r.settleRedis(ctx, used, r.rulesNow(ctx))
	switch {
	case err == nil:
		r.done = true
		return res, nil
	case errors.Is(err, ErrSettled):
		r.done = true
	case callerDone(ctx) != nil:
		// The command or its reply was lost, or is late: made again, so
		// that the caller's deadline does not leave it unsettled.
		if r.e.settles.Add(r.requeued(used), true) {
			r.done = true
			return Result{}, errorf("%w (made again in the background)", err)
		}
	case errors.Is(err, ErrUnavailable):
		return Result{}, r.queueSettle(used, err)
	}
	return Result{}, err
}

// checkSettle returns the error of a Settle with ctx and used that no
// state of r lets through: r was not returned by Reserve, ctx is done, used
// is out of bounds (checkUsed), or r was denied. r.mu is not held.
func (r *Reservation) checkSettle(ctx context.Context, used int) error {
	if r == nil || r.e == nil {
		return errorf("settle a reservation that Reserve did not return: %w", ErrInvalidArgument)
	}
	if err := checkContext(ctx); err != nil {
		return errorf("settle %q: %w", r.key, err)
	}
	if err := checkUsed(used, r.rs); err != nil {
		return errorf("settle %q: %w", r.key, err)
	}
	if !r.res.Allowed {
		return errorf("settle %q: a denied reservation holds nothing: %w", r.key, ErrInvalidArgument)
	}
	return nil
}

// maxPendingSettles bounds the settles a limiter keeps to make again;
// past it, Settle queues nothing and the reservation stays unsettled.
var maxPendingSettles = 10_000

// queueSettle queues the settle of r with used while Redis is unavailable,
// marking r settled, and returns Settle's error: err (which wraps
// ErrUnavailable), saying whether it was queued. r.mu is held.
func (r *Reservation) queueSettle(used int, err error) error {
	if !r.e.settles.Add(r.requeued(used), false) {
		if r.e.closed.Load() {
			return ErrClosed
		}
		return errorf("%w (not queued: %d settles wait already; settle it again once Redis is back)", err, maxPendingSettles)
	}
	r.done = true
	return errorf("%w (queued: made again once Redis is back)", err)
}

// requeued is the settle of r with used, for the engine's queue: made
// again until Redis answers it (ErrSettled included: it was made already,
// or the reservation expired or was reset).
func (r *Reservation) requeued(used int) requeue.Call {
	return requeue.Call{Key: r.state, Until: r.until, Do: func(ctx context.Context) bool {
		_, err := r.settleRedis(ctx, used, nil)
		switch {
		case err == nil, errors.Is(err, ErrSettled):
			return false
		case callerDone(ctx) != nil:
			return true
		}
		return errors.Is(err, ErrUnavailable)
	}}
}

// checkUsed rejects a settle's used that the rules' state cannot hold: used
// past capacity is charged (the key owes it), bounded only where the
// state needs it. At most MaxRate, as a Rate: a window's count is kept
// as count×10 and its window's digit, which the scripts' doubles hold
// exactly below 2^53. A bucket's debt must be paid back by the refill
// within MaxPeriod (used×Period/Rate, as Burst's refill is bounded in
// New): the key lives until then. A sliding log needs no bound here: the
// settle script charges it what it takes (see settleLogEntries).
func checkUsed(used int, rs *ruleSet) error {
	if used < 0 {
		return errorf("used = %d is negative: %w", used, ErrInvalidArgument)
	}
	if used > MaxRate {
		return errorf("used = %d, more than MaxRate (%d): %w", used, MaxRate, ErrExceedsLimit)
	}
	for i := range rs.rules {
		r := &rs.rules[i]
		switch {
		case r.perCall:
			// Keeps or gives back its one event, whatever used.
		case r.alg.bucket:
			if payback := float64(used) * float64(r.limit.Period) / float64(r.limit.Rate); payback > float64(MaxPeriod) {
				return errorf("used = %d: %v %v would take %v to pay it back, more than MaxPeriod: %w",
					used, r.alg.strategy, r.limit, time.Duration(min(payback, math.MaxInt64)), ErrExceedsLimit)
			}
		}
	}
	return nil
}

// settleLogEntries returns the most entries a settle adds to each sliding
// log of rs that counts n (scripts/settle.lua: min(used-n, Rate, this)):
// an entry per event charged, MaxSlidingLogN between them, as AllowN
// writes at most, so that a settle holds Redis no longer than a call (a
// charge of 100,000 entries took 142 ms).
func settleLogEntries(rs *ruleSet) int {
	return MaxSlidingLogN / max(rs.logs, 1)
}

// Cancel is Settle(ctx, 0): it gives back every event the reservation took,
// within the same limits.
func (r *Reservation) Cancel(ctx context.Context) error {
	_, err := r.Settle(ctx, 0)
	return err
}

// settleScript settles a reservation of any strategy (see
// scripts/settle.lua).
var settleScript = redis.NewScript(decisionHead(calendarFiles) +
	readScripts("args.lua") + strategyTable(calendarFiles) + readScripts("rules.lua", "adjust.lua", "settle.lua"))

// rulesNow returns the rules that decide r's key now (WithLimitFunc,
// WithRulesFunc), which Settle's Result reports under, as AllowN(ctx,
// key, 0) would; nil when they are the reservation's, or when the
// function that gives them fails (the settle is made all the same,
// reported under the reservation's rules).
func (r *Reservation) rulesNow(ctx context.Context) *ruleSet {
	if r.e.cfg.limitFunc == nil && r.e.cfg.rulesFunc == nil {
		return nil
	}
	rs, err := r.e.rulesFor(ctx, r.key)
	if err != nil || sameRules(rs, r.rs) {
		return nil
	}
	return rs
}

// sameRules reports whether a and b are the same rules, in the same order.
func sameRules(a, b *ruleSet) bool {
	return a == b || slices.Equal(a.rules, b.rules)
}

// settleRedis settles r with used in Redis, and returns the key's state
// after it as a look (n = 0) reports it: under the rules now, or r's own
// when now is nil, and its penalty block (see scripts/settle.lua).
func (r *Reservation) settleRedis(ctx context.Context, used int, now *ruleSet) (Result, error) {
	e, rs := r.e, r.rs
	report := rs
	if now != nil {
		report = now
	}
	keys := r.settleKeys(now, report)
	at := argZero
	if e.clock != nil {
		us, err := e.clock.NowMicros(ctx)
		if err != nil {
			return Result{}, r.settleErr(ctx, err)
		}
		at = us
	}
	args := make([]any, 0, 10+5*len(rs.rules)+4*len(report.rules))
	args = append(args, 0, len(rs.rules), at, argNoMaxDelay, settleLogEntries(rs), r.id, used)
	trailer := r.settleTrailer(now)
	var out any
	var err error
	if rs.calendar || now != nil && now.calendar {
		// A calendar rule's window goes in its arguments, before the tags:
		// they follow as a trailer (see settleTrailer), then the rules now.
		out, _, err = e.runCalendar(ctx, settleScript, keys, args, len(args), rs, at, trailer, now)
	} else {
		for i := range rs.rules {
			args = append(args, rs.rules[i].args[:]...)
		}
		args = append(args, trailer...)
		if now != nil {
			for i := range now.rules {
				args = append(args, now.rules[i].args[:]...)
			}
		}
		out, err = settleScript.Run(ctx, e.rdb, keys, args...).Result()
	}
	if err != nil {
		return Result{}, r.settleErr(ctx, err)
	}
	return r.settleReply(out, report)
}

// settleKeys returns the settle script's keys: the state of r's rules, its
// reservation keys, the state of the rules now (when not nil), then, with
// a penalty block, the block of the rules report.
func (r *Reservation) settleKeys(now, report *ruleSet) []string {
	rs := r.rs
	keys := make([]string, 0, 2*len(rs.rules)+len(report.rules)+1)
	for i := range rs.rules {
		keys = append(keys, ruleKey(r.state, rs, i))
	}
	keys = appendReserveKeys(keys, r.state, rs)
	first := r.state
	if now != nil {
		first = r.e.stateKey(r.key, &now.rules[0])
		for i := range now.rules {
			keys = append(keys, ruleKey(first, now, i))
		}
	}
	if r.e.cfg.block > 0 {
		keys = append(keys, blockKeyOf(first, report))
	}
	return keys
}

// settleReply returns the key's state under the rules report that the
// settle script's reply out holds, or ErrSettled when the script found r
// settled already.
func (r *Reservation) settleReply(out any, report *ruleSet) (Result, error) {
	reply, ok := out.([]any)
	if !ok {
		return Result{}, errorf("settle %q: script replied %T, want an array", r.key, out)
	}
	if len(reply) == 1 {
		return Result{}, errorf("settle %q: %w", r.key, ErrSettled)
	}
	res, _, err := r.e.parse(reply, report, nil, nil)
	if err != nil {
		return Result{}, err
	}
	res.Allowed = true
	return res, nil
}

// settleTrailer returns the settle script's arguments after the rules':
// the events reserved and each rule's tag; the number of the rules the
// reply reports when they are now's (see settleRedis), else 0; and the
// reservation lifetime (ms), from which the script knows when the
// reservation was made. Now's arguments follow.
func (r *Reservation) settleTrailer(now *ruleSet) []any {
	k := len(r.rs.rules)
	t := make([]any, 0, 3+k)
	t = append(t, r.n)
	for i := range k {
		var tag int64 // 0, as the script records a missing one
		if i < len(r.tags) {
			tag = r.tags[i]
		}
		t = append(t, tag)
	}
	m := 0
	if now != nil {
		m = len(now.rules)
	}
	return append(t, m, r.e.cfg.argReserveTTL)
}

// settleErr wraps a failed settle's error: the caller's context, an outage
// (ErrUnavailable, and Redis marked down), or what Redis said.
func (r *Reservation) settleErr(ctx context.Context, err error) error {
	if ctxErr := callerDone(ctx); ctxErr != nil {
		return errorf("settle %q: %w", r.key, ctxErr)
	}
	if r.e.rescue.outage(err, r.state) {
		return errorf("settle %q: %w: %w", r.key, ErrUnavailable, err)
	}
	return errorf("settle %q: %w", r.key, err)
}

// settleLocal settles a reservation the fallback took. Each stand-in gets
// the unused events back as tokens (x/time/rate takes a negative n as a
// refund; what passes the burst is dropped at its next update, so never
// above full), but only those its refill cannot have paid back yet (after
// paidAt, it pays back the reservation's events: refill is never given
// twice), a warm-up's as settle.lua gives them back (warmcurve.Curve.GiveBack);
// or takes the overspend as a debt (a reservation that need not wait).
func (r *Reservation) settleLocal(used int) Result {
	h := r.local
	h.set.mu.Lock()
	defer h.set.mu.Unlock()
	now := time.Now()
	for i, state := range h.states {
		lr := h.set.standIn(state)
		if lr == nil {
			continue // the key's limits have no such rule any more
		}
		delta := lr.count(used) - lr.count(r.n)
		if g := lr.sub; g != nil {
			// As settle.lua does: a refund back to the sub-window the
			// events were taken from, while it counts; a charge now.
			if delta < 0 {
				g.GiveBack(h.tags[i], -delta, now)
			} else if delta > 0 {
				g.Take(delta, now)
			}
			continue
		}
		if c := lr.warm; c != nil {
			// As settle.lua does: a refund undoes the take of the unused
			// events (its time only until its own ends, at paidAt); a
			// charge pays forward.
			if delta < 0 {
				c.GiveBack(float64(-delta), h.paidAt[i], now)
			} else if delta > 0 {
				c.Take(delta, now)
			}
			continue
		}
		if delta < 0 {
			// Give back at most what the refill cannot have paid back yet,
			// as settle.lua does for a bucket: never refill twice.
			held := float64(lr.count(r.n)) - max(now.Sub(h.paidAt[i]).Seconds(), 0)*lr.every
			if back := int(min(float64(-delta), held)); back > 0 {
				lr.lim.AllowN(now, -back)
			}
		}
		if delta > 0 {
			reserveAt(lr.lim, now, delta) // a debt when the tokens are not there
		}
	}
	return r.localResult(now)
}

// localResult returns the state of the stand-ins of r (taken in-process)
// at now, after its settle. r.local.set.mu is held.
func (r *Reservation) localResult(now time.Time) Result {
	h := r.local
	res := Result{Allowed: true, Degraded: true, Limit: r.res.Limit, Rule: r.res.Rule}
	for i := range h.set.lims {
		lr := &h.set.lims[i]
		if lr.sub != nil {
			v := checkSub(lr, now, 0, 0, 0)
			if i == 0 || v.avail < res.Remaining {
				res.Remaining = v.avail
			}
			res.ResetAfter = max(res.ResetAfter, v.resetNow)
			continue
		}
		if c := lr.warm; c != nil {
			if c.Wait(now) == 0 && (i == 0 || lr.capacity < res.Remaining) {
				res.Remaining = lr.capacity
			} else if c.Wait(now) > 0 {
				res.Remaining = 0
			}
			res.ResetAfter = max(res.ResetAfter, c.UntilCold(now))
			continue
		}
		tokens := lr.lim.TokensAt(now)
		if i == 0 || int(tokens) < res.Remaining {
			res.Remaining = max(int(tokens), 0)
		}
		res.ResetAfter = max(res.ResetAfter, seconds((float64(lr.burst)-tokens)/lr.every))
	}
	res.RuleResetAfter = res.ResetAfter // the fallback's stand-ins tell no rule's apart here
	return res
}
