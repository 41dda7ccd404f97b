package redlimit

import (
	"context"
	"strconv"
	"time"
)

// DeniedBy says what denied a call (or, in shadow mode, would have).
type DeniedBy int

// The reasons for a denial.
const (
	NotDenied         DeniedBy = iota // allowed
	DeniedByLimit                     // the strategy's limit (in Redis, or the fallback's)
	DeniedByBlock                     // a penalty block (WithBlock)
	DeniedByDenyCache                 // this process's deny cache (WithDenyCache), without a round trip
	DeniedByDeadline                  // WaitN: the wait would pass the context's deadline
	DeniedByPriority                  // the call's priority share (WithPriorityShares), where the limit alone would have admitted it
)

// String returns "", "limit", "block", "deny-cache", "deadline" or
// "priority".
func (d DeniedBy) String() string {
	switch d {
	case NotDenied:
		return ""
	case DeniedByLimit:
		return "limit"
	case DeniedByBlock:
		return "block"
	case DeniedByDenyCache:
		return "deny-cache"
	case DeniedByDeadline:
		return "deadline"
	case DeniedByPriority:
		return "priority"
	}
	return "DeniedBy(" + strconv.Itoa(int(d)) + ")"
}

// Decision describes one call, for the hook set by [WithObserver].
type Decision struct {
	// Context is the caller's context, for the parent of a tracing span
	// (extra/redlimitotel); the hook must not keep it past its return.
	Context  context.Context
	Strategy Strategy // the deciding rule's strategy
	Rule     string   // Policy: the deciding rule's name
	Key      string
	N        int
	Allowed  bool          // what the caller was told
	DeniedBy DeniedBy      // why the limit denied, or would have in shadow mode
	Degraded bool          // decided without Redis
	Shadowed bool          // shadow mode allowed what the limit denied
	Stale    bool          // WithRegions: decided while a peer region was silent past the staleness bound (Result.Stale)
	Latency  time.Duration // time spent deciding
	Err      error         // the error returned to the caller, if any (wrapping ErrExceedsLimit: n can never fit, the caller's error)
	Priority Priority      // the priority the call was decided at (ContextWithPriority); Normal without WithPriorityShares
}

func deniedBy(why reason) DeniedBy {
	switch why {
	case reasonLimit:
		return DeniedByLimit
	case reasonBlock:
		return DeniedByBlock
	case reasonDenyCache:
		return DeniedByDenyCache
	case reasonMaxDelay:
		return DeniedByDeadline
	case reasonPriority:
		return DeniedByPriority
	}
	return NotDenied
}

// observeExceeds tells the observer of a call that fails with err, which
// wraps ErrExceedsLimit: n is more than a rule of rs can ever hold. No
// decision is made, but the call is the caller's error and is counted
// (see [WithObserver]); the rule named is the first of the smallest
// capacity among those that count events (a per-call rule counts one).
func (e *engine) observeExceeds(ctx context.Context, key string, n int, rs *ruleSet, err error) {
	var r *rule
	for i := range rs.rules {
		if c := &rs.rules[i]; !c.perCall && (r == nil || c.capacity() < r.capacity()) {
			r = c
		}
	}
	if r == nil { // only per-call rules: n passed MaxRate
		r = &rs.rules[0]
	}
	_, prio := e.callShare(ctx)
	e.cfg.observer(Decision{Context: ctx, Strategy: r.alg.strategy, Rule: r.name, Key: key, N: n, Err: err, Priority: prio})
}

// observeStage tells the observer of each decision, with its latency.
func (e *engine) observeStage(r *request, next decider) error {
	start := time.Now()
	err := next(r)
	rs := r.rs
	st := rs.rules[0].alg.strategy
	for i := range rs.rules {
		if rs.rules[i].name == r.res.Rule {
			st = rs.rules[i].alg.strategy
		}
	}
	e.cfg.observer(Decision{
		Context:  r.ctx,
		Strategy: st,
		Rule:     r.res.Rule,
		Key:      r.key,
		N:        r.n,
		Allowed:  r.res.Allowed,
		DeniedBy: deniedBy(r.why),
		Degraded: r.res.Degraded,
		Shadowed: r.shadowed,
		Stale:    r.res.Stale,
		Latency:  time.Since(start),
		Err:      err,
		Priority: r.prio,
	})
	return err
}

// shadowStage admits what the limit denied, marked Shadowed (WithShadow);
// the deny reason stays for the observer. A call that its deadline
// denies is still denied: it could not wait.
func shadowStage(r *request, next decider) error {
	if err := next(r); err != nil {
		return err
	}
	if !r.res.Allowed && r.why != reasonMaxDelay {
		r.shadowed = true
		r.res.Allowed, r.res.Shadowed, r.res.RetryAfter = true, true, 0
	}
	return nil
}
