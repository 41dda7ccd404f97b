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
)

// String returns "", "limit", "block", "deny-cache" or "deadline".
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
	}
	return "DeniedBy(" + strconv.Itoa(int(d)) + ")"
}

// Decision describes one call, for the hook set by [WithObserver].
type Decision struct {
	Strategy Strategy // the deciding rule's strategy
	Rule     string   // Policy: the deciding rule's name
	Key      string
	N        int
	Allowed  bool          // what the caller was told
	DeniedBy DeniedBy      // why the limit denied, or would have in shadow mode
	Degraded bool          // decided without Redis
	Shadowed bool          // shadow mode allowed what the limit denied
	Latency  time.Duration // time spent deciding
	Err      error         // the error returned to the caller, if any
}

// WithObserver sets a function called after every decision, from the
// calling goroutine: use it to export metrics (see examples/prometheus). It
// must be quick and safe for concurrent use. The default is none.
func WithObserver(f func(Decision)) Option {
	return optionFunc(func(c *config) { c.observer = f })
}

// WithShadow turns on shadow mode, for rolling out a new limit safely: the
// limiter decides and records everything as usual (in Redis, blocks
// included), but allows what the limit or a block denied: such a result
// has Allowed true and Shadowed true, and the observer sees the would-be
// denial. A leaky bucket still shapes: an allowed call keeps its Delay
// (which WaitN and the middleware wait), and a call whose wait would pass
// the caller's deadline or the middleware's max delay is still refused
// (DeniedByDeadline: it could not have waited anyway). To dry-run a leaky
// bucket, do not wait Result.Delay.
func WithShadow() Option {
	return optionFunc(func(c *config) { c.shadow = true })
}

// WithBlock sets a penalty: once a key is denied by the limit, every call
// for it is denied for d, with RetryAfter the time left, or the time until
// the limit would allow the denied call again if that is longer (so that a
// client that waits RetryAfter is not denied again by the limit). The
// block lives in Redis, in the same cluster slot as the key's state, set
// by the same script that denies; Reset lifts it. The default is 0, no
// block.
func WithBlock(d time.Duration) Option {
	return optionFunc(func(c *config) { c.block = d })
}

// WithDenyCache keeps, in this process, up to maxKeys keys (at least 16:
// one in each of its shards) that Redis denied, each until the RetryAfter
// Redis gave, for calls asking the same number of events: calls for them are denied
// without a round trip (DeniedByDenyCache), with Redis's denial counted
// down (its deciding rule, Limit and Remaining; RetryAfter and ResetAfter
// less the time since). Since no call can succeed for a
// denied key before RetryAfter (unless Reset), this never allows what Redis
// would deny; it denies for at most about one round trip longer. Reset
// clears this process's entry, but not other processes': after a Reset,
// they deny until their entry expires. 0 turns it off, which is the
// default.
func WithDenyCache(maxKeys int) Option {
	return optionFunc(func(c *config) { c.denyCache = maxKeys })
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
	}
	return NotDenied
}

// call makes one decision and applies shadow mode and the observer.
func (e *engine) call(ctx context.Context, key string, n int, maxDelay time.Duration, rs *ruleSet, rc *reserveCall) (Result, reason, error) {
	var start time.Time
	if e.cfg.observer != nil {
		start = time.Now()
	}
	res, why, err := e.decide(ctx, key, n, maxDelay, rs, rc)
	shadowed := err == nil && e.cfg.shadow && !res.Allowed && why != reasonMaxDelay
	if shadowed {
		res.Allowed, res.Shadowed, res.RetryAfter = true, true, 0
	}
	if f := e.cfg.observer; f != nil {
		st := rs.rules[0].alg.strategy
		for i := range rs.rules {
			if rs.rules[i].name == res.Rule {
				st = rs.rules[i].alg.strategy
			}
		}
		f(Decision{
			Strategy: st,
			Rule:     res.Rule,
			Key:      key,
			N:        n,
			Allowed:  res.Allowed,
			DeniedBy: deniedBy(why),
			Degraded: res.Degraded,
			Shadowed: shadowed,
			Latency:  time.Since(start),
			Err:      err,
		})
	}
	if shadowed {
		why = reasonAllowed
	}
	return res, why, err
}
