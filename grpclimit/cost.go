package grpclimit

import (
	"context"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
	"google.golang.org/grpc"
)

// SettleTimeout bounds the Settle that [WithCost] makes when the handler
// returns. It runs on a context detached from the call's, so that a call
// that was cancelled is settled too.
const SettleTimeout = time.Second

// WithCost makes the interceptors reserve f(ctx, fullMethod) events for
// each call before the handler runs, rather than take one: the call's
// estimated cost, such as an LLM call's maximum tokens (from request
// metadata: a stream's messages are not read yet). The handler tells what
// it really used with [Report] on its context (a stream's Context()); when
// it returns (also when it panics, or the call was cancelled), the
// reservation is settled with the reported cost, or with the reserved one
// when the handler reported none (see [redlimit.Reservation.Settle]). A
// denied call holds nothing; its metadata describe the rule that denied it
// (a Policy's tokens rule, say), as for Allow.
//
// A reported cost past the reserved one is charged as Settle charges it: a
// sliding log takes only what it can in one call, at most its Rate and
// [redlimit.MaxSlidingLogN] entries (shared by a Policy's logs); the
// other rules take it all.
//
// The limiter must have a Reserve method, as a [redlimit.RateLimiter] and
// a [redlimit.Policy] do: the interceptor constructors panic otherwise. A
// cost below 1 is an error of the limiter (codes.Unavailable, see
// [WithOnError]); a cost above what a rule can ever hold at once is the
// client's (codes.InvalidArgument, see the package documentation). Settle's errors (Redis down: the reservation then stands
// as taken) go to the WithOnError function. By default each call takes one
// event, with Allow.
func WithCost(f func(ctx context.Context, fullMethod string) int) Option {
	return optionFunc(func(c *config) { c.cost = f })
}

// reserverOf returns l as a Reserver when cost is set, else nil. It panics
// when l cannot reserve.
func reserverOf(l redlimit.Limiter, cost func(context.Context, string) int) ratelimitfields.Reserver {
	if cost == nil {
		return nil
	}
	rl, ok := l.(ratelimitfields.Reserver)
	if !ok {
		panic("grpclimit: WithCost needs a limiter with Reserve, such as a redlimit.RateLimiter or redlimit.Policy")
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

func withCost(ctx context.Context) (context.Context, *costState) {
	st := new(costState)
	return context.WithValue(ctx, costKey{}, st), st
}

// Report tells the interceptor, configured [WithCost], what the call whose
// context is ctx really used (tokens, bytes): when the handler returns,
// the reservation is settled with used rather than the estimate. The last
// report counts, so a streaming handler can report its running total; a
// negative used counts as 0. Report does nothing for a call that no
// interceptor with WithCost let through. It is safe for concurrent use.
func Report(ctx context.Context, used int) {
	if st, ok := ctx.Value(costKey{}).(*costState); ok {
		st.mu.Lock()
		st.used, st.reported = max(used, 0), true
		st.mu.Unlock()
	}
}

// reservation is the events WithCost reserved for a call: n of them.
type reservation struct {
	*redlimit.Reservation
	n int
}

// settle settles resv with what the handler reported, or with the
// reserved cost when it reported nothing.
func (in *interceptor) settle(ctx context.Context, fullMethod string, resv *reservation, st *costState) {
	st.mu.Lock()
	used, reported := st.used, st.reported
	st.mu.Unlock()
	if !reported {
		used = resv.n
	}
	in.settleUsed(ctx, fullMethod, resv, used)
}

// settleUsed settles resv, if any and allowed, with used events, on a
// context detached from ctx.
func (in *interceptor) settleUsed(ctx context.Context, fullMethod string, resv *reservation, used int) {
	if resv == nil || !resv.Result().Allowed {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
	defer cancel()
	if _, err := resv.Settle(sctx, used); err != nil {
		in.report(ctx, fullMethod, err)
	}
}

// ctxStream is a grpc.ServerStream whose Context is ctx: the one that
// carries the stream's costState.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
