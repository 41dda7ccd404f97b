package redlimit

import (
	"context"
	"sync"
	"time"
)

// A decision passes through stages, in the order that buildPipeline writes
// once, when the limiter is built, with only the stages its options enable:
//
//  1. observe: the observer's Decision, with the call's latency (observe.go)
//  2. regions: a decision made while a peer region is silent (regions.go)
//  3. shadow: a denial reported, then admitted (observe.go)
//  4. share: a call that its priority share can never admit (priority.go)
//  5. deny cache: a denial remembered in-process (denycache.go)
//  6. prefetch: events taken from Redis ahead, served in-process (prefetch.go)
//  7. fallback: the in-process stand-ins while Redis is down (fallback.go)
//  8. block: the fallback keeps a penalty block that a call set (fallback.go)
//  9. eviction watch: Redis evicting keys (evict.go)
//
// and last the runner of the call's rule set asks Redis (runner.go). Every
// reply, whichever runner made it, goes through answered (engine.go): the
// one place where an answer is parsed and remembered for the fallback.

// request is one decision's data, from the caller's call through every
// stage to Redis, and its answer. Requests are pooled: a stage must not
// keep one after it returns.
type request struct {
	ctx      context.Context
	key      string        // the caller's key
	state    string        // the state key of the first rule (engine.stateKey)
	n        int           // events asked for
	maxDelay time.Duration // the longest Delay the caller can wait; -1: any
	rs       *ruleSet
	rc       *reserveCall // a reservation's id in, and its tags out; nil: none
	share    int64        // the priority share, parts per million; 0: all
	prio     Priority
	// prefetching: the call may be served by prefetched events, and is
	// asked by the prefetcher (it takes a prefetch, or asks alone).
	prefetching bool
	now         any // the time the call sends (WithClientClock), else argZero (engine.eval)

	// The answer.
	res      Result
	why      reason
	answered bool // Redis (or a prefetch it took) answered: not the deny cache nor the fallback
	shadowed bool // a denial that shadow mode admitted

	args evalArgs // the script call's keys and arguments (see engine.eval)
}

var requestPool = sync.Pool{New: func() any {
	return &request{args: evalArgs{keys: make([]string, 0, 4), args: make([]any, 0, 12)}}
}}

// newRequest returns a pooled request for n events on key under rs.
func newRequest(ctx context.Context, key, state string, n int, maxDelay time.Duration, rs *ruleSet, rc *reserveCall) *request {
	r := requestPool.Get().(*request)
	r.ctx, r.key, r.state, r.n, r.maxDelay, r.rs, r.rc = ctx, key, state, n, maxDelay, rs, rc
	return r
}

// free returns r to the pool.
func (r *request) free() {
	a := r.args
	clear(a.keys)
	clear(a.args)
	*r = request{args: evalArgs{keys: a.keys[:0], args: a.args[:0]}}
	requestPool.Put(r)
}

// decider decides a request: it sets r.res and r.why, or returns an error.
type decider func(r *request) error

// stage is one step of a decision that may answer it itself, or pass it on
// to next and act on the answer.
type stage func(r *request, next decider) error

// buildPipeline returns the limiter's decision: its enabled stages, in
// their order, then the runner.
func (e *engine) buildPipeline() decider {
	var stages []stage
	if e.cfg.observer != nil {
		stages = append(stages, e.observeStage)
	}
	if e.regions != nil {
		stages = append(stages, e.regionStage)
	}
	if e.cfg.shadow {
		stages = append(stages, shadowStage)
	}
	if e.cfg.priority.on {
		stages = append(stages, e.shareStage)
	}
	if e.denies != nil {
		stages = append(stages, e.denyStage)
	}
	if e.prefetcher != nil {
		stages = append(stages, e.prefetcher.stage)
	}
	stages = append(stages, e.rescue.stage)
	if e.cfg.block > 0 {
		stages = append(stages, e.blockStage)
	}
	if e.evict != nil {
		stages = append(stages, e.evictStage)
	}
	last := decider(e.ask)
	for i := len(stages) - 1; i >= 0; i-- {
		s, next := stages[i], last
		last = func(r *request) error { return s(r, next) }
	}
	return last
}

// call makes one decision on n events for key under rs (rc: as a
// reservation), through the limiter's pipeline.
func (e *engine) call(ctx context.Context, key string, n int, maxDelay time.Duration, rs *ruleSet, rc *reserveCall) (Result, reason, error) {
	r := newRequest(ctx, key, e.stateKey(key, &rs.rules[0]), n, maxDelay, rs, rc)
	defer r.free()
	r.share, r.prio = e.callShare(ctx)
	err := e.decide(r)
	why := r.why
	if r.shadowed {
		why = reasonAllowed
	}
	return r.res, why, err
}

// ask asks Redis for r's decision: through the prefetcher when r may take
// a prefetch, else with one call of r's runner.
func (e *engine) ask(r *request) error {
	var err error
	if r.prefetching {
		err = e.prefetcher.ask(r)
	} else {
		err = e.eval(r)
	}
	r.answered = err == nil
	return err
}

// denyStage answers a call that the deny cache holds a denial for, and
// remembers Redis's denials.
func (e *engine) denyStage(r *request, next decider) error {
	// A denial answers only calls of the same share: one remembered for a
	// Sheddable call must not deny a Critical one.
	sig := r.rs.sig
	if r.share != 0 {
		sig ^= uint64(r.share) * 0x9e3779b97f4a7c15
	}
	if r.n > 0 {
		if res, ok := lookupDenial(e.denies, r.state, r.n, sig); ok {
			r.res, r.why = res, reasonDenyCache
			return nil
		}
	}
	epoch := e.denies.Epoch()
	if err := next(r); err != nil {
		return err
	}
	if r.answered && !r.res.Allowed && r.why != reasonMaxDelay {
		// Until RetryAfter this n is denied, by the limit or the block:
		// a blocked call's RetryAfter is its own n's too.
		e.denies.Remember(r.state, r.n, sig, r.res, r.res.RetryAfter, epoch)
	}
	return nil
}

// blockStage gives the fallback the penalty block that a call set, should
// the node go down meanwhile (a call the block denies brings its time
// left: see noteBlock; a prefetch's denial sets none).
func (e *engine) blockStage(r *request, next decider) error {
	if err := next(r); err != nil {
		return err
	}
	if r.why == reasonLimit && !r.prefetching {
		e.rescue.block(r.state, r.rs, e.cfg.block)
	}
	return nil
}

// evictStage pokes the eviction watch after each call that Redis or a
// prefetch answered.
func (e *engine) evictStage(r *request, next decider) error {
	err := next(r)
	if err == nil {
		e.evict.Poke()
	}
	return err
}
