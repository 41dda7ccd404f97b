// Package calldelay lets the middleware of this module bound the Delay
// that one call of a limiter may be given (a leaky bucket's wait in its
// queue): the middleware puts the longest wait it will make in the call's
// context, and the limiter refuses, taking nothing, a slot that would wait
// longer, as WaitN does for its context's deadline. Without it, the
// limiter takes the slot and the middleware, which will not wait that
// long, denies a request whose slot then stays taken. Only packages under
// github.com/redlimit/redlimit can import it; it is no part of the API.
package calldelay

import (
	"context"
	"time"
)

// key is the context key of the bound.
type key struct{}

// With returns a context derived from ctx that bounds the Delay of a call
// made with it to d (0: no Delay at all).
func With(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, key{}, max(d, 0))
}

// From returns the bound that ctx carries, and false if it carries none.
func From(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(key{}).(time.Duration)
	return d, ok
}
