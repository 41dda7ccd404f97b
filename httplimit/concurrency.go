package httplimit

import (
	"context"
	"net/http"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/holdhint"
)

// DefaultRetryAfterHint is the Retry-After that [ConcurrencyMiddleware]
// gives before it has seen a request end, unless [WithRetryAfterHint]
// sets another.
const DefaultRetryAfterHint = time.Second

// WithRetryAfterHint sets the Retry-After that [ConcurrencyMiddleware]
// gives a denied request before any request it let through has ended
// (after that, from the average time requests held their lease); see
// ConcurrencyMiddleware. The default is [DefaultRetryAfterHint], 1s. It
// changes nothing in [Middleware].
func WithRetryAfterHint(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryHint = d })
}

// ConcurrencyMiddleware returns a middleware that holds a lease of c for
// each request while the next handler runs: at most c's max requests per
// key at once, across every instance. The lease is taken with TryAcquire
// (no wait) on the key of the key function, and released when the handler
// returns, also when it panics (the panic goes on once the lease is
// released) or the request's context was cancelled. The handler finds the
// lease with [LeaseFromContext], to Extend it when its work may outlast the
// lease ttl.
//
// A request with no free slot is answered as denied (429 by default, see
// [WithDeniedHandler]) with a Retry-After that tells when a slot is likely
// free: the average time the requests it let through held their lease (a
// moving average over the last few dozen) divided by the key's max, since
// max holders at random points of their holds free the first slot after
// about that long; before any request has ended, the [WithRetryAfterHint]
// default, 1s. It is written in whole seconds rounded up, at least 1, and
// never more than the time until the oldest lease expires. It is not the
// lease ttl, which only bounds a crashed holder's slot: a cap of 3 with a
// 10s ttl and requests of 300ms answers Retry-After: 1, not 10. The denied handler finds the Result with [ResultFromContext].
// No RateLimit fields are written: a concurrency limit has no window; on
// a denial, those that an outer [Middleware] wrote for the request (its
// RateLimit, RateLimit-Policy and X-RateLimit-* fields) are removed, since
// they describe a limit that admitted it.
//
// The options that apply are WithKeyFunc, WithDeniedHandler,
// WithKeyErrorHandler, WithErrorHandler (TryAcquire's errors: 503 by
// default) and WithRetryAfterHint; the others change nothing. A lease
// answered by c's fallback while Redis is down (Result.Degraded) is served
// like any other. It is safe for concurrent use. It panics if c is nil or
// an option is invalid.
func ConcurrencyMiddleware(c *redlimit.Concurrency, opts ...Option) func(http.Handler) http.Handler {
	if c == nil {
		panic("httplimit: nil Concurrency")
	}
	cfg := newConfig(opts)
	hint := holdhint.New(cfg.retryHint)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, ok := cfg.requestKey(w, r)
			if !ok {
				return
			}
			ctx := r.Context()
			lease, res, err := c.TryAcquire(ctx, key)
			if err != nil {
				cfg.err(w, r, err)
				return
			}
			ctx = context.WithValue(ctx, resultKey{}, res)
			if lease == nil {
				// An outer Middleware's fields describe a limit that
				// admitted the request, not this denial.
				clearFields(w.Header())
				retry := hint.RetryAfter(res.RetryAfter, res.Limit.Rate)
				cfg.deny(w, r.WithContext(ctx), retry)
				return
			}
			start := time.Now()
			defer func() {
				hint.Observe(time.Since(start))
				// Release works on a cancelled context, bounded by 1s.
				_ = lease.Release(r.Context())
			}()
			next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, leaseKey{}, lease)))
		})
	}
}

type leaseKey struct{}

// LeaseFromContext returns the lease that [ConcurrencyMiddleware] holds
// for the request whose context is ctx, and whether there is one. The
// middleware releases it when the handler returns; the handler may Extend
// it.
func LeaseFromContext(ctx context.Context) (*redlimit.Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*redlimit.Lease)
	return l, ok
}
