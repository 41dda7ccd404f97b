// Package calldelay lets the middleware of this module bound the Delay
// that one call of a limiter may be given (a leaky bucket's wait in its
// queue): the middleware puts the longest wait it will make, or the
// deadline the wait must end by, in the call's context, and the limiter
// refuses, taking nothing, a slot that would wait longer, as WaitN does
// for its context's deadline. Without it, the limiter takes the slot and
// the middleware, which will not wait that long, denies a request whose
// slot then stays taken. Only packages under github.com/redlimit/redlimit
// can import it; it is no part of the API.
package calldelay

import (
	"context"
	"time"
)

// key is the context key of the bound.
type key struct{}

// bound is a Bound's value: a longest Delay, or a deadline.
type bound struct {
	d        time.Duration
	deadline time.Time
}

// With returns a context derived from ctx that bounds the Delay of a call
// made with it to d (0: no Delay at all), whatever the round trip.
func With(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, key{}, bound{d: max(d, 0)})
}

// Until returns a context derived from ctx in which a call's Delay, waited
// from its reply, must end by t: the limiter keeps a margin for the round
// trip.
func Until(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, key{}, bound{deadline: t})
}

// From returns the bound that ctx carries: the longest Delay, or the
// deadline it must end by (d is then 0); ok is false if it carries none.
func From(ctx context.Context) (d time.Duration, deadline time.Time, ok bool) {
	b, ok := ctx.Value(key{}).(bound)
	return b.d, b.deadline, ok
}
