package httplimit

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// SettleTimeout bounds the Settle that [WithCost] makes when the handler
// returns. It runs on a context detached from the request's, so that a
// request whose client went away is settled too.
const SettleTimeout = time.Second

// costConfig holds WithCost's and WithOnSettleError's options.
type costConfig struct {
	f       func(*http.Request) int
	onError func(*http.Request, error)
}

// WithCost makes the middleware reserve f(r) events for each request
// before the handler runs, rather than take one: the request's estimated
// cost, such as an LLM call's maximum tokens or an upload's declared size.
// The handler tells what it really used with [Report]; when it returns
// (also when it panics, or the request's context was cancelled), the
// reservation is settled with the reported cost, or with f(r) when the
// handler reported none (see [redlimit.Reservation.Settle]). A denied
// request holds nothing and is not settled; its 429 carries the fields of
// the rule that denied it (a Policy's tokens rule, say), as for Allow.
//
// A reported cost past the reserved one is charged as Settle charges it: a
// sliding log takes only what it can in one call, at most its Rate and
// [redlimit.MaxSlidingLogN] entries (shared by a Policy's logs); the
// other rules take it all.
//
// The limiter must have a Reserve method, as a [redlimit.RateLimiter] and
// a [redlimit.Policy] do: Middleware panics otherwise. A cost below 1 is
// an error of the limiter (ErrInvalidArgument), answered by the error
// handler (503 by default); a cost above what a rule can ever hold at once
// (ErrExceedsLimit) is the client's, answered 413 by default (see
// [WithErrorHandler]). Settle's errors (Redis down: the reservation
// then stands as taken) go to [WithOnSettleError]. By default each request
// takes one event, with Allow.
func WithCost(f func(r *http.Request) int) Option {
	return optionFunc(func(c *config) { c.cost.f = f })
}

// WithOnSettleError sets a function called with the error of a settle
// that [WithCost] made, after the response; use it to log or count them.
// It must be safe for concurrent use. The default drops them.
func WithOnSettleError(f func(r *http.Request, err error)) Option {
	return optionFunc(func(c *config) { c.cost.onError = f })
}

// reserver returns l as a Reserver when WithCost is set, else nil. It
// panics when l cannot reserve.
func (c *costConfig) reserver(l redlimit.Limiter) ratelimitfields.Reserver {
	if c.f == nil {
		return nil
	}
	rl, ok := l.(ratelimitfields.Reserver)
	if !ok {
		panic("httplimit: WithCost needs a limiter with Reserve, such as a redlimit.RateLimiter or redlimit.Policy")
	}
	return rl
}

// costState is the cost a handler reported with Report.
type costState struct {
	mu       sync.Mutex
	used     int
	reported bool
}

type costKey struct{}

// withCost returns r with a new costState in its context, and the state.
func withCost(r *http.Request) (*http.Request, *costState) {
	c := new(costState)
	return r.WithContext(context.WithValue(r.Context(), costKey{}, c)), c
}

// Report tells the middleware, configured [WithCost], what the request
// really used (tokens, bytes): when the handler returns, the reservation
// is settled with used rather than the estimate. The last report counts,
// so a streaming handler can report its running total; a negative used
// counts as 0. Report does nothing for a request that no middleware with
// WithCost let through. It is safe for concurrent use.
func Report(r *http.Request, used int) {
	if c, ok := r.Context().Value(costKey{}).(*costState); ok {
		c.mu.Lock()
		c.used, c.reported = max(used, 0), true
		c.mu.Unlock()
	}
}

// settleReported settles resv with what the handler reported, or with
// the reserved cost n when it reported nothing.
func (c *costConfig) settleReported(r *http.Request, resv *redlimit.Reservation, n int, st *costState) {
	st.mu.Lock()
	used, reported := st.used, st.reported
	st.mu.Unlock()
	if !reported {
		used = n
	}
	c.settle(r, resv, used)
}

// settle settles resv, if any and allowed, with used events, on a context
// detached from the request's.
func (c *costConfig) settle(r *http.Request, resv *redlimit.Reservation, used int) {
	if resv == nil || !resv.Result().Allowed {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), SettleTimeout)
	defer cancel()
	if _, err := resv.Settle(ctx, used); err != nil && c.onError != nil {
		c.onError(r, err)
	}
}
